"""wire.submit.submit_over_nats on its own (a NATS client that records what it is sent)."""

from __future__ import annotations

import json
from typing import Any

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


async def test_the_message_id_is_a_digest_of_the_user_the_queue_and_the_jobs() -> None:
    """Found by exploring: a digest of the job ids alone made a corrected job sent again
    under its id, and another user's message naming the same ids, duplicates for 2 minutes."""
    js = _Recorder()
    job = {"id": "same-id-01", "name": "t", "command": ["true"]}
    for user, queue, j in (("alice", None, job), ("alice", None, job), ("bob", None, job),
                           ("alice", "research", job), ("alice", None, dict(job, gpus=1))):
        await submit_over_nats(js, [j], user=user, queue=queue)
    ids = [m for _, _, m in js.sent]
    assert ids[0] == ids[1] and len(set(ids)) == 4
