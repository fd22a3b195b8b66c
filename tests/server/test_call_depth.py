"""How deep a plain /reach call is while it waits for its agent (issue #39, the hot path).

Each coroutine a waiting call holds costs every call a frame, its making, and a step each time
it waits; the chain is the Router's structure, not a timing, so it is asserted here exactly.
Real Router, a raw agent that answers when the test says, a raw caller on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer
from tests.helpers import raw_post, until
from tests.streaming_agents import Conn, StreamAgent

# The server's lane to the pool's wait for the answer: one coroutine per level.
LANE_CHAIN = ["_serve_lane", "serve_whole", "_serve", "run", "_attempt", "send", "post"]
# A call through uvicorn's ASGI cycle (a body that came after its head), from the app's __call__.
ASGI_CHAIN = ["__call__", "_serve_reach", "handle", "_serve", "run", "_attempt", "send", "post"]
# uvicorn's own, before the app: its cycle and its proxy-headers middleware.
_UVICORN = ["run_asgi", "__call__"]


def _chain(task: asyncio.Task[Any]) -> list[str]:
    """The names of the coroutines ``task`` is waiting in, outermost first."""
    names: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_name)
        coro = coro.cr_await
    return names


@pytest.fixture
async def router(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RouterServer]:
    # uvicorn writes access lines when its logger has a handler, and under pytest it has the
    # capture's: the lane is not taken then. Not here, as in a served Router (access_log off).
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "hasHandlers", lambda: False)
    async with RouterServer(RouterConfig.model_validate({"health": {"enabled": False}})) as server:
        yield server


async def _chain_of_a_call(router: RouterServer, request: bytes) -> list[str]:
    """The chain of a call (``request``, head and body) while its agent thinks; the call is
    then answered, as before."""
    answer = asyncio.Event()

    async def thinks(conn: Conn) -> None:
        await answer.wait()
        await conn.json({"status": "SUCCESS", "result": {"n": 1}})

    agent = await StreamAgent("thinker", thinks).start()
    try:
        await agent.register(router.url)
        port = int(router.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        dispatcher = router.app.parts.dispatcher
        writer.write(request)
        await writer.drain()
        await until(lambda: agent.conns and dispatcher.running == 1, "the call at the agent")
        (task,) = dispatcher._running
        chain = _chain(task)
        answer.set()
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 100"):  # the go-ahead for a body sent already
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
        return chain
    finally:
        await agent.stop()


async def test_a_plain_call_waits_for_its_agent_in_seven_coroutines(router: RouterServer) -> None:
    """The lane's call waited in twelve (serve_whole, _serve_reach, handle,
    _dispatch_until_abandoned, _route_and_forward, run, try_agent, _attempt, _forward, send,
    post, under the server's _serve_lane); now in seven."""
    request = raw_post("/reach", orjson.dumps({"targetTask": "talk", "payload": {}}))
    assert await _chain_of_a_call(router, request) == LANE_CHAIN


async def test_a_call_through_asgi_waits_in_three_coroutines_fewer(router: RouterServer) -> None:
    """A call that takes uvicorn's ASGI cycle (here: one that expects ``100 Continue``): from
    the app's ``__call__`` on, it waited in eleven; now in eight."""
    body = orjson.dumps({"targetTask": "talk", "payload": {}})
    request = raw_post("/reach", body, {"Expect": "100-continue"})
    assert await _chain_of_a_call(router, request) == [*_UVICORN, *ASGI_CHAIN]
