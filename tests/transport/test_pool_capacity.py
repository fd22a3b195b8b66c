"""The pool under a burst (issue #34): caps per agent, FIFO waits that time out as the pool's own
error, and an agent whose accept queue is full treated as busy, not broken."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from reachmesh.config import OutboundPolicy
from reachmesh.exceptions import PoolTimeout
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.http import HttpTransport
from tests.helpers import scaled, until

OK = b'{"status": "SUCCESS", "result": {"ok": true}}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), OK)


class OneConnectionAgent:
    """A listening socket with a backlog of one that accepts a single connection and serves every
    request on it once ``gate`` is set: a burst's other connects find its accept queue full."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.gate = threading.Event()
        self.accepted = 0
        self.requests = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn, _ = self.sock.accept()
        self.accepted += 1
        with conn, contextlib.suppress(OSError):
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.requests += 1
                self.gate.wait()
                conn.sendall(ANSWER)

    def close(self) -> None:
        self.gate.set()
        self.sock.close()


@pytest.fixture
def agent() -> Iterator[OneConnectionAgent]:
    found = OneConnectionAgent()
    yield found
    found.close()


async def test_a_full_accept_queue_is_busy_and_the_request_waits_for_a_connection(agent) -> None:
    """The agent serves one connection of ours and its accept queue is full: a second request's
    connect times out. It does not fail (the agent is busy, not broken): it waits for the
    agent's connection and is answered on it once the first answer is in."""
    fillers = []
    transport = HttpTransport(tls=OutboundPolicy())
    await transport.open()
    try:
        url = f"http://127.0.0.1:{agent.port}/reach"
        limits = AttemptLimits(scaled(0.3), scaled(10.0), scaled(20.0))
        first = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        await until(lambda: agent.requests == 1, "the first request at the agent")
        for _ in range(3):  # fill the accept queue (a backlog of 1 holds two) from outside
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", agent.port))
            fillers.append(filler)
        second = asyncio.ensure_future(transport.send(url, b"{}", {}, limits))
        # Three connect timeouts' worth: before the change it had failed within one.
        done, _ = await asyncio.wait({second}, timeout=scaled(0.3) * 3)
        assert not done, "the second request failed instead of waiting for the agent's connection"
        agent.gate.set()
        assert await first == {"ok": True}
        assert await second == {"ok": True}
        assert agent.accepted == 1 and agent.requests == 2
    finally:
        for filler in fillers:
            filler.close()
        await transport.close()


async def test_a_wait_for_a_connection_past_the_ceiling_is_the_pools_own_error(agent) -> None:
    """One connection per agent: a second request waits for it until the attempt's ceiling and
    ends PoolTimeout (nothing sent), not an attempt timeout charged to the agent."""
    transport = HttpTransport(tls=OutboundPolicy(max_connections_per_agent=1))
    await transport.open()
    try:
        url = f"http://127.0.0.1:{agent.port}/reach"
        first = asyncio.ensure_future(
            transport.send(url, b"{}", {}, AttemptLimits(scaled(1.0), scaled(10.0), scaled(20.0)))
        )
        await until(lambda: agent.requests == 1, "the first request at the agent")
        with pytest.raises(PoolTimeout):
            await transport.send(url, b"{}", {}, AttemptLimits(scaled(1.0), scaled(1.0), scaled(0.3)))
        agent.gate.set()
        assert await first == {"ok": True}
        assert agent.accepted == 1 and agent.requests == 1
    finally:
        await transport.close()


