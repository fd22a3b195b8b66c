"""Sending a dropped SYN again sooner than the kernel (issue #34): a connect to an agent whose
accept queue is full is begun again after a few times the agent's quickest connect, not after
Linux's 1 s resend, and never charged to the agent."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from reachmesh.config import OutboundPolicy
from reachmesh.transport import dial
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.dial import RESEND_CEILING_S, RESEND_FLOOR_S, WINDOW_S, ConnectTimes
from reachmesh.transport.http import HttpTransport
from tests.helpers import scaled, until

OK = b'{"status": "SUCCESS", "result": {"ok": true}}'


def answer(keep_alive: bool) -> bytes:
    close = b"" if keep_alive else b"Connection: close\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
    return head % (close, len(OK)) + OK


def total_retransmits(sock: socket.socket) -> int:
    """The SYNs and segments the kernel sent again on ``sock`` (``tcpi_total_retrans``)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 100)[0])


def queued(port: int) -> socket.socket:
    """A connection that sits in the listener's accept queue (its handshake done)."""
    filler = socket.create_connection(("127.0.0.1", port))
    filler.setblocking(False)
    return filler


class FullQueueAgent:
    """A listener with a backlog of 0 (its accept queue holds one connection) that accepts only
    as many connections as the test allows, and answers each one's request."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.allowed = threading.Semaphore(0)
        self.requests = 0
        self.keep_alive = False
        self.kept: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            while self.allowed.acquire():
                conn, _ = self.sock.accept()
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                conn.close()
                return
            data += chunk
        self.requests += 1
        conn.sendall(answer(self.keep_alive))
        if self.keep_alive:
            self.kept.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.allowed.release()
        for conn in self.kept:
            conn.close()


@pytest.fixture
def agent() -> Iterator[FullQueueAgent]:
    found = FullQueueAgent()
    yield found
    found.close()


async def test_a_connect_to_a_full_accept_queue_is_sent_again_not_left_to_the_kernel(agent) -> None:
    """The agent has taken a quick connect of ours, then its accept queue fills. A new request's
    SYN is dropped: the pool begins the connect again (a new socket, a new SYN) every resend
    interval while the queue stays full, and the first one after the agent catches up gets in.
    The connection the request is answered on never waited for the kernel's resend (1 s later):
    no SYN of its was sent twice. Nothing is charged to the agent: the request is answered.

    Before the change the dropped SYN waited for the kernel, and the connection the request was
    answered on had its SYN sent twice."""
    transport = HttpTransport(tls=OutboundPolicy())
    await transport.open()
    pool = transport._pool
    assert pool is not None
    url = f"http://127.0.0.1:{agent.port}/reach"
    limits = AttemptLimits(scaled(10.0), scaled(10.0), scaled(20.0))
    fillers: list[socket.socket] = []
    try:
        agent.allowed.release()
        assert await transport.send(url, b"{}", {}, limits) == {"ok": True}  # a quick connect, learnt
        fillers.append(queued(agent.port))  # the accept queue is full from here
        agent.keep_alive = True
        second = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        await until(lambda: getattr(pool, "resends", 0) >= 2, "the dropped connect begun again twice")
        assert not second.done()
        fillers.pop().close()
        agent.allowed.release()  # the agent takes the filler (it reads its end) ...
        agent.allowed.release()  # ... and then the request's connection
        assert await second == {"ok": True}
        assert agent.requests == 2
        (conn,) = [c for idle in pool._idle.values() for c in idle]
        assert conn.transport is not None
        assert total_retransmits(conn.transport.get_extra_info("socket")) == 0
    finally:
        for filler in fillers:
            filler.close()
        await transport.close()


async def test_an_unanswered_connect_is_closed_and_said_so(agent) -> None:
    """With the accept queue full, a connect with a resend interval ends None (its socket
    closed) rather than wait for the kernel's resend."""
    filler = queued(agent.port)
    loop = asyncio.get_running_loop()
    try:
        assert await dial.connect(loop, "127.0.0.1", agent.port, 0.05) is None
    finally:
        filler.close()


async def test_a_connect_the_loop_has_not_seen_complete_is_kept(agent, monkeypatch) -> None:
    """The resend comes due before the loop has reported the socket writable (uvloop runs due
    timers before it polls; here the loop never reports it): a connect the kernel has completed
    is kept, not closed and begun again. The kernel's word decides."""
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "add_writer", lambda *args: None)
    monkeypatch.setattr(loop, "remove_writer", lambda *args: False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", agent.port))
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLOUT)
        assert poller.poll(int(scaled(5.0) * 1000)), "the kernel completed the connect"
        assert await dial._answered(loop, sock, 0.0) == 0
    finally:
        sock.close()


async def test_a_connect_the_kernel_has_not_completed_is_given_up(agent) -> None:
    """With the accept queue full, the resend comes due and the kernel says the connect is not
    made: None, for the caller to connect again."""
    filler = queued(agent.port)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", agent.port))
        assert await dial._answered(loop, sock, 0.05) is None
    finally:
        sock.close()
        filler.close()


async def test_a_refused_connect_is_a_refusal() -> None:
    """A closed port: ConnectionRefusedError (which opens a breaker at once), as before."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ConnectionRefusedError):
        await dial.connect(asyncio.get_running_loop(), "127.0.0.1", port, 0.05)


def test_the_resend_interval_is_a_few_times_the_quickest_connect_within_bounds() -> None:
    times = ConnectTimes()
    assert times.resend_after("lan") is None  # nothing known: the kernel's resend
    times.learn("lan", 0.0002, now=0.0)
    assert times.resend_after("lan") == RESEND_FLOOR_S
    times.learn("lan", 0.080, now=1.0)  # a slower one does not raise the quickest
    assert times.resend_after("lan") == RESEND_FLOOR_S
    times.learn("far", 0.200, now=0.0)  # 4 x 200 ms is past the ceiling: the kernel's resend
    assert times.resend_after("far") is None
    times.learn("mid", 0.050, now=0.0)
    assert times.resend_after("mid") == pytest.approx(0.2)
    assert RESEND_FLOOR_S <= 0.2 <= RESEND_CEILING_S
    times.learn("lan", 0.300, now=WINDOW_S + 1.0)  # the window passed: the route got slower
    assert times.resend_after("lan") is None
