"""Others' work on hosts set aside: per advance reservation, its hosts where a task not
told to stop belongs to a job the reservation does not admit (or to a job not known yet).
What the planner stops when the reservation is open (cycle.stops.stop_set_aside), kept by the
cluster state as allocation, job and reservation records arrive, so that a cycle does not
walk every task of every host set aside (4,096 hosts of 8 tasks took 25-50 ms a cycle).

A host listed may have nothing to stop by the time a cycle looks (a job record that came
after its allocation's, work stopped meanwhile): the planner checks each one it is given.
A host with others' work is never left out.

Pure: records in, sets out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from server.scheduling.advance import admits
from wire.messages import AdvanceReservation, HostAlloc, Job


def others_work(r: AdvanceReservation, alloc: HostAlloc | None, job_of: Callable[[str], Job | None]) -> bool:
    """Whether a task of `alloc` not told to stop belongs to a job `r` does not admit (or
    to one `job_of` does not know)."""
    if alloc is None:
        return False
    for t in alloc.tasks:
        if t.stop:
            continue
        job = job_of(t.job_id)
        if job is None or not admits(r, job.spec.queue, job.spec.user):
            return True
    return False


class SetAsideWork:
    def __init__(self) -> None:
        self._hosts: dict[str, set[str]] = {}  # reservation -> its hosts with others' work
        self._covering: dict[str, set[str]] = {}  # host -> the reservations that set it aside
        self._reservations: dict[str, AdvanceReservation] = {}

    def hosts(self, name: str) -> frozenset[str] | set[str]:
        """The hosts of reservation `name` where others' work may run."""
        return self._hosts.get(name, frozenset())

    def _check(self, name: str, host_id: str, alloc: HostAlloc | None, jobs: Mapping[str, Job]) -> None:
        if others_work(self._reservations[name], alloc, jobs.get):
            self._hosts.setdefault(name, set()).add(host_id)
        else:
            listed = self._hosts.get(name)
            if listed is not None:
                listed.discard(host_id)

    def reservation(self, name: str, r: AdvanceReservation | None, allocs: Mapping[str, HostAlloc],
                    jobs: Mapping[str, Job]) -> None:
        """Reservation `name` made, changed (`r`) or deleted (None)."""
        old = self._reservations.pop(name, None)
        if old is not None:
            for h in old.hosts:
                covering = self._covering.get(h)
                if covering is not None:
                    covering.discard(name)
                    if not covering:
                        del self._covering[h]
        self._hosts.pop(name, None)
        if r is None:
            return
        self._reservations[name] = r
        for h in r.hosts:
            self._covering.setdefault(h, set()).add(name)
            self._check(name, h, allocs.get(h), jobs)

    def alloc(self, host_id: str, alloc: HostAlloc | None, jobs: Mapping[str, Job]) -> None:
        """A host's allocation record changed (None: deleted)."""
        for name in self._covering.get(host_id, ()):
            self._check(name, host_id, alloc, jobs)

    def job_seen(self, job: Job, allocs: Mapping[str, HostAlloc], jobs: Mapping[str, Job]) -> None:
        """A job's first record: the hosts of its tasks are looked at again (one whose
        allocation came first was listed while the job was not known)."""
        if not self._covering:
            return
        for a in job.current_tasks():
            if a.host_id in self._covering:
                self.alloc(a.host_id, allocs.get(a.host_id), jobs)
