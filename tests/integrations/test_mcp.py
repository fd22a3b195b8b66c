"""The MCP bridge against the real mcp client: list, call through the Router, live list changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

pytest.importorskip("mcp")

from mcp import Client
from mcp.types import TextContent

from reachmesh.config import RouterConfig
from reachmesh.integrations.mcp import ReachMCP, tool_name
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer
from tests.helpers import scaled

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
        async with AsgiServer(server.http_app()) as http:
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


async def test_a_handshake_client_gets_list_changed_over_http(bridge) -> None:
    """A client on the initialize handshake (2025-11-25) hears of a new agent on its session.

    MCP 2025-11-25, server/tools: "When the list of available tools changes, servers that
    declared the listChanged capability SHOULD send a notification". The README promises it to
    older clients "on the session"; it must come within 2 s of the registration.
    """
    router, url, server = bridge
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if getattr(getattr(message, "root", message), "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with Client(url, mode="legacy", message_handler=on_message) as client:
        assert client.session.initialize_result is not None
        capabilities = client.session.initialize_result.capabilities
        assert capabilities.tools is not None and capabilities.tools.list_changed is True
        assert [t.name for t in (await client.list_tools()).tools] == ["query_price"]
        stock = await FakeAgent("stock-agent", tasks=("query_stock",)).start()
        try:
            await stock.register(router.url, vectors=False)
            await asyncio.wait_for(changed.wait(), timeout=scaled(5))
            assert [t.name for t in (await client.list_tools()).tools] == ["query_price", "query_stock"]
            assert server.sessions == 1
        finally:
            await stock.stop()
    # Held while open, let go when the client leaves: the bridge does not keep dead sessions.
    deadline = asyncio.get_running_loop().time() + 10
    while server.sessions and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - a count, not an event
        await asyncio.sleep(0.02)
    assert server.sessions == 0


async def test_server_info_names_the_bridge_and_its_version(bridge) -> None:
    """MCP schema, Implementation: "version: string" is required; an empty one says nothing."""
    from reachmesh import __version__

    _, url, _ = bridge
    async with Client(url, mode="legacy") as client:
        assert client.session.initialize_result is not None
        info = client.session.initialize_result.server_info
        assert info.name == "agent-reach" and info.version == __version__


async def test_an_unknown_tool_is_invalid_params(bridge) -> None:
    """MCP 2025-11-25, server/tools, Error Handling: protocol errors are for "Unknown tools",
    and the example answers one with code -32602 (invalid params), not an isError result."""
    from mcp import MCPError

    _, url, _ = bridge
    for mode in ("legacy", "auto"):
        async with Client(url, mode=mode) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("no_such_tool", {})
            assert caught.value.code == -32602 and "no_such_tool" in caught.value.message


async def test_header_values_lose_surrounding_whitespace(bridge) -> None:
    """RFC 9110 §5.5: "a field parsing implementation MUST exclude such whitespace prior to
    evaluating the field value": `Mcp-Name:   query_price  ` names the tool in the body."""
    _, url, _ = bridge
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "query_price", "arguments": {"sku": "SKU-9"}, "_meta": meta},
    }
    # Written by hand: HTTP client libraries refuse to send such a value at all.
    answer = await raw_post(url, body, {"Mcp-Method": "tools/call", "Mcp-Name": "   query_price  "})
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b'"SKU-9"' in answer and b'"error"' not in answer
    mismatch = await raw_post(url, body, {"Mcp-Method": "tools/call", "Mcp-Name": "  other_tool "})
    assert mismatch.startswith(b"HTTP/1.1 400") and b"-32020" in mismatch


async def raw_post(url: str, body: dict[str, Any], extra: dict[str, str]) -> bytes:
    """POST ``body`` over a plain socket with headers sent byte for byte; the whole answer."""
    parts = urlsplit(url)
    payload = orjson.dumps(body)
    head = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        "MCP-Protocol-Version: 2026-07-28",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *(f"{name}:{value}" for name, value in extra.items()),
    ]
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


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


async def test_progress_notifications_carry_a_streaming_agents_chunks() -> None:
    """A call with a progress token is streamed: each chunk arrives as a progress notification
    while the agent still talks (its last chunk waits until the client has the first)."""
    from reachmesh import AgentConfig, ReachAgent
    from reachmesh.ports import free_port

    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        port = free_port()
        agent = ReachAgent(
            AgentConfig.from_mapping(
                {
                    "agent": {
                        "id": "storyteller",
                        "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                        "capabilities": [{"task": "story"}],
                    },
                    "router": {"url": router.url},
                },
                env={},
            )
        )
        client_has_first = asyncio.Event()

        @agent.capability("story")
        async def story(payload: dict[str, Any]) -> Any:
            yield "once"
            await client_has_first.wait()
            yield {"then": "the end"}

        await agent.start()
        server = ReachMCP(router.url, poll_interval_s=0.05)
        await server.refresh()
        notes: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append((progress, message))
            client_has_first.set()

        try:
            async with AsgiServer(server.http_app()) as http, Client(f"{http.url}/mcp") as client:
                result = await asyncio.wait_for(
                    client.call_tool("story", {}, progress_callback=on_progress), timeout=scaled(20)
                )
                plain = await client.call_tool("story", {})  # no token: one whole answer
        finally:
            await server.aclose()
            await agent.stop()
    assert notes == [(1, "once"), (2, '{"then":"the end"}')]
    assert not result.is_error
    assert result.structured_content == {"result": ["once", {"then": "the end"}]}
    assert plain.structured_content == {"result": ["once", {"then": "the end"}]}


