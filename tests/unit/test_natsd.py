"""server.broker.natsd.free_port: a port a server can listen on, outside the range the
kernel takes outgoing connections' source ports from."""

from __future__ import annotations

import socket

from server.broker.natsd import _ephemeral_ports, free_port


def test_free_ports_lie_outside_the_ephemeral_range_and_can_be_bound() -> None:
    lo, hi = _ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # picked at random, not one fixed port
    for port in ports:
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The ports of a cluster are all picked before any node binds one: a picker that can
    repeat itself (here: one that draws the same candidate three times) must move on."""
    import random

    from server.broker import natsd

    monkeypatch.setattr(natsd, "_HANDED_OUT", set())
    a, b = natsd.free_port(), natsd.free_port()  # two bindable ports
    natsd._HANDED_OUT.clear()
    draws = iter([a, a, a, b])
    monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, lo, hi: next(draws))
    assert (natsd.free_port(), natsd.free_port()) == (a, b)



def test_a_range_given_is_where_ports_are_picked_and_test_workers_have_their_own(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """$MUSTER_FREE_PORTS narrows the picks (child processes inherit it); the suite gives
    each xdist worker a slice of the default range, no two overlapping."""
    from server.broker import natsd
    from tests.conftest import worker_ports

    monkeypatch.setenv(natsd.PORTS_ENV, "20000-20050")
    assert natsd.port_range() == (20000, 20050)
    assert all(20000 <= free_port() < 20050 for _ in range(10))
    monkeypatch.delenv(natsd.PORTS_ENV)
    lo, hi = natsd.port_range()
    slices = [tuple(map(int, worker_ports(f"gw{i}", 3, (lo, hi)).split("-"))) for i in range(3)]
    assert slices[0][0] == lo and slices[-1][1] <= hi
    assert all(a[1] <= b[0] and a[0] < a[1] for a, b in zip(slices, slices[1:], strict=False))
