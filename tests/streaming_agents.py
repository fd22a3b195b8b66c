"""Streaming agents for tests: raw asyncio servers on loopback that write an event stream byte for
byte as a script says, and see when the Router closes their connection.

Each request runs the agent's script with a :class:`Conn`; the script writes the answer head and
events, and may wait on events the test sets, so a test decides when each chunk leaves.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from reachmesh.ports import free_port

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


class Conn:
    """One request to a streaming agent: what it asked, and how to answer it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes):
        self.reader = reader
        self.writer = writer
        self.head = head
        self.body = body
        self.written = 0

    @property
    def envelope(self) -> dict[str, Any]:
        return dict(orjson.loads(self.body))

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()
        self.written += len(data)

    async def sse_head(self) -> None:
        await self.write(SSE_HEAD)

    async def chunk(self, value: Any) -> None:
        await self.write(b"event: chunk\ndata: " + orjson.dumps(value) + b"\n\n")

    async def done(self, answer: dict[str, Any] | None = None) -> None:
        await self.write(b"event: done\ndata: " + orjson.dumps(answer or {"status": "SUCCESS"}) + b"\n\n")
        self.writer.close()

    async def json(self, answer: dict[str, Any], status: int = 200) -> None:
        body = orjson.dumps(answer)
        await self.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, len(body), body)
        )
        self.writer.close()

    def reset(self) -> None:
        """Close with a TCP reset, not an orderly FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def closed_by_router(self) -> None:
        """Returns when the Router closes (or resets) this connection."""
        try:
            while await self.reader.read(65536):
                pass
        except (ConnectionError, OSError):
            return


Script = Callable[[Conn], Awaitable[None]]


class StreamAgent:
    """A raw agent whose every request runs ``script``; ``conns`` are the requests it got."""

    def __init__(self, agent_id: str, script: Script, task: str = "talk") -> None:
        self.agent_id = agent_id
        self.script = script
        self.task = task
        self.port = free_port()
        self.conns: list[Conn] = []
        self.router_closed = asyncio.Event()  # the Router closed a connection mid-answer
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/reach"

    async def start(self) -> StreamAgent:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def register(self, router_url: str, **extra: Any) -> None:
        """Register with the Router; ``extra`` are more top-level profile keys (max_concurrency)."""
        profile = {
            "id": self.agent_id,
            "network": {"endpoint": self.endpoint},
            "capabilities": [{"task": self.task}],
            "health_check": {"interval_seconds": 300, "timeout_ms": 5000},
            **extra,
        }
        async with httpx.AsyncClient() as http:
            resp = await http.post(f"{router_url}/agents", json=profile)
            assert resp.status_code in (200, 201), resp.text

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                writer.close()
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            conn = Conn(reader, writer, head, body)
            self.conns.append(conn)
            await self.script(conn)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._tasks.discard(task)
