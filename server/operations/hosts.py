"""Operators' commands on hosts: cordon, drain (now or ahead), and clearing GPU fault
marks; each stored in the host's settings record the planner reads."""

from __future__ import annotations

import time
from collections.abc import Callable

from server.operations.base import Operations
from server.state.cluster import HostConfig
from server.timefmt import PAST_START_SLACK_S, iso_utc
from wire import subjects
from wire.errors import ConflictError, NotFound, ValidationError
from wire.messages import Event
from wire.records import Record
from wire.validation import validate_reason

# How far ahead a drain may be scheduled (a maintenance window is announced days ahead,
# not months).
MAX_DRAIN_AHEAD_S = 90 * 86400



class HostOperations(Operations):
    async def set_cordon(self, host_id: str, cordoned: bool, by: str, reason: str) -> None:
        """Cordon (no new placements) or uncordon (also ends a drain) a host."""
        reason = validate_reason(reason, required=cordoned)
        await self._set_hostcfg(host_id, lambda cur: HostConfig(cordoned=cordoned, reason=reason, by=by,
                                                                ts=time.time(), gpu_clears=cur.gpu_clears))

    async def drain(self, host_id: str, by: str, reason: str, deadline_s: float, at: float | None = None) -> None:
        """Drain a host: no new placements; what still runs after `deadline_s` is stopped
        and requeued elsewhere. With `at` (a time ahead): the drain begins then, and until
        then the host takes only jobs whose time limit ends them by its deadline
        (scheduling.maintenance). An `at` just past (PAST_START_SLACK_S at most) begins it
        now, its deadline still reckoned from `at`: the hosts of one drain given one start
        (a rack's, drained host by host while the start passes) share one deadline."""
        reason = validate_reason(reason, required=True)
        if not 0 <= deadline_s <= 7 * 24 * 3600:
            raise ValidationError("deadlineSeconds", "must be from 0 to 604800 seconds", "OUT_OF_RANGE")
        now = time.time()
        if at is not None and not at <= now + MAX_DRAIN_AHEAD_S:
            raise ValidationError("at", f"must be at most {MAX_DRAIN_AHEAD_S // 86400:.0f} days ahead", "OUT_OF_RANGE")
        if at is not None and at < now - PAST_START_SLACK_S:
            raise ValidationError("at", f"is {now - at:.0f} s in the past: give a time ahead, or none to drain now",
                                  "OUT_OF_RANGE")
        start = at if at is not None and at > now else 0.0  # a time just past: at once
        deadline = (now if at is None else at) + deadline_s
        await self._set_hostcfg(host_id, lambda cur: HostConfig(
            cordoned=not start, draining=True, drain_at=start, drain_deadline=deadline,
            reason=reason, by=by, ts=now, gpu_clears=cur.gpu_clears))

    async def clear_gpu_faults(self, host_id: str, by: str, reason: str, gpus: list[int] | None = None) -> list[int]:
        """Clear GPU fault marks of a host (after those GPUs were reset or replaced): the
        GPUs in `gpus`, or every GPU its heartbeat reports faulted. The leader passes the
        clear to the host's agent, whose GPUs then report healthy until a new fault. A
        cordon or drain stays as it is. Returns the GPUs cleared."""
        reason = validate_reason(reason, required=True)
        entry = self.state.hosts.get(host_id)
        if entry is None or entry.heartbeat is None:
            raise NotFound(f"no host {host_id}")
        have = {g.index for g in entry.heartbeat.gpus}
        if gpus is None:
            targets = sorted(self.state.faulted_gpus.get(host_id, ()))
            if not targets:
                raise ValidationError("gpus", f"host {host_id} reports no faulted GPU", "NOTHING_TO_CLEAR")
        else:
            targets = sorted(set(gpus))
            if not targets or not set(targets) <= have:
                raise ValidationError("gpus", f"host {host_id} has GPUs {sorted(have)}; not {targets}", "INVALID")

        def change(cur: HostConfig) -> HostConfig:
            counts = dict(cur.gpu_clears)
            for i in targets:
                counts[i] = counts.get(i, 0) + 1
            return cur.model_copy(update={"gpu_clears": counts})

        await self._set_hostcfg(host_id, change, action="gpu_faults_cleared", by=by,
                                reason=f"{reason} (GPUs {', '.join(map(str, targets))})")
        return targets

    async def _set_hostcfg(self, host_id: str, change: Callable[[HostConfig], HostConfig], action: str = "",
                           by: str = "", reason: str = "") -> None:
        """Store a host's settings as `change` makes them from the stored ones (read
        again after a concurrent change). `action` names the event (by default what the
        settings say: drain, cordon or uncordon), `by` and `reason` its author and why
        (by default the settings')."""
        if host_id not in self.state.hosts:
            raise NotFound(f"no host {host_id}")
        assert self.store is not None
        key = subjects.hostcfg_key(host_id)
        for _ in range(5):
            cfg = change(self.state.hostcfg.get(host_id) or HostConfig())
            body = cfg.model_dump_json().encode()
            try:
                rev = await self.store.put(key, body, expected=self.state.revisions.get(key, 0))
                self.state.apply_state_record(Record(key, rev, body))
                what = action or ("drain" if cfg.draining else ("cordon" if cfg.cordoned else "uncordon"))
                who, why = by or cfg.by, reason or cfg.reason
                ahead = f" from {iso_utc(cfg.drain_at)}" if cfg.draining and cfg.drain_at else ""
                ev = Event(kind=f"host.{what}", host_id=host_id, message=f"{what}{ahead} by {who}: {why}",
                           data={"by": who, "reason": why, "deadline": cfg.drain_deadline,
                                 **({"at": cfg.drain_at} if ahead else {})})
                await self._publish_event(f"host.{what}", ev)  # best effort: the setting is stored
                return
            except ConflictError:
                self.state.apply_state_record(await self.store.get(key))
        raise ConflictError("host settings changed concurrently; try again", field="id")
