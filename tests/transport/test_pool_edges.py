"""The forwarding client at its edges: stray bytes, shutdown mid-answer, slot hand-over, what an
error says (raw socket servers on loopback, as in test_pool)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trustme

from reachmesh.config import OutboundPolicy
from reachmesh.exceptions import AttemptTimeout, ConnectFailed, InternalError
from reachmesh.transport.answer import Answer, BrokenBody
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.http import HttpTransport
from reachmesh.transport.pool import Pool
from tests.helpers import scaled, until
from tests.transport.test_pool import OK, Handler, Server, answer, read_request

LIMITS = AttemptLimits(scaled(1.0), scaled(0.3), scaled(2.0))


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Server, str]]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> tuple[Server, str]:
        server = Server(handler)
        listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        servers.append(listener)
        return server, f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/reach"

    yield start
    for listener in servers:
        listener.close()


async def opened(**kwargs: object) -> HttpTransport:
    t = HttpTransport(response_limit=1024, **kwargs)  # type: ignore[arg-type]
    await t.open()
    return t


def pool_of(transport: HttpTransport) -> Pool:
    pool = transport._pool
    assert pool is not None
    return pool


# -- item 3: a stray partial answer ---------------------------------------------------------


async def test_a_stray_status_line_after_an_answer_never_breaks_the_next_call(serve) -> None:
    """The first answer is followed, in the same write, by the start of another: that connection
    is closed, and the next (innocent) call goes out on a new one and succeeds."""
    first = True

    async def stray(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal first
        while True:
            await read_request(reader)
            writer.write(answer(OK) + (b"HTTP/1.1 200 OK\r\n" if first else b""))
            first = False

    server, url = await serve(stray)
    transport = await opened()
    try:
        assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
        assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
        assert server.connections == 2
    finally:
        await transport.close()


# -- item 4: holds() reads the whole body ---------------------------------------------------


async def test_holds_reads_a_body_sent_in_two_writes_whole(serve) -> None:
    release = asyncio.Event()

    async def two_writes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"holds": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:9]))
        await writer.drain()
        await release.wait()
        writer.write(body[9:])
        await writer.drain()

    _, url = await serve(two_writes)
    transport = await opened()
    try:
        asking = asyncio.ensure_future(transport.holds(url.replace("/reach", "/reach/conversations/c1"), 30))
        # Before the second write there is no answer to give (the old reader answered False here).
        done, _ = await asyncio.wait({asking}, timeout=scaled(0.3))
        assert not done
        release.set()
        assert await asking is True
    finally:
        await transport.close()


async def test_holds_over_its_bound_is_no(serve) -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"holds": true, "pad": "' + b"x" * (64 * 1024) + b'"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    _, url = await serve(big)
    transport = await opened()
    try:
        assert await transport.holds(url, 30) is False
    finally:
        await transport.close()


# -- item 5 ----------------------------------------------------------------------------------


async def test_closing_the_pool_mid_close_delimited_answer_never_hands_back_the_part_read(serve) -> None:
    release = asyncio.Event()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + OK[:10])
        await writer.drain()
        await release.wait()

    _, url = await serve(cut)
    transport = await opened()
    pool = pool_of(transport)
    try:
        posting = asyncio.ensure_future(pool.post(url, b"{}", {}, 5, 5, 10))
        await until(lambda: any(c.reader.head_done for c in pool._all), "the head to be read")
        pool.close()
        with pytest.raises(BrokenBody, match="shutting down"):
            got: Answer = await posting
            print("handed back as whole:", got)
    finally:
        release.set()
        await transport.close()


async def test_a_woken_slot_waiter_that_is_cancelled_passes_its_wake_up_on(serve) -> None:
    """One slot, held by a slow exchange; two callers wait for it. The slot frees, the first
    waiter is woken and cancelled before it runs: the second must get the slot."""
    release = asyncio.Event()

    async def slow_then_fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if not release.is_set():
            release.set()
            await asyncio.Event().wait()  # the first connection never answers
        writer.write(answer(OK))
        await writer.drain()

    _, url = await serve(slow_then_fast)
    transport = await opened(pool_size=1)
    pool = pool_of(transport)
    limits = AttemptLimits(scaled(1.0), scaled(5.0), scaled(5.0))
    try:
        busy = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        await release.wait()
        first = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        second = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        await until(
            lambda: sum(len(q) for q in pool._waiting.values()) == 2, "both callers to wait for the slot"
        )
        held = next(iter(pool._all))
        held._close()  # as a reset would: frees the slot, wakes the first waiter ...
        first.cancel()  # ... which is cancelled before it can run
        assert await second == {"ok": True}
        assert first.cancelled()
        with pytest.raises(ConnectFailed):
            await busy
    finally:
        await transport.close()


async def test_a_line_break_in_a_header_value_is_named_as_such(serve) -> None:
    _, url = await serve(read_request)
    transport = await opened()
    try:
        with pytest.raises(
            InternalError, match="'X-Reach-Trace-Id' holds a line break; the request was not sent"
        ):
            await transport.send(url, b"{}", {"X-Reach-Trace-Id": "a\r\nInjected: 1"}, LIMITS)
    finally:
        await transport.close()


@pytest.mark.parametrize(
    ("read_s", "total_s", "said"),
    [
        (0.3, 5.0, "no answer within the {read} ms read timeout"),
        (5.0, 0.3, "the attempt's {total} ms ceiling"),
    ],
)
async def test_a_timeout_message_quotes_the_timeout_that_fired(serve, read_s, total_s, said) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.Event().wait()

    _, url = await serve(silent)
    transport = await opened()
    limits = AttemptLimits(scaled(1.0), scaled(read_s), scaled(total_s))
    expected = said.format(read=f"{limits.read_s * 1000:.0f}", total=f"{limits.total_s * 1000:.0f}")
    try:
        with pytest.raises(AttemptTimeout) as caught:
            await transport.send(url, b"{}", {}, limits)
        assert expected in caught.value.message
    finally:
        await transport.close()


# -- a TLS error on a reused connection ------------------------------------------------------


class TlsAgent:
    """A blocking HTTPS agent in a thread: its first connection answers once, then answers the
    second request with bytes that are no TLS record; later connections answer normally."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TlsAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() does not
        self._listener.close()
        self._thread.join(timeout=scaled(5))

    def _run(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                self._serve(raw, first=self.connections == 1)
            except (OSError, ssl.SSLError):
                pass
            finally:
                raw.close()

    def _serve(self, raw: socket.socket, *, first: bool) -> None:
        raw.settimeout(scaled(10))
        with self._context.wrap_socket(raw, server_side=True) as tls:
            _read(tls)
            tls.sendall(answer(OK))
            _read(tls)
            if first:
                socket.socket.sendall(tls, b"this is not a TLS record\r\n")  # under the TLS layer
                return
            tls.sendall(answer(OK))


def _read(tls: ssl.SSLSocket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        more = tls.recv(4096)
        if not more:
            raise OSError("closed")
        data += more


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, str]]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    yield context, str(ca_file)


