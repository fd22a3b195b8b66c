"""The lean forwarding client against a raw socket server: keep-alive, framing, limits, errors."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from reachmesh.config import ServerPolicy
from reachmesh.exceptions import (
    AgentBusy,
    AgentRejected,
    AttemptTimeout,
    BadAgentResponse,
    ConnectFailed,
    ReachError,
)
from reachmesh.outbox import Outbox, outbox
from reachmesh.ports import free_port
from reachmesh.transport.answer import DEFAULT_HEAD, HeadLimits
from reachmesh.transport.base import AttemptLimits, retry_after_seconds
from reachmesh.transport.http import HttpTransport, _post_error, head_limits
from reachmesh.transport.pool import _Conn, interleave
from tests.helpers import scaled, until

OK = b'{"status":"SUCCESS","result":{"ok":true}}'
# Short, so the timeout cases are quick; scaled, so a busy machine's slow answer is not one.
LIMITS = AttemptLimits(scaled(1.0), scaled(0.3), scaled(2.0))
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Server, str]]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler, port: int = 0) -> tuple[Server, str]:
        server = Server(handler)
        listener = await asyncio.start_server(server._serve, "127.0.0.1", port)
        servers.append(listener)
        port = listener.sockets[0].getsockname()[1]
        return server, f"http://127.0.0.1:{port}/reach"

    yield start
    for listener in servers:
        listener.close()


@pytest.fixture
async def transport() -> AsyncIterator[HttpTransport]:
    t = HttpTransport(response_limit=1024)
    await t.open()
    yield t
    await t.close()


async def test_sequential_and_concurrent_calls_reuse_their_connections(serve, transport) -> None:
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            server.requests.append(await read_request(reader))
            writer.write(answer(OK))

    server, url = await serve(keep_alive)
    for _ in range(5):
        assert await transport.send(url, b"{}", {"Content-Type": "application/json"}, LIMITS) == {"ok": True}
    assert server.connections == 1
    results = await asyncio.gather(*(transport.send(url, b"{}", {}, LIMITS) for _ in range(4)))
    assert results == [{"ok": True}] * 4
    assert server.connections <= 4
    first = server.requests[0]
    assert first.startswith(b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Type: application/json\r\n" in first and first.endswith(b"\r\n\r\n{}")


async def test_chunked_gzip_and_close_delimited_answers_arrive_whole(serve, transport) -> None:
    packed = gzip.compress(OK)

    async def varied(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + OK[:5] + b"\r\n")
        await writer.drain()
        rest = OK[5:]
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        await read_request(reader)
        writer.write(answer(packed, b"Content-Encoding: gzip\r\n"))
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + OK)
        await writer.drain()

    _, url = await serve(varied)
    for _ in range(3):
        assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}


async def test_limit_timeouts_and_broken_answers_map_to_the_error_tree(serve, transport) -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"x" * 2048))

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async def cut_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(OK)[:-5])
        await writer.drain()

    _, url = await serve(big)
    with pytest.raises(AgentRejected) as caught:
        await transport.send(url, b"{}", {}, LIMITS)
    assert caught.value.to_error()["code"] == "RESPONSE_TOO_LARGE"
    _, url = await serve(silent)
    with pytest.raises(AttemptTimeout):
        await transport.send(url, b"{}", {}, LIMITS)
    _, url = await serve(hangs_up)
    with pytest.raises(ConnectFailed):
        await transport.send(url, b"{}", {}, LIMITS)
    _, url = await serve(cut_off)
    with pytest.raises(BadAgentResponse):
        await transport.send(url, b"{}", {}, LIMITS)


async def test_nothing_listening_is_a_refused_connect_error(transport) -> None:
    with pytest.raises(ConnectFailed) as caught:
        await transport.send(f"http://127.0.0.1:{free_port()}/reach", b"{}", {}, LIMITS)
    assert caught.value.refused


async def test_an_interim_answer_is_skipped_and_never_leaks_into_the_next_call(serve, transport) -> None:
    """100 Continue and 103 Early Hints arrive apart from the answer; each call gets its own."""

    async def interim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            nonce = request.rsplit(b"\r\n\r\n", 1)[1]
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(answer(b'{"status":"SUCCESS","result":%s}' % nonce))

    server, url = await serve(interim)
    for n in range(5):
        assert await transport.send(url, b"%d" % n, {}, LIMITS) == n
    assert server.connections == 1


async def test_101_is_a_bad_answer_and_the_connection_is_not_reused(serve, transport) -> None:
    async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    _, url = await serve(upgrade)
    with pytest.raises(BadAgentResponse, match="101"):
        await transport.send(url, b"{}", {}, LIMITS)


async def test_a_kept_alive_connection_the_agent_closed_is_not_reused(serve, transport) -> None:
    """An agent that promises keep-alive and closes after each answer: every call succeeds."""

    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(OK))
        await writer.drain()

    server, url = await serve(closes)
    for _ in range(20):
        assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
    assert server.connections == 20


async def test_a_reused_connection_closed_after_the_request_is_not_sent_again(serve, transport) -> None:
    """The agent reads a request on a kept-alive connection and closes it without a byte of
    answer: it may be running it, so the pool does not send it again on a fresh connection (it
    did, before: one send() delivered the request twice). The caller learns it was sent."""
    seen: list[int] = []

    async def drops_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        seen.append(1)
        writer.write(answer(OK))
        await read_request(reader)  # ... the second request is read, then the connection dropped
        seen.append(2)

    server, url = await serve(drops_the_second)
    assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
    with pytest.raises(ConnectFailed) as caught:
        await transport.send(url, b"{}", {}, LIMITS)
    assert caught.value.sent is True
    assert server.connections == 1
    assert seen == [1, 2]


async def test_a_dripping_head_times_out_at_the_read_timeout_not_the_ceiling(serve, transport) -> None:
    """Header bytes arriving one at a time do not re-arm the read timeout: the whole head is due
    within it, so a slow-loris agent costs read_s, not the attempt's ceiling."""

    async def drips(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(int(scaled(100))):
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"a")

    _, url = await serve(drips)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(AttemptTimeout):
        await transport.send(url, b"{}", {}, AttemptLimits(1.0, 0.3, scaled(5.0)))
    assert loop.time() - began < scaled(2.0)


