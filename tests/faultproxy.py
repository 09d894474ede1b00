"""A TCP fault proxy between NATS clients and the broker (RELIABILITY.md §7, R4), on 127.0.0.1.

Modes: ``pass`` (forward), ``blackhole`` (hold connections open, forward nothing), ``mute`` (forward
what clients send, hold what the broker answers: a publish is stored but its ack is late), ``delay``
(forward each chunk after ``delay_s``). ``reset()`` drops every open connection at once.
``published(subject)`` counts the publishes to a subject that clients sent through it (once watched).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class FaultProxy:
    upstream_port: int
    mode: str = "pass"
    delay_s: float = 0.0
    port: int = 0
    connections: int = 0
    """Connections accepted so far (reconnects show up here)."""
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _down_open: asyncio.Event = field(default_factory=asyncio.Event)
    _watched: dict[bytes, int] = field(default_factory=dict)
    """Publish protocol lines to watch for (``PUB <subject> ``), and how many went upstream."""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        self._open.set()
        self._down_open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set(self, mode: str, delay_s: float = 0.0) -> None:
        self.mode, self.delay_s = mode, delay_s
        for event, closed in ((self._open, mode == "blackhole"), (self._down_open, mode in ("blackhole", "mute"))):
            event.clear() if closed else event.set()

    def watch(self, subject: str) -> None:
        """Count from now on the publishes to ``subject`` forwarded to the broker (retries included)."""
        self._watched.setdefault(f"PUB {subject} ".encode(), 0)

    def published(self, subject: str) -> int:
        return self._watched[f"PUB {subject} ".encode()]

    def _count(self, tail: bytes, chunk: bytes) -> bytes:
        """Count the watched publishes in ``chunk`` (HPUB lines too: ``PUB <subject> `` ends both); ``tail``
        is the end of the connection's previous chunk, so a line cut in two is counted once. Returns the
        new tail."""
        data = tail + chunk
        for pattern in self._watched:
            self._watched[pattern] += data.count(pattern) - tail.count(pattern)
        return data[-(max(map(len, self._watched)) - 1) :]

    def reset(self) -> None:
        """Drop every open connection (clients see a reset and reconnect)."""
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer, self._open, upstream=True),
            self._pipe(up_reader, writer, self._down_open),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event, upstream: bool = False
    ) -> None:
        tail = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            await gate.wait()
            if upstream and self._watched:
                tail = self._count(tail, chunk)
            if self.mode == "delay" and self.delay_s:
                await asyncio.sleep(self.delay_s)
            writer.write(chunk)
            await writer.drain()
