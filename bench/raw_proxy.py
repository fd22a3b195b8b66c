"""The floor under any Python forwarder: asyncio protocols and httptools, no framework, no features.

It keeps one pooled keep-alive connection per concurrent request to the agent, parses with
httptools and answers 200 with the agent's body. No validation, timeouts, errors, chunked bodies
or logs: it is not a server to use, only the fastest a forwarder in Python on this stack can be,
so that ``bench/latency_floor.py`` can show what the machine itself costs per hop.

    python bench/raw_proxy.py PORT AGENT_URL
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    """One keep-alive connection to the agent; one request at a time."""

    def __init__(self, path: bytes) -> None:
        self.path = path
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []
        self.waiter: asyncio.Future[bytes] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        # The agent closes idle keep-alive connections (uvicorn: after 5 s); never reuse one.
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        body, self.chunks = b"".join(self.chunks), []
        if waiter is not None:
            waiter.set_result(body)

    async def post(self, body: bytes) -> bytes:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        head = (
            b"POST %s HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        )
        self.transport.write(head % (self.path, len(body)) + body)
        return await self.waiter


class Downstream(asyncio.Protocol):
    """One client connection: each complete request is forwarded, its answer written back."""

    def __init__(self, host: str, port: int, path: bytes, pool: list[Upstream]) -> None:
        self.target = (host, port, path)
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.chunks: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body, self.chunks = b"".join(self.chunks), []
        asyncio.get_running_loop().create_task(self.forward(body))

    async def forward(self, body: bytes) -> None:
        host, port, path = self.target
        while self.pool and self.pool[-1].closed:
            self.pool.pop()
        if self.pool:
            upstream = self.pool.pop()
        else:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(path), host, port
            )
        answer = await upstream.post(body)
        self.pool.append(upstream)
        assert self.transport is not None
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.transport.write(head % len(answer) + answer)


async def serve(port: int, agent_url: str) -> None:
    target = urlsplit(agent_url)
    host, agent_port, path = target.hostname or "127.0.0.1", target.port or 80, (target.path or "/").encode()
    pool: list[Upstream] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Downstream(host, agent_port, path, pool), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: raw_proxy.py PORT AGENT_URL")
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2]))
