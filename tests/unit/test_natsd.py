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
