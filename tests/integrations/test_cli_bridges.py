"""The bridges' commands as processes: `reach mcp` over stdio, `reach a2a import`."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import pytest

pytest.importorskip("mcp")
pytest.importorskip("a2a")

from mcp import Client, StdioServerParameters

from reachmesh.config import RouterConfig
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer, free_port
from tests.helpers import scaled, until
from tests.integrations.test_a2a import ScriptedA2AAgent, a2a_agent_app
from tests.procs import ROOT

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}


async def test_reach_mcp_over_stdio() -> None:
    """An MCP client launches `reach mcp`, lists the Router's tool and calls it through the Router."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = await FakeAgent("echo-agent", tasks=("echo",), input_schema={"text": "string"}).start()
        try:
            await agent.register(router.url, vectors=False)
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "reachmesh", "mcp", "--router", router.url, "--poll-interval", "0.2"],
                env=child_env(),
                cwd=ROOT,
            )
            async with Client(params) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
                result = await client.call_tool("echo", {"text": "over stdio"})
                assert result.structured_content == {"agent": "echo-agent", "echo": {"text": "over stdio"}}
        finally:
            await agent.stop()


async def test_reach_mcp_over_stdio_announces_a_new_agent() -> None:
    """A handshake-era (2025-11-25) client of `reach mcp` over stdio, at its default poll
    interval (1 s), gets notifications/tools/list_changed after an agent registers.

    MCP 2025-11-25, server/tools: "When the list of available tools changes, servers that
    declared the listChanged capability SHOULD send a notification"; stdio declares it.
    """
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        first = await FakeAgent("echo-agent", tasks=("echo",)).start()
        late = await FakeAgent("late-agent", tasks=("late_task",)).start()
        changed = asyncio.Event()

        async def on_message(message: object) -> None:
            method = getattr(getattr(message, "root", message), "method", None)
            if method == "notifications/tools/list_changed":
                changed.set()

        try:
            await first.register(router.url, vectors=False)
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "reachmesh", "mcp", "--router", router.url],
                env=child_env(),
                cwd=ROOT,
            )
            async with Client(params, mode="legacy", message_handler=on_message) as client:
                assert client.session.initialize_result is not None
                tools = client.session.initialize_result.capabilities.tools
                assert tools is not None and tools.list_changed is True
                assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
                await late.register(router.url, vectors=False)
                # One poll interval, a fetch and a line over stdio; the Router shares this loop.
                await asyncio.wait_for(changed.wait(), timeout=scaled(5))
                assert [t.name for t in (await client.list_tools()).tools] == ["echo", "late_task"]
        finally:
            await first.stop()
            await late.stop()


async def test_reach_a2a_import_registers_the_card() -> None:
    """`reach a2a import URL` prints the registration; the Router lists a managed a2a agent."""
    port = free_port()
    app = a2a_agent_app(f"http://127.0.0.1:{port}", ScriptedA2AAgent())
    async with (
        AsgiServer(app, port=port) as agent,
        RouterServer(RouterConfig.model_validate(POLICY)) as router,
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "reachmesh", "a2a", "import", agent.url, "--router", router.url, "--id", "summariser"),
            *("--max-concurrency", "3"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=ROOT,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        assert "imported summariser (summarise)" in err.decode()
        assert json.loads(out)["agentId"] == "summariser"
        async with httpx.AsyncClient(base_url=router.url) as http:
            status = (await http.get("/admin/agents/summariser")).json()
        assert status["protocol"] == "a2a" and status["managed"] is True
        assert status["endpoint"] == f"{agent.url}/rpc"
        assert status["capacity"] == 3  # an A2A card cannot say it; the import does (#34)


async def test_reach_mcp_over_http_wants_its_bearer_token() -> None:
    """`reach mcp --http` with REACH_MCP_TOKEN: 401 without it, the tools with it; and beyond
    loopback without a token it refuses to start, since it calls the Router with REACH_TOKEN."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = await FakeAgent("echo-agent", tasks=("echo",), input_schema={"text": "string"}).start()
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "reachmesh", "mcp", "--router", router.url, "--http", str(port)),
            env={**child_env(), "REACH_MCP_TOKEN": "mcp-client-token-42"},
            cwd=ROOT,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await agent.register(router.url, vectors=False)
            url = f"http://127.0.0.1:{port}/mcp"
            async with httpx.AsyncClient(timeout=scaled(10)) as http:

                async def answered() -> httpx.Response | None:
                    try:
                        return await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                    except httpx.ConnectError:
                        return None  # not listening yet

                # A process importing mcp on a loaded 2-core machine may take a while to listen.
                refused = await until(answered, f"`reach mcp --http` to listen on {url}", within=60)
                assert refused.status_code == 401
            import httpx2  # the HTTP client the mcp package itself uses
            from mcp.client.streamable_http import streamable_http_client

            authorized = httpx2.AsyncClient(
                headers={"Authorization": "Bearer mcp-client-token-42"}, timeout=httpx2.Timeout(30)
            )
            async with Client(streamable_http_client(url, http_client=authorized)) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
        finally:
            proc.terminate()
            await proc.wait()
            await agent.stop()
    exposed = await asyncio.create_subprocess_exec(
        sys.executable,
        *(
            "-m",
            "reachmesh",
            "mcp",
            "--router",
            "http://127.0.0.1:9",
            "--http",
            "7999",
            "--host",
            "0.0.0.0",
        ),
        env={k: v for k, v in child_env().items() if k != "REACH_MCP_TOKEN"},
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(exposed.communicate(), 30)
    assert exposed.returncode != 0
    assert b"REACH_MCP_TOKEN" in err and b"Traceback" not in err


async def test_reach_mcp_with_a_non_admin_token_says_what_it_needs_and_stops(monkeypatch) -> None:
    """One `error:` line naming the admin REACH_TOKEN and exit 1: no 403 logged every second."""
    monkeypatch.setenv("REACH_ADMIN_TOKEN", "bridge-admin-token-1618")
    monkeypatch.setenv("REACH_CALLER_TOKEN", "bridge-caller-token-2718")
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "reachmesh", "mcp", "--router", router.url),
            env={**child_env(), "REACH_TOKEN": "bridge-caller-token-2718"},
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1, (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: reach mcp reads "), lines
    assert "admin token" in lines[0] and "REACH_TOKEN" in lines[0] and "mozilla" not in lines[0]
