"""Host sets shared between jobs: the union of some groups' hosts (advance reservations,
maintenance windows), made once per distinct tuple of groups, so that every job kept off
the same groups holds the same set. The placer caches its filtered views of the index per
set (scheduling.capacity): one set for many jobs is one view, where a set per job would
filter the index again for each.

Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Unions(Generic[K]):
    """`unions(groups)`: the hosts of every group in `groups` (`hosts_of` gives a group's),
    the same frozenset for the same tuple."""

    def __init__(self, hosts_of: Callable[[K], Iterable[str]]) -> None:
        self._hosts_of = hosts_of
        self._of: dict[tuple[K, ...], frozenset[str]] = {}

    def __call__(self, groups: tuple[K, ...]) -> frozenset[str]:
        got = self._of.get(groups)
        if got is None:
            got = self._of[groups] = frozenset(h for g in groups for h in self._hosts_of(g))
        return got
