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


async def test_a_list_is_split_by_bytes_as_well_as_by_count() -> None:
    """Found by exploring: split by count alone, 500 jobs of a few KiB each made one message
    past NATS's max_payload, refused whole (MaxPayloadError). Messages now keep to the
    connection's max_payload too, the jobs in order."""
    from types import SimpleNamespace

    js = _Recorder()
    js._nc = SimpleNamespace(max_payload=64 * 1024)  # type: ignore[attr-defined]
    jobs = [{"id": f"big-{i:05d}", "name": "t", "command": ["true"], "env": {"DATA": "x" * 1000}} for i in range(500)]
    ids = await submit_over_nats(js, jobs, user="alice")
    assert ids == [j["id"] for j in jobs]
    sent = [[j["id"] for j in body["jobs"]] for _, body, _ in js.sent]
    assert [i for ids_ in sent for i in ids_] == ids and len(sent) > 1
    for _, body, _ in js.sent:
        assert len(json.dumps(body).encode()) <= 64 * 1024
    small = [{"id": f"small-{i:05d}", "name": "t", "command": ["true"]} for i in range(501)]
    js.sent.clear()
    await submit_over_nats(js, small, user="alice")
    assert [len(body["jobs"]) for _, body, _ in js.sent] == [500, 1]  # the count still bounds a message
