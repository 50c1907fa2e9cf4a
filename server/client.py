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

from server import subjects
from server.messages import SubmitRequest, encode, new_id


async def submit_over_nats(js: Any, jobs: list[dict[str, Any]], user: str = "nats", timeout: float = 10) -> list[str]:
    jobs = [dict(j) for j in jobs]
    for j in jobs:
        j.setdefault("id", new_id("j"))
    req = SubmitRequest(user=user, ts=time.time(), jobs=jobs)
    ids = [str(j["id"]) for j in jobs]
    msg_id = hashlib.sha256("\x1f".join(ids).encode()).hexdigest()[:32]
    await js.publish(f"{subjects.SUBMIT_PREFIX}.{user}", encode(req), headers={"Nats-Msg-Id": msg_id},
                     timeout=timeout)
    return ids
