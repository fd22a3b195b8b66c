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

from agent_reach.config import RouterConfig
from agent_reach.testing import AsgiServer, FakeAgent, RouterServer, free_port
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
                args=["-m", "agent_reach", "mcp", "--router", router.url, "--poll-interval", "0.2"],
                env=child_env(),
                cwd=ROOT,
            )
            async with Client(params) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
                result = await client.call_tool("echo", {"text": "over stdio"})
                assert result.structured_content == {"agent": "echo-agent", "echo": {"text": "over stdio"}}
        finally:
            await agent.stop()


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
            *("-m", "agent_reach", "a2a", "import", agent.url, "--router", router.url, "--id", "summariser"),
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
