"""A caller that gives a streamed call up through a bridge closes the agent's stream: an MCP
client that cancels its tool call, a LangGraph run that is cancelled, a stream an SDK agent
writes while its caller has gone.

Raw streaming agents on loopback (tests/streaming_agents.py) see the Router close their
connection; the Router's read timeout is long, so only the cancel can close it.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import orjson
import pytest

pytest.importorskip("mcp")
pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph
from mcp import Client

from reachmesh.config import RouterConfig
from reachmesh.integrations.langgraph import reach_node
from reachmesh.integrations.mcp import ReachMCP
from reachmesh.testing import AsgiServer, RouterServer
from tests.helpers import scaled
from tests.streaming_agents import Conn, StreamAgent

pytestmark = pytest.mark.integrations

POLICY = {
    "health": {"enabled": False},
    "embedding": {"backend": "none"},
    "limits": {"loop_lag_ms": 10_000},
    "timeouts": {"read_ms": 120_000},
}


class Held:
    """A streaming agent that sends one chunk, then holds the stream until the Router closes it."""

    def __init__(self) -> None:
        self.first_sent = asyncio.Event()
        self.closed = asyncio.Event()

    async def script(self, conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("once")
        self.first_sent.set()
        await conn.closed_by_router()
        self.closed.set()


async def test_an_mcp_client_that_cancels_a_streamed_tool_call_closes_the_agents_stream() -> None:
    held = Held()
    agent = await StreamAgent("talker", held.script).start()
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        await agent.register(router.url)
        server = ReachMCP(router.url, poll_interval_s=0.05)
        await server.refresh()
        got_first = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            got_first.set()

        try:
            async with AsgiServer(server.http_app()) as http, Client(f"{http.url}/mcp") as client:
                call = asyncio.ensure_future(client.call_tool("talk", {}, progress_callback=on_progress))
                await asyncio.wait_for(got_first.wait(), scaled(10))
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
                await asyncio.wait_for(held.closed.wait(), scaled(2))
        finally:
            await server.aclose()
            await agent.stop()


class Talk(TypedDict, total=False):
    result: Any
    reach_status: str


async def test_a_cancelled_langgraph_run_closes_the_agents_stream() -> None:
    held = Held()
    agent = await StreamAgent("talker", held.script).start()
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        await agent.register(router.url)
        builder = StateGraph(Talk)
        builder.add_node("talk", reach_node("talk", inputs=[], stream=True, router_url=router.url))
        builder.add_edge(START, "talk")
        builder.add_edge("talk", END)
        graph = builder.compile()
        chunks: list[Any] = []

        async def run() -> None:
            async for event in graph.astream({}, stream_mode="custom"):
                chunks.append(event)

        try:
            task = asyncio.ensure_future(run())
            await asyncio.wait_for(held.first_sent.wait(), scaled(10))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(held.closed.wait(), scaled(2))
        finally:
            await agent.stop()


async def test_an_sdk_agent_closes_a_waiting_generator_when_its_caller_goes_away() -> None:
    from reachmesh import AgentConfig, ReachAgent, ReachClient
    from reachmesh.ports import free_port

    thinking = asyncio.Event()
    closed = asyncio.Event()
    never = asyncio.Event()
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        port = free_port()
        mapping = {
            "agent": {
                "id": "thinker",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "think"}],
            },
            "router": {"url": router.url},
        }
        agent = ReachAgent(AgentConfig.from_mapping(mapping, env={}))

        @agent.capability("think")
        async def think(payload: dict[str, Any]) -> Any:
            try:
                yield "first"
                thinking.set()
                await never.wait()  # the model thinks before its next token
                yield "never sent"
            finally:
                closed.set()

        await agent.start()
        try:
            async with (
                ReachClient(router.url) as client,
                client.stream("think", {}, timeout_ms=120_000) as answer,
            ):
                async for _ in answer:
                    break
            await asyncio.wait_for(thinking.wait(), scaled(5))
            await asyncio.wait_for(closed.wait(), scaled(2))
        finally:
            never.set()
            await agent.stop()


async def test_a_router_caller_that_leaves_closes_an_imported_a2a_agents_stream() -> None:
    """An ``a2a`` agent (as ``reach a2a import`` registers one) streaming an answer: the Router
    caller leaves after the first chunk and the Router closes its SendStreamingMessage
    connection to the agent."""
    import httpx

    from reachmesh import ReachClient

    closed = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        update = {
            "artifactUpdate": {
                "taskId": "t",
                "contextId": "c",
                "artifact": {"artifactId": "a", "parts": [{"text": "Hel"}]},
            }
        }
        await conn.write(b"data: " + orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": update}) + b"\n\n")
        await conn.closed_by_router()
        closed.set()

    agent = await StreamAgent("talker", script).start()
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        profile = {
            "id": "talker",
            "network": {"protocol": "a2a", "endpoint": agent.endpoint},
            "capabilities": [{"task": "talk"}],
            "health_check": {"interval_seconds": 300, "timeout_ms": 5000},
            "managed": True,
        }
        async with httpx.AsyncClient() as http:
            assert (await http.post(f"{router.url}/agents", json=profile)).status_code in (200, 201)
        try:
            async with (
                ReachClient(router.url) as client,
                client.stream("talk", {}, timeout_ms=120_000) as answer,
            ):
                async for chunk in answer:
                    assert chunk == "Hel"
                    break
            await asyncio.wait_for(closed.wait(), scaled(2))
            assert b"SendStreamingMessage" in agent.conns[0].body
        finally:
            await agent.stop()
