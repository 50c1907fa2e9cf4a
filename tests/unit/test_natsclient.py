"""wire.natsclient: the faster header parser returns what nats-py's own returns, and
the clients Muster connects use it."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from wire import natsclient
from wire.errors import StoreError
from wire.kv import connect_once
from wire.natsclient import parse_header_lines

TYPICAL = [
    b"Nats-TTL: 15s\r\nMuster-Shape: 0123abcd\r\n\r\n",
    b"Nats-Stream: KV_state\r\nNats-Subject: $KV.state.alloc.h1\r\nNats-Sequence: 12345\r\n"
    b"Nats-Time-Stamp: 2026-11-30T20:00:00.123456789Z\r\nNats-Expected-Last-Subject-Sequence: 12\r\n\r\n",
    b"KV-Operation: PURGE\r\nNats-Marker-Reason: MaxAge\r\n\r\n",
    b"",
    b"\r\n\r\n",
]


MALFORMED = [
    b"no colon here\r\nGood: yes\r\n\r\n",
    b"Bad Name: has a space\r\nBad\tTab: x\r\nOk:value-without-space\r\n",
    b"  Padded  :   value  \r\n",
    b"\x1cSep: unit separator is whitespace to str.isspace\r\n",
    b"Caf\xc3\xa9: non-ascii name is skipped\r\nUtf8: caf\xc3\xa9\r\nBroken: \xff\xfe\r\n",
    b"Dup: 1\r\nDup: 2\r\n",
    b":empty name\r\nColon: a:b:c\r\n",
    b"Only\r\n\r\n\r\nTrailing: x",
    b"Vt\x0bName: x\r\nFf\x0cName: y\r\nNbsp\xc2\xa0Name: z\r\n",
]


def test_same_as_nats_py_on_typical_and_malformed_blocks() -> None:
    for raw in TYPICAL + MALFORMED:
        assert parse_header_lines(raw) == Client._parse_header_lines(raw), raw


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=12), st.sampled_from([b":", b": ", b"", b" :"]),
                          st.binary(max_size=12)), max_size=6),
       st.sampled_from([b"\r\n", b"\n", b"\r\n\r\n"]))
def test_same_as_nats_py_on_random_blocks(lines: list[tuple[bytes, bytes, bytes]], sep: bytes) -> None:
    raw = sep.join(name + colon + value for name, colon, value in lines)
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_client_uses_it() -> None:
    nc = natsclient.client()
    assert nc._parse_header_lines is parse_header_lines
    # Only the instance: nats-py's class and other clients are untouched.
    assert Client()._parse_header_lines is not parse_header_lines


async def test_a_short_lived_command_gives_up_on_a_nats_that_does_not_answer() -> None:
    """`muster token` and `muster check` connect with connect_once: a port nothing listens
    on is an error after two tries, not a wait for ever (it used to be)."""
    with socket.socket() as s:  # a free port, closed again: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError, match="cannot connect to NATS"):
        await connect_once(f"nats://127.0.0.1:{port}", "test")