async def test_a_reused_connection_times_out_at_each_exchange_s_own_read_timeout(serve, transport) -> None:
    """A connection's timer outlives an exchange that answered (it is reused, not remade, for
    the next): a later exchange with a shorter read timeout is still cut at its own, and one
    whose agent never answers is still cut at all."""

    async def fast_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(OK))
        await read_request(reader)
        await asyncio.sleep(scaled(10.0))

    server, url = await serve(fast_then_silent)
    long_read = AttemptLimits(1.0, scaled(8.0), scaled(9.0))
    assert await transport.send(url, b"{}", {}, long_read) == {"ok": True}
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(AttemptTimeout):
        await transport.send(url, b"{}", {}, AttemptLimits(1.0, 0.3, scaled(9.0)))
    assert loop.time() - began < scaled(4.0)
    assert server.connections == 1  # the second exchange did reuse the first one's connection


async def test_the_head_bounds_come_from_the_server_policy(serve) -> None:
    policy = ServerPolicy(response_max_header_bytes=2048, response_max_headers=8, response_max_line_bytes=256)
    assert head_limits(policy) == HeadLimits(2048, 8, 256)
    assert head_limits(ServerPolicy()) == HeadLimits(32 * 1024, 100, 8190)

    async def many(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(OK, b"X-A: 1\r\n" * 9))

    _, url = await serve(many)
    strict = HttpTransport(response_limit=1024, head=head_limits(policy))
    await strict.open()
    try:
        with pytest.raises(BadAgentResponse, match="answer head refused: the answer has over 8 header"):
            await strict.send(url, b"{}", {}, LIMITS)
    finally:
        await strict.close()


def test_addresses_alternate_between_families_first_choice_first() -> None:
    assert interleave(["::1", "::2", "10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [
        "::1",
        "10.0.0.1",
        "::2",
        "10.0.0.2",
        "10.0.0.3",
    ]
    assert interleave(["10.0.0.1", "::1"]) == ["10.0.0.1", "::1"]


async def test_a_black_holed_first_address_costs_a_head_start_not_the_connect_timeout(
    serve, transport, monkeypatch
) -> None:
    """A name with two addresses, the first one never answering a SYN: the second is tried
    after STAGGER_S and the call succeeds well within one connect timeout."""

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(OK))

    # A listener on another loopback address whose accept queue is full: a connect to it hangs.
    # Both addresses need the same port: the hole takes a free one first and the server that
    # one on 127.0.0.1 (another process of the suite may hold it there: then another pair).
    for _ in range(20):
        hole = socket.socket()
        hole.bind(("127.0.0.2", 0))
        port = hole.getsockname()[1]
        try:
            server, _url = await serve(ok, port)
            break
        except OSError:
            hole.close()
    else:
        raise AssertionError("no port free on both 127.0.0.1 and 127.0.0.2 in 20 tries")
    hole.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.2", port))
        fillers.append(filler)
    pool = transport._pool
    assert pool is not None

    async def two_addresses(host: str, port: int) -> list[str]:
        return ["127.0.0.2", "127.0.0.1"]

    monkeypatch.setattr(pool, "_resolve", two_addresses)
    loop = asyncio.get_running_loop()
    try:
        began = loop.time()
        result = await transport.send(
            f"http://agent.test:{port}/reach", b"{}", {}, AttemptLimits(scaled(1.0), scaled(1.0), scaled(3.0))
        )
        assert result == {"ok": True}
        assert loop.time() - began < scaled(0.9)
        assert server.connections == 1
        assert len(pool._all) == 1  # the hung attempt was dropped, not kept in the pool
    finally:
        for sock in (hole, *fillers):
            sock.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (b"", None),
        (b"7", 7),
        (b" 2.1 ", 3),
        (b"-5", 0),
        (b"100000", 300),
        (b"nan", None),
        (b"soon", None),
        (b"Wed, 21 Oct 2015 07:28:00 GMT", 0),
    ],
)
def test_retry_after_is_read_as_bounded_whole_seconds(value: bytes | None, seconds: int | None) -> None:
    assert retry_after_seconds(value) == seconds