async def test_a_connect_to_a_busy_agent_outlasts_the_connect_timeout() -> None:
    """The agent serves a connection of ours (held), and a new connection to it takes longer
    than the connect timeout, as one whose SYN a full accept queue dropped does (the kernel
    sends it again after 1 s). The connect is not cut at the connect timeout: the agent is busy,
    not broken, and the request is answered on the new connection. It was cut, and each new
    connect after a second's hold-off was cut again, until the request ended PoolTimeout."""
    gate = asyncio.Event()
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(served)
        served.append(number)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            if number == 0:
                await gate.wait()
            writer.write(ANSWER)
            await writer.drain()
            await reader.read()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/reach"
    transport = HttpTransport(tls=OutboundPolicy())
    await transport.open()
    pool = transport._pool
    assert pool is not None
    real_dial = pool._dial
    delay_s = scaled(0.5)

    async def slow_dial(target: Any, address: str) -> Any:
        if served:  # every connection after the first: the time a dropped SYN takes
            await asyncio.sleep(delay_s)
        return await real_dial(target, address)

    pool._dial = slow_dial  # type: ignore[method-assign]
    try:
        first = asyncio.ensure_future(
            transport.send(url, b"{}", {}, AttemptLimits(scaled(0.2), scaled(30.0), scaled(30.0)))
        )
        await until(lambda: len(served) == 1, "the first request at the agent")
        second = await transport.send(url, b"{}", {}, AttemptLimits(scaled(0.2), scaled(30.0), scaled(3.0)))
        assert second == {"ok": True}
        assert len(served) == 2
        gate.set()
        assert await first == {"ok": True}
    finally:
        gate.set()
        await transport.close()
        listener.close()


def test_a_connect_cut_by_the_routers_own_stalled_loop_is_tried_again() -> None:
    """uvloop (the Router's loop) runs due timers before it polls for I/O. A loop stalled past a
    connect timeout (a 10,000-call burst arriving) cut connects the kernel had made, and each
    agent was charged connect errors until its breaker opened. A timeout noticed that late now
    means the Router was busy: it connects again, and the request is answered."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWER)
            await writer.drain()
            await reader.read()
        writer.close()

    async def main() -> Any:
        listener = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/reach"
        transport = HttpTransport(tls=OutboundPolicy())
        await transport.open()
        try:
            # Runs once the connect is under way: the loop does nothing else meanwhile.
            asyncio.get_running_loop().call_soon(time.sleep, scaled(0.5))
            limits = AttemptLimits(scaled(0.2), scaled(10.0), scaled(20.0))
            return await transport.send(url, b"{}", {}, limits)
        finally:
            await transport.close()
            listener.close()

    assert uvloop.run(main()) == {"ok": True}


async def test_a_waiter_woken_for_a_connection_keeps_it_from_a_newcomer() -> None:
    """One connection per agent, held; a second call waits for it. The answer frees it and wakes
    the waiter, and in the same loop turn a third call arrives (as a caller's bytes read in the
    same poll would): the connection is the waiter's, first come first served. It was the
    newcomer's, the waiter queued again, so under steady arrivals a lone waiter could wait until
    its ceiling while later calls went ahead."""
    from reachmesh.testing import FakeAgent

    hold = asyncio.Event()
    fake = await FakeAgent("fifo", hold=hold).start()
    transport = HttpTransport(tls=OutboundPolicy(max_connections_per_agent=1))
    await transport.open()
    try:
        pool = transport._pool
        assert pool is not None
        limits = AttemptLimits(scaled(5.0), scaled(20.0), scaled(30.0))

        def send(name: str) -> asyncio.Future[Any]:
            body = b'{"targetTask": "echo", "payload": {"n": "%s"}}' % name.encode()
            return asyncio.ensure_future(transport.send(fake.endpoint, body, {}, limits))

        first = send("first")
        await until(lambda: len(fake.received) == 1, "the first call holds the one connection")
        waiter = send("waiter")
        await until(lambda: pool._waiting, "the second call waiting for the connection")
        newcomer: list[asyncio.Future[Any]] = []
        wake_for = pool.wake_for  # what a released connection calls when someone waits

        def release_as_a_call_arrives(key: Any) -> None:
            if not newcomer:
                newcomer.append(send("newcomer"))  # its first step runs before the woken waiter's
            wake_for(key)

        pool.wake_for = release_as_a_call_arrives  # type: ignore[method-assign]
        hold.set()
        await asyncio.wait_for(asyncio.gather(first, waiter), scaled(20))
        (late,) = newcomer
        await asyncio.wait_for(late, scaled(20))
        assert [r["payload"]["n"] for r in fake.received] == ["first", "waiter", "newcomer"]
    finally:
        await transport.close()
        await fake.stop()
