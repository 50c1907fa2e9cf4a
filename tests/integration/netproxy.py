"""A TCP proxy the test controls, for cutting a process off the network.

`cut()` black-holes the link: established connections stay open but no byte passes
either way (as when a switch drops packets), and new connections hang. `heal()`
closes the black-holed connections (as TCP would once the peer's timers fire) and
lets new ones through again. `hold_replies()` holds only what the target sends back (a
request reaches the target and takes effect, its answer does not come back: a lost
acknowledgement); `release()` lets the held bytes go on, late, on the same connections.
"""

from __future__ import annotations

import asyncio
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._cut = False
        self._held = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            sock: socket.socket = self._server.sockets[0]
            self.port = sock.getsockname()[1]
            self._started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, back: bool = False) -> None:
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                while self._cut or (back and self._held):
                    await asyncio.sleep(0.05)  # black hole: hold the bytes
                    if w.is_closing():
                        return
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        while self._cut:
            await asyncio.sleep(0.05)
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers.update({cw, uw})
        await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw, back=True))
        self._writers.difference_update({cw, uw})

    def cut(self) -> None:
        self._cut = True

    def hold_replies(self) -> None:
        self._held = True

    def release(self) -> None:
        self._held = False

    def heal(self) -> None:
        def _heal() -> None:
            for w in list(self._writers):
                w.close()
            self._writers.clear()
            self._cut = False

        self._loop.call_soon_threadsafe(_heal)

    def close(self) -> None:
        def _stop() -> None:
            for w in list(self._writers):
                w.close()
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(_stop)
        self._thread.join(5)
