"""wire.submit.submit_over_nats on its own (a NATS client that records what it is sent)."""

from __future__ import annotations

import json
from typing import Any

from wire.messages import MAX_SUBMIT_JOBS
from wire.submit import submit_over_nats


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []

    async def publish(self, subject: str, data: bytes, headers: dict[str, str], timeout: float) -> None:
        self.sent.append((subject, json.loads(data), headers["Nats-Msg-Id"]))


async def test_each_dict_given_is_a_job_of_its_own_and_is_not_changed() -> None:
    """A review: with the ids written into the dicts given, one dict given three times (a
    list made as [job] * 3), or a template sent in a loop, made a single job."""
    js = _Recorder()
    job = {"name": "t", "command": ["true"]}
    ids = await submit_over_nats(js, [job] * 3, user="alice")
    again = await submit_over_nats(js, [job], user="alice")
    assert len(set(ids + again)) == 4 and job == {"name": "t", "command": ["true"]}
    assert [j["id"] for j in js.sent[0][1]["jobs"]] == ids
    own = await submit_over_nats(js, [dict(job, id="my-own-id-1")], user="alice", queue="research")
    assert own == ["my-own-id-1"] and js.sent[-1][0] == "muster.submit.alice.research"


async def test_each_call_is_a_message_of_its_own_and_its_tries_share_its_id() -> None:
    """Found by exploring: with the message id a digest of the user, queue and jobs, a job
    refused and sent again unchanged within the stream's 2-minute duplicate window (its
    queue made meanwhile) was acknowledged as a duplicate and dropped without a word. Each
    call's messages now have ids of their own; a try again within the call (NATS not
    taking it) keeps the id, so that a try stored although its answer was lost makes the
    next a duplicate."""
    from nats.js.errors import ServiceUnavailableError

    js = _Recorder()
    job = {"id": "same-id-01", "name": "t", "command": ["true"]}
    for _ in range(2):
        await submit_over_nats(js, [job], user="alice")
    await submit_over_nats(js, [dict(job, id=f"many-{i:04d}") for i in range(MAX_SUBMIT_JOBS + 1)], user="alice")
    ids = [m for _, _, m in js.sent]
    assert len(ids) == 4 and len(set(ids)) == 4

    class _Electing(_Recorder):
        async def publish(self, subject: str, data: bytes, headers: dict[str, str], timeout: float) -> None:
            await super().publish(subject, data, headers, timeout)
            if len(self.sent) == 1:  # the first try's answer lost
                raise ServiceUnavailableError()

    js = _Electing()
    await submit_over_nats(js, [job], user="alice", every_s=0)
    assert len(js.sent) == 2 and js.sent[0][2] == js.sent[1][2]
