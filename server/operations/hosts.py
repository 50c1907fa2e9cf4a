"""Operators' commands on hosts: cordon, drain (now or ahead), clearing GPU fault marks and
the operator's labels; each stored in the host's settings record the planner reads."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from server.operations.base import Operations
from server.scheduling.hostlabels import changed_labels
from server.state.cluster import HostConfig
from server.timefmt import PAST_START_SLACK_S, iso_utc
from wire import subjects
from wire.errors import ConflictError, InvalidInput, NotFound, ValidationError
from wire.messages import Event
from wire.records import Record
from wire.validation import LABEL_KEY_RE, MAX_LABELS, validate_labels, validate_reason

# How far ahead a drain may be scheduled (a maintenance window is announced days ahead,
# not months).
MAX_DRAIN_AHEAD_S = 90 * 86400



class HostOperations(Operations):
    async def set_cordon(self, host_id: str, cordoned: bool, by: str, reason: str) -> None:
        """Cordon (no new placements) or uncordon (also ends a drain) a host."""
        reason = validate_reason(reason, required=cordoned)
        await self._set_hostcfg(host_id, lambda cur: HostConfig(cordoned=cordoned, reason=reason, by=by,
                                                                ts=time.time(), gpu_clears=cur.gpu_clears,
                                                                labels=cur.labels))

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
            reason=reason, by=by, ts=now, gpu_clears=cur.gpu_clears, labels=cur.labels))

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

    async def set_labels(self, host_id: str, by: str, labels: object, remove: Iterable[str] = (),
                         reason: str = "") -> dict[str, str]:
        """Set the operator's `labels` on a host and remove those of the keys in `remove`:
        they override what its agent reports, and are the only source of the keys only
        operators set (scheduling.hostlabels). A cordon or drain stays as it is. Returns
        the operator's labels of the host now."""
        reason = validate_reason(reason)
        if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in labels.items()):
            raise ValidationError("labels", "must be a map of label keys to values (strings)", "INVALID")
        given = {str(k): str(v) for k, v in labels.items()}
        remove = list(dict.fromkeys(remove))
        if not given and not remove:
            raise ValidationError("labels", "give labels to set or keys to remove", "REQUIRED")
        errors = [ValidationError("remove", f"invalid label key {k[:64]!r}") for k in remove
                  if not LABEL_KEY_RE.fullmatch(k)] + validate_labels(given)
        errors += [ValidationError("remove", f"{k} is both set and removed") for k in sorted(set(given) & set(remove))]
        if errors:
            raise InvalidInput(errors)
        result: dict[str, str] = {}

        def change(cur: HostConfig) -> HostConfig:
            new = changed_labels(cur.labels, given, remove)
            if len(new) > MAX_LABELS:
                raise ValidationError("labels", f"a host has at most {MAX_LABELS} labels of the operator's; {host_id} "
                                      f"would have {len(new)}", "TOO_LARGE")
            result.clear()
            result.update(new)
            return cur.model_copy(update={"labels": new})

        what = ", ".join([*(f"{k}={v}" for k, v in sorted(given.items())), *(f"-{k}" for k in remove)])
        await self._set_hostcfg(host_id, change, action="labels", by=by,
                                reason=f"{reason} ({what})" if reason else what,
                                data={"set": given, "removed": remove, "labels": result})
        return result

    async def _set_hostcfg(self, host_id: str, change: Callable[[HostConfig], HostConfig], action: str = "",
                           by: str = "", reason: str = "", data: dict[str, object] | None = None) -> None:
        """Store a host's settings as `change` makes them from the stored ones (read
        again after a concurrent change). `action` names the event (by default what the
        settings say: drain, cordon or uncordon), `by` and `reason` its author and why
        (by default the settings'); `data`, more of the event's data."""
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
                ahead = f" from {iso_utc(cfg.drain_at)}" if not action and cfg.draining and cfg.drain_at else ""
                ev = Event(kind=f"host.{what}", host_id=host_id, message=f"{what}{ahead} by {who}: {why}",
                           data={"by": who, "reason": why, "deadline": cfg.drain_deadline,
                                 **({"at": cfg.drain_at} if ahead else {}), **(data or {})})
                await self._publish_event(f"host.{what}", ev)  # best effort: the setting is stored
                return
            except ConflictError:
                self.state.apply_state_record(await self.store.get(key))
        raise ConflictError("host settings changed concurrently; try again", field="id")
