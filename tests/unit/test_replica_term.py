"""The term a replica shows (API, console): a leader shows the term it holds, even when
the store already shows a newer one it has not noticed yet (it is being replaced);
a follower shows the newest term it has seen."""

from __future__ import annotations

from types import SimpleNamespace

from server.replica import Muster


def _shown(leading: bool, held: int, seen: int) -> int:
    replica = SimpleNamespace(leadership=SimpleNamespace(leading=leading, term=held), state=SimpleNamespace(term=seen))
    return Muster.term.fget(replica)  # type: ignore[attr-defined,no-any-return]


def test_a_leader_shows_the_term_it_holds() -> None:
    assert _shown(True, 3, 4) == 3  # replaced in the store, not noticed yet
    assert _shown(True, 4, 4) == 4


def test_a_follower_shows_the_newest_term_seen() -> None:
    assert _shown(False, 3, 4) == 4
    assert _shown(False, 0, 7) == 7


def test_a_replica_without_leadership_shows_the_store_term() -> None:
    replica = SimpleNamespace(leadership=None, state=SimpleNamespace(term=5))
    assert Muster.term.fget(replica) == 5  # type: ignore[attr-defined]
