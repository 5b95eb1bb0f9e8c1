"""A TCP relay from the containers' network to a server on the host's loopback.

The WeCom emulator listens on loopback only (it refuses any other address, so that it never
stands in for WeCom in a real deployment); the app containers reach the host at the gateway of
their podman network (``host.containers.internal``). The relay listens there, for the deploy
test's run only, and passes each connection on to the emulator's port.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class Relay:
    """Listen on ``listen_host:port`` and forward every connection to ``127.0.0.1:target_port``
    (in a thread with its own event loop, until ``stop``)."""

    def __init__(self, listen_host: str, port: int, target_port: int) -> None:
        self.listen_host, self.port, self.target_port = listen_host, port, target_port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._wait_s = 30.0
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def start(self, wait_s: float = 30.0) -> Relay:
        """Start listening; the gateway's address appears on the host only once a container is
        on the network, so binding is retried for up to ``wait_s``."""
        self._wait_s = wait_s
        self._thread.start()
        self._started.wait(wait_s + 5)
        if self._error is not None or self._server is None:
            raise RuntimeError(f"relay could not listen on {self.listen_host}:{self.port}: {self._error}")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(self._listen(self._wait_s))
        except OSError as exc:
            self._error = exc
        finally:
            self._started.set()
        if self._server is not None:
            self._loop.run_forever()

    async def _listen(self, wait_s: float = 30.0) -> asyncio.AbstractServer:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return await asyncio.start_server(self._handle, self.listen_host, self.port)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