async def test_a_429_is_busy_with_its_retry_after(serve, transport) -> None:
    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 12\r\nContent-Length: 0\r\n\r\n")

    _, url = await serve(busy)
    with pytest.raises(AgentBusy) as caught:
        await transport.send(url, b"{}", {}, LIMITS)
    assert caught.value.retry_after_s == 12 and caught.value.reason == "busy"
    with pytest.raises(AgentBusy):
        await transport.send(url, b"{}", {}, LIMITS, protocol="a2a")


# -- requests held to the end of the loop's turn while others are under way (reachmesh.outbox) --
async def test_concurrent_calls_held_to_the_turns_end_each_get_their_own_answer(
    serve, transport, monkeypatch
) -> None:
    held: list[Any] = []
    hold = Outbox.hold

    def spy(self: Outbox, writer: Any, loop: asyncio.AbstractEventLoop) -> None:
        held.append(writer)
        hold(self, writer, loop)

    monkeypatch.setattr(Outbox, "hold", spy)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            body = request.split(b"\r\n\r\n", 1)[1]
            writer.write(answer(b'{"status":"SUCCESS","result":%s}' % body))

    _, url = await serve(echo)
    results = await asyncio.gather(*(transport.send(url, b"[%d]" % i, {}, LIMITS) for i in range(24)))
    assert results == [[i] for i in range(24)]
    assert held, "with calls under way, some requests were held to the turn's end"
    assert outbox(asyncio.get_running_loop()).inflight == 0


async def test_the_count_in_flight_comes_back_to_zero_after_timeouts_hang_ups_and_cancels(
    serve, transport
) -> None:
    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(b'{"status":"SUCCESS","result":1}'))

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(scaled(5))

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    urls = [(await serve(handler))[1] for handler in (ok, silent, hangs_up)]
    calls = [asyncio.ensure_future(transport.send(urls[i % 3], b"{}", {}, LIMITS)) for i in range(30)]
    box = outbox(asyncio.get_running_loop())
    # Cancel some of the calls to the silent agent while they wait for its answer.
    await until(lambda: box.inflight >= 10, "the silent agent's calls under way")
    for call in calls[1:30:6]:
        call.cancel()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert any(isinstance(o, asyncio.CancelledError) for o in outcomes)
    assert any(isinstance(o, ReachError) for o in outcomes)
    assert outcomes[0] == 1
    assert box.inflight == 0


class _NoPool:
    def forget(self, conn: _Conn) -> None:
        pass


class _Closing:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("closed_by", ["the agent", "this side"])
async def test_a_request_held_on_a_connection_that_closed_meanwhile_never_leaves(closed_by: str) -> None:
    loop = asyncio.get_running_loop()
    conn = _Conn(_NoPool(), ("http", "127.0.0.1", 1), loop, DEFAULT_HEAD)  # type: ignore[arg-type]
    gone = _Closing()
    conn.transport = gone  # type: ignore[assignment]
    conn._held = b"POST /reach HTTP/1.1\r\n\r\n"
    if closed_by == "this side":
        conn._close()
        assert conn._held is None
    conn.write_held()
    assert gone.writes == []


async def test_a_connection_the_agent_closes_while_the_request_is_held_says_nothing_was_sent() -> None:
    loop = asyncio.get_running_loop()
    box = outbox(loop)
    conn = _Conn(_NoPool(), ("http", "127.0.0.1", 1), loop, DEFAULT_HEAD)  # type: ignore[arg-type]
    conn.transport = _Closing()  # type: ignore[assignment]
    conn.exchange(b"first", b"", 1024, 1.0, loop.time() + 1)
    assert conn.transport.writes == [b"first"]  # type: ignore[union-attr]  # none under way: at once
    conn._waiter = None
    waiter = conn.exchange(b"second", b"", 1024, 1.0, loop.time() + 1)  # the first is under way
    assert conn._held == b"second"
    box.inflight -= 2  # the two exchanges begun here, without Pool.post to count them out
    conn.eof_received()  # the agent's FIN, read before the turn ended
    with pytest.raises(ConnectionResetError) as caught:
        await waiter
    conn.write_held()
    assert conn.transport.writes == [b"first"]  # type: ignore[union-attr]  # the second never left
    error = _post_error(caught.value, LIMITS)
    assert isinstance(error, ConnectFailed) and not error.sent  # another agent may take it
