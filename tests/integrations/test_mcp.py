"""The MCP bridge against the real mcp client: list, call through the Router, live list changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

pytest.importorskip("mcp")

from mcp import Client

from reachmesh.config import RouterConfig
from reachmesh.integrations.mcp import ReachMCP, tool_name
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}


@pytest.fixture
async def bridge() -> AsyncIterator[tuple[RouterServer, str, ReachMCP]]:
    """A Router with one agent, and `reach mcp` over streamable HTTP following it."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = FakeAgent(
            "price-agent", tasks=("query_price",), input_schema={"sku": "string", "qty": "integer?"}
        )
        agent.descriptions["query_price"] = "the current price of a product"
        await agent.start()
        await agent.register(router.url, vectors=False)
        server = ReachMCP(router.url, poll_interval_s=0.05)
        await server.refresh()
        async with AsgiServer(server.streamable_http_app()) as http:
            watcher = asyncio.create_task(server.watch())
            try:
                yield router, f"{http.url}/mcp", server
            finally:
                watcher.cancel()
                await server.aclose()
                await agent.stop()


async def next_change(events: Any) -> None:
    """Wait for the next list_changed event on a listen stream (bounded, never a fixed sleep)."""
    await asyncio.wait_for(anext(aiter(events)), timeout=20)


def test_tool_names_are_the_task_or_a_stable_slug() -> None:
    """Plain task names stay; others get a slug that depends on the task alone."""
    assert tool_name("query_price") == "query_price"
    slug = tool_name("查询价格")
    assert slug == tool_name("查询价格") and slug != tool_name("查询库存")
    assert tool_name("ns:task").startswith("ns_task_")


async def test_list_and_call_through_the_router(bridge) -> None:
    """The tool's schema is the capability's; a call is routed and its result is structured."""
    _, url, _ = bridge
    async with Client(url) as client:
        (tool,) = (await client.list_tools()).tools
        assert tool.name == "query_price" and tool.description == "the current price of a product"
        assert tool.input_schema["required"] == ["sku"]
        assert tool.input_schema["properties"]["qty"] == {"type": "integer"}
        result = await client.call_tool("query_price", {"sku": "SKU-1", "qty": 2})
        assert not result.is_error
        assert result.structured_content == {"agent": "price-agent", "echo": {"sku": "SKU-1", "qty": 2}}
        refused = await client.call_tool("query_price", {"qty": 2})  # the Router checks the schema
        assert refused.is_error


async def test_the_list_follows_the_registry(bridge) -> None:
    """list_changed when an agent registers and when it leaves; a second server keeps names."""
    router, url, server = bridge
    async with Client(url) as client, client.listen(tools_list_changed=True) as events:
        stock = await FakeAgent("stock-agent", tasks=("query_stock",)).start()
        try:
            lease = await stock.register(router.url, vectors=False)
            await next_change(events)
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["query_price", "query_stock"]
            twin = await FakeAgent("a-twin", tasks=("query_stock",)).start()
            await twin.register(router.url, vectors=False)
            await server.refresh()
            assert [t.name for t in (await client.list_tools()).tools] == names
            async with httpx.AsyncClient() as http:
                for agent_id, lease_id in (("stock-agent", lease), ("a-twin", twin.lease_id)):
                    resp = await http.request(
                        "DELETE", f"{router.url}/agents/{agent_id}", headers={"X-Reach-Lease": str(lease_id)}
                    )
                    assert resp.status_code == 204
            await next_change(events)
            assert [t.name for t in (await client.list_tools()).tools] == ["query_price"]
            await twin.stop()
        finally:
            await stock.stop()


def test_building_the_server_leaves_the_process_logging_alone() -> None:
    """MCPServer calls logging.basicConfig; ReachMCP puts the root logger back as it was."""
    import logging

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    ReachMCP("http://127.0.0.1:9")
    assert (list(root.handlers), root.level) == before


async def test_a_non_admin_token_is_named_once_not_every_poll(monkeypatch, caplog) -> None:
    """REACH_TOKEN a caller token: the first read is refused with what to set, and a refusal
    while following the registry is logged once, not once a poll; no web link in either."""
    import logging

    from reachmesh.exceptions import ConfigError

    monkeypatch.setenv("REACH_ADMIN_TOKEN", "mcp-admin-token-1618")
    monkeypatch.setenv("REACH_CALLER_TOKEN", "mcp-caller-token-2718")
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        monkeypatch.setenv("REACH_TOKEN", "mcp-caller-token-2718")
        server = ReachMCP(router.url, poll_interval_s=0.01)
        try:
            with pytest.raises(ConfigError) as refused:
                await server._first_list()
            message = refused.value.message
            assert "admin" in message and "REACH_TOKEN" in message and "HTTP 403" in message
            assert "http" not in message.replace(router.url, "")
            with caplog.at_level(logging.INFO, logger="reachmesh"):
                for _ in range(20):
                    await server.poll()
            said = [r.getMessage() for r in caplog.records if "[reach-mcp]" in r.getMessage()]
            assert len(said) == 1 and "REACH_TOKEN" in said[0], said
        finally:
            await server.aclose()
