"""An A2A caller that leaves a plain (not streamed) call stops it, as a ``/reach`` caller does.

Real a2a-sdk behind the export, a raw agent and a raw caller on loopback. The call must stop at
once (the Router closes the agent's connection), no other agent is tried, and the record books
it to the caller (``CALLER_GONE``, attempt outcome ``caller_gone``), judging no agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

pytest.importorskip("a2a")

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.integrations.a2a import A2AExport
from reachmesh.testing import RouterServer, free_port
from tests.helpers import scaled, until
from tests.streaming_agents import Conn, StreamAgent

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}

MESSAGE = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": {"q": "hi"}}]}


def request_of(kind: str, timeout_ms: int) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body) of a blocking SendMessage: the export's own fast path (JSON-RPC,
    A2A 1.0), a2a-sdk's HTTP+JSON binding, and a2a-sdk's A2A 0.3 JSON-RPC."""
    metadata = {"skill": "talk", "timeoutMs": timeout_ms}
    if kind == "jsonrpc":
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": MESSAGE, "metadata": metadata},
        }
        return "/a2a/jsonrpc", {"A2A-Version": "1.0"}, orjson.dumps(body)
    if kind == "rest":
        return (
            "/a2a/rest/message:send",
            {"A2A-Version": "1.0"},
            orjson.dumps({"message": MESSAGE, "metadata": metadata}),
        )
    old = {
        "kind": "message",
        "messageId": "m1",
        "role": "user",
        "parts": [{"kind": "data", "data": {"q": "hi"}}],
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"message": old, "metadata": metadata},
    }
    return "/a2a/jsonrpc", {}, orjson.dumps(body)


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as server:  # type: ignore[arg-type]
        yield server


@pytest.mark.parametrize("kind", ["jsonrpc", "rest", "jsonrpc-0.3"])
async def test_an_a2a_caller_that_leaves_a_plain_call_stops_it(router: RouterServer, kind: str) -> None:
    closed = asyncio.Event()

    async def thinks(conn: Conn) -> None:
        await conn.closed_by_router()
        closed.set()

    agents = [await StreamAgent(name, thinks).start() for name in ("first", "second")]
    records: list[DecisionRecord] = []
    router.app.parts.dispatcher.observers.append(records.append)
    try:
        for agent in agents:
            await agent.register(router.url, max_concurrency=1)
        path, headers, body = request_of(kind, int(scaled(30_000)))
        port = int(router.url.rsplit(":", 1)[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await until(lambda: sum(len(a.conns) for a in agents) == 1, "the call at an agent")
        writer.close()
        async with asyncio.timeout(scaled(1.0)):
            await closed.wait()  # the Router closed the agent's connection within a second
        await until(lambda: records, "the request's record")
    finally:
        for agent in agents:
            await agent.stop()
    record = records[0]
    assert sum(len(a.conns) for a in agents) == 1  # no failover after the caller left
    assert (record.status, record.error_code) == ("INVALID_REQUEST", "CALLER_GONE")
    assert [a.outcome for a in record.attempts] == ["caller_gone"]
    parts = router.app.parts
    for agent in agents:
        assert parts.capacity.inflight(agent.agent_id) == 0
        breaker = parts.breakers._get(agent.agent_id, "talk")
        assert breaker is None or breaker.failures == 0
