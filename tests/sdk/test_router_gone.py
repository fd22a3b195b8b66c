"""A Router that took a call and went away before answering (killed mid-call).

The client never sends such a call to another Router (it may have reached an agent), and its
error says so, and says what happened: before, it read "cannot reach the Router at ...:
ServerDisconnectedError(...)" for a Router it had reached, and a broken stream showed aiohttp's
"TransferEncodingError: 400, Not enough data to satisfy transfer length header".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator

import pytest

from reachmesh import ReachClient, SyncReachClient
from reachmesh.exceptions import RouterUnavailable
from reachmesh.ports import free_port

STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class DyingRouter:
    """A loopback server that reads a request, writes ``answer``, then drops the connection."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.port = free_port()
        self.requests = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            writer.write(self.answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> DyingRouter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[DyingRouter, DyingRouter]]:
    async with DyingRouter() as dying, DyingRouter() as other:
        yield dying, other


async def test_a_call_whose_router_dies_says_so_and_goes_nowhere_else(pair) -> None:
    dying, other = pair
    async with ReachClient(f"{dying.url},{other.url}") as client:
        with pytest.raises(RouterUnavailable) as caught:
            await client.call("work", {}, timeout_ms=5000)
    message = str(caught.value)
    assert f"the Router at {dying.url} took the call and closed the connection before answering" in message
    assert "sent to no other Router" in message
    assert "cannot reach" not in message
    assert (dying.requests, other.requests) == (1, 0)


class ThreadedDyingRouter:
    """DyingRouter for the blocking client: a listening socket served from a thread."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.stop = threading.Event()
        self.sock.settimeout(0.05)  # so that close() is noticed between accepts
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                break
            except TimeoutError:
                if self.stop.is_set():
                    return
        conn.settimeout(10)
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(65536)
                if not piece:
                    return
                data += piece
            self.requests += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()


def test_the_sync_client_says_the_same() -> None:
    dying, other = ThreadedDyingRouter(), ThreadedDyingRouter()
    try:
        with (
            SyncReachClient(f"{dying.url},{other.url}") as client,
            pytest.raises(RouterUnavailable) as caught,
        ):
            client.call("work", {}, timeout_ms=5000)
    finally:
        dying.close()
        other.close()
    message = str(caught.value)
    assert f"the Router at {dying.url} took the call and closed the connection before answering" in message
    assert "sent to no other Router" in message
    assert (dying.requests, other.requests) == (1, 0)


async def test_a_stream_whose_router_dies_says_after_how_many_chunks() -> None:
    one_chunk = b'event: chunk\ndata: {"i": 0}\n\n'
    body = STREAM_HEAD + b"%x\r\n%s\r\n" % (len(one_chunk), one_chunk)
    seen = []
    async with DyingRouter(body) as dying, DyingRouter() as other:
        client = ReachClient(f"{dying.url},{other.url}")
        try:
            with pytest.raises(RouterUnavailable) as caught:
                async with client.stream("ticks", {}, timeout_ms=5000) as stream:
                    async for chunk in stream:
                        seen.append(chunk)
        finally:
            await client.aclose()
    message = str(caught.value)
    assert seen == [{"i": 0}]
    assert "the Router's stream broke after 1 chunk(s), before its done event" in message
    assert "TransferEncodingError" not in message
    assert (dying.requests, other.requests) == (1, 0)


class SilentRouter:
    """A loopback server that reads a request and never answers it."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")

    async def __aenter__(self) -> SilentRouter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        for writer in self._held:
            writer.close()
        self._server.close()


async def test_a_call_the_client_stopped_waiting_for_says_whose_wait_ran_out() -> None:
    """A call whose answer outlasts the client's own wait (a policy giving its task a long read
    timeout, called without timeout_ms) read "sent no answer within 60 s" as if the Router had
    hung: the message says that was this client's wait, and what sets it."""
    async with SilentRouter() as silent, ReachClient(f"http://127.0.0.1:{silent.port}") as client:
        with pytest.raises(RouterUnavailable) as caught:
            await client.call("t", {}, timeout_ms=50)
    message = caught.value.message
    assert "sent no answer within 2.05 s, this client's own wait" in message
    assert "timeout_ms" in message
