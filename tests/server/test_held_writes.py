"""Answers and requests held to the end of the loop's turn (reachmesh.outbox), on the wire.

The Router runs on uvloop, which runs I/O callbacks between the turn that held a write and the
outbox's call that makes it: what arrives then (a caller's FIN, an agent's close) must not make a
held write vanish. These tests force a held write with ``outbox(loop).inflight`` (another
exchange under way) and act at the moment it is held.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
import pytest
import uvloop

from reachmesh.config import RouterConfig
from reachmesh.outbox import Outbox, outbox
from reachmesh.server.h1 import _OneWrite
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until
from tests.server.test_response_writes import Answers, post_reach
from tests.streaming_agents import Conn, StreamAgent


async def _read_to_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), scaled(10)):
        data += chunk
    return data


def test_an_answer_held_when_the_callers_fin_arrives_still_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that half-closes after its request (``shutdown(SHUT_WR)``) while the answer is
    held: uvloop reads the FIN before the outbox writes, and uvicorn closes on it. The held
    answer leaves first, as it did when it was written at once."""
    hold = Outbox.hold

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        async with RouterServer(RouterConfig()) as router:
            agent = await FakeAgent("a").start()
            try:
                await agent.register(router.url, vectors=False)
                sock = socket.create_connection(("127.0.0.1", router.port))
                sock.setblocking(False)

                def fin_when_held(self: Outbox, writer: Any, held_on: asyncio.AbstractEventLoop) -> None:
                    hold(self, writer, held_on)
                    if isinstance(writer, _OneWrite):
                        sock.shutdown(socket.SHUT_WR)

                monkeypatch.setattr(Outbox, "hold", fin_when_held)
                box = outbox(loop)
                box.inflight += 1  # another exchange under way: the answer is held
                try:
                    await loop.sock_sendall(sock, post_reach())
                    data = await _read_to_eof(sock)
                finally:
                    box.inflight -= 1
                    sock.close()
                assert box.inflight == 0
                return data
            finally:
                await agent.stop()

    data = uvloop.run(main())
    answers = Answers()
    answers.parser.feed_data(data)
    assert [status for status, _, _ in answers.done] == [200]


def _reach(n: int, extra: bytes = b"", task: str = "echo") -> bytes:
    call = orjson.dumps({"targetTask": task, "payload": {"n": n}})
    return (
        b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(call)
        + call
    )


async def _read_answers(reader: asyncio.StreamReader, count: int) -> Answers:
    answers = Answers()
    while len(answers.done) < count:
        chunk = await asyncio.wait_for(reader.read(65536), scaled(10))
        assert chunk, f"connection closed after {len(answers.done)} of {count} responses"
        answers.parser.feed_data(chunk)
    return answers


def _waits_for_a_body(router: RouterServer) -> bool:
    cycles = [getattr(c, "cycle", None) for c in router._server.server_state.connections]
    return any(cycle is not None and not cycle.response_complete for cycle in cycles)


def _echoed(body: bytes) -> Any:
    return orjson.loads(body)["result"]["echo"]["n"]


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_held_answers_keep_their_order_among_health_checks_split_bodies_and_streams(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With another exchange under way, every /reach answer and request is held to the end of
    the turn. On one keep-alive connection, pipelined calls, a health check (uvicorn's cycle), a
    streamed call (the raw stream) and a call whose body comes after its head are each answered
    once, whole and in order; then ``Connection: close`` ends it. On both loops: uvloop (the
    Router's) polls for I/O between a held write and the outbox's call."""
    holds: list[str] = []
    hold = Outbox.hold

    def counted(self: Outbox, writer: Any, loop: asyncio.AbstractEventLoop) -> None:
        holds.append(type(writer).__name__)
        hold(self, writer, loop)

    monkeypatch.setattr(Outbox, "hold", counted)

    async def talk(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk({"text": "hi"})
        await conn.done()

    async def main() -> list[Answers]:
        box = outbox(asyncio.get_running_loop())
        async with RouterServer(RouterConfig.model_validate({"health": {"enabled": False}})) as router:
            agent, talker = await FakeAgent("a").start(), await StreamAgent("s", talk).start()
            try:
                await agent.register(router.url, vectors=False)
                await talker.register(router.url)
                box.inflight += 1  # another exchange under way, for the whole test
                reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
                health = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
                stream = _reach(3, b"Accept: text/event-stream\r\n", task="talk")
                writer.write(_reach(1) + _reach(2) + health + stream + _reach(4))
                first = await _read_answers(reader, 5)
                split = _reach(5)
                cut = split.index(b"\r\n\r\n") + 4
                writer.write(split[:cut])  # the body after its head: uvicorn's cycle, not the lane
                await until(lambda: _waits_for_a_body(router), "the Router read the head alone")
                writer.write(split[cut:] + _reach(6, b"Connection: close\r\n"))
                second = await _read_answers(reader, 2)
                assert await asyncio.wait_for(reader.read(1), scaled(10)) == b""
                writer.close()
                box.inflight -= 1
                assert box.inflight == 0
                return [first, second]
            finally:
                await agent.stop()
                await talker.stop()

    first, second = run(main())
    statuses = [status for status, _, _ in first.done + second.done]
    assert statuses == [200] * 7
    assert [_echoed(first.done[i][2]) for i in (0, 1, 4)] == [1, 2, 4]
    assert b'"status"' in first.done[2][2]  # the health check's own answer, in its place
    assert b"event: done" in first.done[3][2]  # the stream, whole, between the calls
    assert [_echoed(body) for _, _, body in second.done] == [5, 6]
    assert "_OneWrite" in holds and "_Conn" in holds  # answers and requests were held


async def test_a_lone_caller_has_nothing_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls one after another (c1), with no other exchange under way: no request to the agent
    and no answer to the caller waits for the end of the turn, and the count stays at 0."""
    holds: list[Any] = []
    monkeypatch.setattr(Outbox, "hold", lambda self, writer, loop: holds.append(writer))
    box = outbox(asyncio.get_running_loop())
    async with RouterServer(RouterConfig.model_validate({"health": {"enabled": False}})) as router:
        agent = await FakeAgent("a").start()
        try:
            await agent.register(router.url, vectors=False)
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            for n in range(5):
                writer.write(_reach(n))
                answers = await _read_answers(reader, 1)
                assert _echoed(answers.done[0][2]) == n
                assert box.inflight == 0
            writer.close()
        finally:
            await agent.stop()
    assert holds == []
