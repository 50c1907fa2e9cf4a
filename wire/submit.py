"""Submitting jobs over NATS, for programs that speak NATS (the high-rate path).

    jobs = [{"name": "train", "command": ["python", "t.py"], "gpus": 1}]
    ids = await submit_over_nats(js, jobs, user="alice")

Each job without an `id` gets a client-chosen one before it is sent (the dicts given are
not changed), so the publish can be retried safely: by this function, and after it
raised, by sending the jobs again with the ids the exception carries (`job_ids`, in the
jobs' order: `[dict(j, id=i) for j, i in zip(jobs, exc.job_ids)]`). Within one call the
stream deduplicates a message tried again (its Nats-Msg-Id is drawn afresh for each call
and kept by the call's own tries); the leader creates a job id once (the same user's id
again is skipped when the job is unchanged, refused when it differs; another user's
job's, or an earlier job's, is refused). The publish is
acknowledged once the batch is stored durably; the jobs appear as QUEUED (or already
PLACED) records on the leader's next cycle.

While NATS cannot take the publish (the submission stream electing a leader after a
node was lost: no responders, a timeout, 503) it is sent again every `every_s` for up to
`within_s` (wire.retrying.SUBMIT_RETRY_S, 10 s, by default, as the API waits out an
election): a try that was stored although its answer was lost makes the next a
duplicate, acknowledged as stored.
A refusal that a retry cannot change (past `max_payload`, another JetStream error) is
raised at once. So is a stream that holds as many submissions not yet taken by the
leader as it may, of this subject (`muster.submit.<user>[.<queue>]`: 10,000 messages) or
in all: `wire.errors.SubmissionsWaiting`, raised at once so that the client waits for the
leader to take its earlier ones before it sends more (found by exploring: a per-subject
refusal came back as a bare 503, tried again for 10 s, then raised as
ServiceUnavailableError).
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from typing import Any

from nats.errors import MaxPayloadError
from nats.js.errors import APIError, ServiceUnavailableError

from wire import retrying, subjects
from wire.errors import SubmissionsWaiting
from wire.messages import MAX_SUBMIT_BYTES, MAX_SUBMIT_JOBS, SubmitRequest, encode, new_id


async def submit_over_nats(js: Any, jobs: list[dict[str, Any]], user: str, timeout: float = 10, *,
                           within_s: float = retrying.SUBMIT_RETRY_S, every_s: float = 0.5,
                           queue: str | None = None) -> list[str]:
    """Publish `jobs` on `muster.submit.<user>` (the user the credentials may submit as),
    or on `muster.submit.<user>.<queue>` with `queue` (jobs of that queue only: what
    credentials bound to queues may publish on; a job naming no queue is in it), in
    messages of at most MAX_SUBMIT_JOBS jobs and the bytes NATS takes (`messages`);
    returns their ids. A message NATS cannot take is sent again for up to `within_s` (0:
    raised at once) under the same Nats-Msg-Id, so that a try stored although its answer
    was lost makes the next a duplicate. Another call is another message, whatever it holds (found by exploring:
    with the id a digest of the user and jobs, a job refused and sent again unchanged
    within the stream's 2-minute duplicate window, its queue made meanwhile, was
    acknowledged and dropped without a word): sent again after this raised (the
    exception's `job_ids`), the leader skips the jobs it already has. The dicts given are
    not changed (a review: written into, one dict given three times, or a template sent
    in a loop, made one job)."""
    jobs = [j if "id" in j else {**j, "id": new_id("j")} for j in jobs]
    try:
        await _publish_all(js, jobs, user, timeout, within_s, every_s, queue, secrets.token_hex(16))
    except Exception as exc:
        # (found by exploring: the ids lived on copies, and a retry after an error sent new
        # ones: the jobs stored by the try that seemed to fail ran twice)
        exc.job_ids = [str(j["id"]) for j in jobs]  # type: ignore[attr-defined]
        raise
    return [str(j["id"]) for j in jobs]


# What a message holds besides its jobs (SubmitRequest's other fields, its headers),
# generously: a message is filled with jobs up to its bytes less this.
_ENVELOPE_BYTES = 1024


def messages(jobs: list[dict[str, Any]], limit: int) -> list[list[dict[str, Any]]]:
    """`jobs` in order, in messages of at most MAX_SUBMIT_JOBS jobs and `limit` bytes (found
    by exploring: split by count alone, 500 jobs of a few KiB each made a message past
    NATS's max_payload, refused whole). A job past `limit` on its own is a message of its
    own, which NATS refuses (MaxPayloadError)."""
    out: list[list[dict[str, Any]]] = []
    chunk: list[dict[str, Any]] = []
    size = _ENVELOPE_BYTES
    for job in jobs:
        n = len(json.dumps(job, separators=(",", ":"), ensure_ascii=False, default=str).encode()) + 1
        if chunk and (len(chunk) >= MAX_SUBMIT_JOBS or size + n > limit):
            out.append(chunk)
            chunk, size = [], _ENVELOPE_BYTES
        chunk.append(job)
        size += n
    if chunk:
        out.append(chunk)
    return out


def _limit(js: Any) -> int:
    """The most bytes a submission's message may have: the server's max_payload (as the
    client's connection was told it), and what the leader decodes."""
    payload = getattr(getattr(js, "_nc", None), "max_payload", None)
    return min(MAX_SUBMIT_BYTES, payload) if isinstance(payload, int) and payload > 0 else MAX_SUBMIT_BYTES


async def _publish_all(js: Any, jobs: list[dict[str, Any]], user: str, timeout: float, within_s: float,
                       every_s: float, queue: str | None, call: str) -> None:
    for i, chunk in enumerate(messages(jobs, _limit(js))):
        req = SubmitRequest(user=user, ts=time.time(), jobs=chunk)
        msg_id = f"{call}-{i}"  # this call's, its tries' alike
        subject = subjects.submit_subject(user, queue)
        publish = functools.partial(js.publish, subject, encode(req), headers={"Nats-Msg-Id": msg_id},
                                    timeout=timeout)
        try:
            await retrying.within(publish, within_s, every_s, _again)
        except APIError as exc:
            waiting = _waiting(exc, subject)
            if waiting is None:
                raise
            raise waiting from exc
        except TimeoutError as exc:
            # NATS refuses a publish the credentials do not allow only to the connection's
            # error callback: the client just sees no acknowledgement (found by exploring).
            exc.add_note(f"no acknowledgement for {subject}: NATS is down or electing a stream leader, or these "
                         "credentials may not publish there (a submitter publishes as its own user only, and, "
                         "bound to queues, with queue= one of them)")
            raise


# What JetStream says (a 503, error 10077) of a publish a full stream refuses.
_PER_SUBJECT_FULL = "maximum messages per subject exceeded"
_STREAM_FULL = ("maximum messages exceeded", "maximum bytes exceeded")


def _waiting(exc: APIError, subject: str) -> SubmissionsWaiting | None:
    """The error for a publish refused because the stream holds as many messages as it
    may (of the subject, or in all); None for another refusal."""
    said = str(exc.description or "")
    if _PER_SUBJECT_FULL in said:
        return SubmissionsWaiting(f"{subject} holds as many submissions not yet taken by the leader as one subject may "
                                  f"(NATS: {said}): send these again once it has taken some")
    if any(full in said for full in _STREAM_FULL):
        return SubmissionsWaiting(f"the {subjects.SUBMIT_STREAM} stream holds as many submissions not yet taken by the "
                                  f"leader as it may (NATS: {said}): send these again later")
    return None


def _again(exc: Exception) -> bool:
    """Whether NATS may take the publish later: not past max_payload, nor a full stream,
    nor another JetStream refusal; a 503, no responders, a timeout or a lost connection
    may pass."""
    if isinstance(exc, MaxPayloadError):
        return False
    if isinstance(exc, APIError):
        if _waiting(exc, "") is not None:
            return False
        return isinstance(exc, ServiceUnavailableError) or exc.code == 503
    return True
