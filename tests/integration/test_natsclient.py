"""wire.natsclient through a real nats-server: headers arrive intact, parsed by the
faster header parser a Muster client installs."""

from __future__ import annotations

import asyncio

from wire import natsclient
from wire.kv import connect
from wire.natsclient import parse_header_lines


def test_headers_arrive_through_a_real_server(nats_url: str) -> None:
    async def main() -> dict[str, str]:
        nc = await connect(nats_url, name="test-natsclient")
        assert nc._parse_header_lines is parse_header_lines
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def cb(msg) -> None:  # type: ignore[no-untyped-def]
            if not got.done():
                got.set_result(msg.headers)

        await nc.subscribe("t.headers", cb=cb)
        pub = await natsclient.connect(nats_url)
        await pub.publish("t.headers", b"x", headers={"Nats-TTL": "15s", "Muster-Shape": "caf\u00e9"})
        await pub.flush()
        headers = await asyncio.wait_for(got, 10)
        await pub.close()
        await nc.close()
        return headers

    assert asyncio.run(main()) == {"Nats-TTL": "15s", "Muster-Shape": "caf\u00e9"}