async def test_a_tls_error_on_a_reused_connection_is_no_handshake_failure(pki) -> None:
    """The handshake was done an exchange ago: the error is a broken connection, as a reset one
    is, never reported as a refused handshake. It broke after the request was written, so it is
    not sent again on its own (the agent may have it: protocol §20); the next call goes out on a
    fresh connection."""
    context, ca_file = pki
    with TlsAgent(context) as agent:
        transport = await opened(tls=OutboundPolicy(ca_file=ca_file))
        url = f"https://127.0.0.1:{agent.port}/reach"
        try:
            assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
            with pytest.raises(ConnectFailed) as broken:
                await transport.send(url, b"{}", {}, LIMITS)
            assert "handshake" not in broken.value.message
            assert "kept-alive connection closed" in broken.value.message
            assert await transport.send(url, b"{}", {}, LIMITS) == {"ok": True}
            assert agent.connections == 2
        finally:
            await transport.close()


def test_an_idle_connection_is_dropped_before_common_agent_servers_close_it() -> None:
    """uvicorn (and Node) close an idle keep-alive connection after 5 s: a request written at
    that moment is lost with its outcome unknown, so the pool stops reusing one sooner."""
    import uvicorn

    from reachmesh.transport.pool import IDLE_S

    assert uvicorn.Config(app="reachmesh.server:create_app").timeout_keep_alive > IDLE_S
