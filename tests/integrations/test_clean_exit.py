"""A script using a bridge's own client exits cleanly: no "Unclosed client session" at the end."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("autogen_agentchat")

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

pytestmark = pytest.mark.integrations

ROOT = Path(__file__).resolve().parents[2]
POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}

LANGGRAPH = """
import asyncio
from typing import Any, TypedDict
from langgraph.graph import END, START, StateGraph
from reachmesh.integrations.langgraph import reach_node

class S(TypedDict, total=False):
    n: int
    result: Any
    reach_status: str

graph = StateGraph(S)
graph.add_node("echo", reach_node("echo", inputs=["n"]))
graph.add_edge(START, "echo")
graph.add_edge("echo", END)
compiled = graph.compile()
for run in range(2):  # two asyncio.run calls: a client per loop, each closed with it
    print(asyncio.run(compiled.ainvoke({"n": run}))["reach_status"])
"""

AUTOGEN = """
import asyncio
from autogen_core import CancellationToken
from reachmesh.integrations.autogen import router_tools

async def make():
    return await router_tools()

tools = asyncio.run(make())
for run in range(2):  # the tools called from two more loops: a client per loop
    print(asyncio.run(tools[0].run_json({"n": run}, CancellationToken())))
"""


@pytest.mark.parametrize("script", [LANGGRAPH, AUTOGEN], ids=["langgraph", "autogen"])
async def test_a_bridge_closes_the_client_it_made(script: str) -> None:
    """The node or tools made their own ReachClient, one per event loop (a second
    ``asyncio.run`` works, as LangGraph's does), each closed when its loop ends."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = await FakeAgent("echo-1", result={"ok": True}).start()
        try:
            await agent.register(router.url)
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                script,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "REACH_ROUTER_URL": router.url},
                cwd=ROOT,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            await agent.stop()
    assert proc.returncode == 0, err.decode()
    assert "Unclosed" not in err.decode(), err.decode()
    # Both runs answered, the second from a loop the first client was not made in.
    assert out.decode().count("SUCCESS") + out.decode().count("'ok': True") == 2, out.decode()