async def test_a_router_list_with_one_router_down_still_lists_and_calls() -> None:
    """`reach mcp --router DOWN,UP`: the catalogue is read from, and calls go to, the one that
    takes the connection (#38)."""
    from reachmesh.testing import free_port

    down = f"http://127.0.0.1:{free_port()}"
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = FakeAgent("price", tasks=("query_price",))
        await agent.start()
        try:
            await agent.register(router.url, vectors=False)
            server = ReachMCP(f"{down},{router.url}", poll_interval_s=0.05)
            try:
                assert await server.refresh()
                assert list(server.tools) == [tool_name("query_price")]
                result = await server.call_tool(tool_name("query_price"), {"sku": "A-1"})
                assert not result.is_error, result
            finally:
                await server.aclose()
        finally:
            await agent.stop()


async def test_a_full_agent_behind_the_bridge_is_busy_not_broken() -> None:
    """An agent with max_concurrency 1 holds its one call, and the Router queues none more: a
    second tool call is an error result with OVERLOADED and its Retry-After, in the structured
    content and in the text a model reads; the agent's breaker stays closed."""
    policy = {
        **POLICY,
        "limits": {"loop_lag_ms": 10_000, "max_queued_per_agent": 0},
        # The first call is held at the agent across a second tool call: the default read timeout
        # (3 s, not scaled; a tool call cannot ask another) must not end it first on a busy machine.
        "timeouts": {"read_ms": int(scaled(20_000))},
    }
    async with RouterServer(RouterConfig.model_validate(policy)) as router:
        agent = FakeAgent("price", tasks=("query_price",))
        agent.max_concurrency = 1
        agent.hold = asyncio.Event()
        await agent.start()
        server = ReachMCP(router.url, poll_interval_s=0.05)
        try:
            await agent.register(router.url, vectors=False)
            await server.refresh()
            async with AsgiServer(server.http_app()) as http, Client(f"{http.url}/mcp") as client:
                first = asyncio.ensure_future(client.call_tool("query_price", {"sku": "A-1"}))
                loop = asyncio.get_running_loop()
                end = loop.time() + scaled(10)
                while not agent.received:
                    assert loop.time() < end
                    await asyncio.sleep(0.02)
                second = await asyncio.wait_for(client.call_tool("query_price", {"sku": "A-2"}), scaled(10))
                agent.hold.set()
                assert not (await asyncio.wait_for(first, scaled(10))).is_error
            assert second.is_error
            detail = second.structured_content or {}
            assert detail["status"] == "OVERLOADED" and detail["error"]["retryAfterSeconds"] == 1
            (text,) = second.content
            assert isinstance(text, TextContent)
            assert text.text.startswith("OVERLOADED: ") and "try again in 1 s" in text.text
            async with httpx.AsyncClient() as admin:
                (row,) = (await admin.get(f"{router.url}/admin/agents")).json()
            assert row["circuit"] == "closed"
        finally:
            agent.hold.set()
            await server.aclose()
            await agent.stop()


async def test_a_body_over_the_bound_is_refused_before_it_is_read(bridge) -> None:
    """The SDK reads each POST whole: the bridge answers 413 to a declared size over its bound
    without waiting for a byte of the body, and to a chunked body once it passes the bound,
    and still serves calls within it."""
    _, url, server = bridge
    async with AsgiServer(server.http_app(max_body_bytes=4096)) as http:
        parts = urlsplit(f"{http.url}/mcp")
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
        )
        # Declared at 3 GB and never sent: the answer comes from the headers alone.
        declared = await _exchange(parts, (head + "Content-Length: 3000000000\r\n\r\n").encode())
        assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
        assert b"PAYLOAD_TOO_LARGE" in declared and b"4096 bytes" in declared
        # Chunked, no length: refused once 4096 bytes have come, though more would follow.
        chunk = b"%x\r\n%s\r\n" % (1000, b" " * 1000)
        streamed = await _exchange(parts, (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunk * 5)
        assert streamed.startswith(b"HTTP/1.1 413"), streamed[:200]
    # The fixture's bridge (the default bound) still calls through.
    async with Client(url) as client:
        result = await client.call_tool("query_price", {"sku": "SKU-1"})
    assert not result.is_error


async def _exchange(parts: Any, request: bytes) -> bytes:
    """Send ``request`` and read what comes back until the server closes (bounded)."""
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=scaled(10))
    finally:
        writer.close()
