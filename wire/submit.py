"""Submitting jobs over NATS, for programs that speak NATS (the high-rate path).

    ids = await submit_over_nats(js, [{"name": "train", "command": ["python", "t.py"], "gpus": 1}])

Each job gets a client-chosen id before it is sent, so the publish can be retried
safely: the stream deduplicates the message (Nats-Msg-Id) and the leader never creates
a job id twice. The publish is acknowledged once the batch is stored durably; the jobs
appear as QUEUED (or already PLACED) records on the leader's next cycle.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from wire import subjects
from wire.messages import MAX_SUBMIT_JOBS, SubmitRequest, encode, new_id


async def submit_over_nats(js: Any, jobs: list[dict[str, Any]], user: str = "nats", timeout: float = 10) -> list[str]:
    """Publish `jobs` on `muster.submit.<user>`, in messages of at most MAX_SUBMIT_JOBS
    jobs; returns their ids. Each message carries a Nats-Msg-Id derived from its job ids,
    so publishing the same jobs again (a retry after a lost ack) creates nothing twice."""
    jobs = [dict(j) for j in jobs]
    for j in jobs:
        j.setdefault("id", new_id("j"))
    for i in range(0, len(jobs), MAX_SUBMIT_JOBS):
        chunk = jobs[i : i + MAX_SUBMIT_JOBS]
        req = SubmitRequest(user=user, ts=time.time(), jobs=chunk)
        msg_id = hashlib.sha256("\x1f".join(str(j["id"]) for j in chunk).encode()).hexdigest()[:32]
        await js.publish(f"{subjects.SUBMIT_PREFIX}.{user}", encode(req), headers={"Nats-Msg-Id": msg_id},
                         timeout=timeout)
    return [str(j["id"]) for j in jobs]
