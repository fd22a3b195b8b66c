"""What each bridge adds, at the median, over the native path to the same agent.

    .venv/bin/python bench/bridges.py [--calls 400] [--rounds 3] [--json PATH]

One process, one event loop: a Router on loopback, a Reach agent (FakeAgent, aiohttp) and a
minimal A2A agent (aiohttp too, so that only the protocol differs), called one request at a
time (c1). Every path is measured in each round, interleaved, and the medians of the rounds'
medians are printed with the difference to the native path. Pairs:

- LangGraph: a one-node graph (``reach_node``) vs ``ReachClient.call``;
- AutoGen: ``ReachTool.run_json`` (what AssistantAgent calls) vs ``ReachClient.call``;
- A2A export: JSON-RPC ``SendMessage`` to the Router's A2A endpoint vs ``POST /reach``, both
  over the same aiohttp session; also the real a2a-sdk client, for information;
- A2A import: the Router forwarding to an A2A agent vs to a Reach agent (same aiohttp server);
- MCP: ``ReachMCP.call_tool`` (the bridge's own work) vs ``ReachClient.call``; also a real MCP
  client over streamable HTTP, for information (that is MCP's transport, not the bridge).

The goal is a median added latency of at most 1 ms per bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import aiohttp
from aiohttp import web

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport
from reachmesh.integrations.autogen import router_tools
from reachmesh.integrations.langgraph import reach_node
from reachmesh.integrations.mcp import ReachMCP
from reachmesh.sdk import ReachClient
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer, free_port

Call = Callable[[], Awaitable[Any]]
POLICY = {
    "health": {"enabled": False},
    "embedding": {"backend": "none"},
    "limits": {"loop_lag_ms": 10_000},
    "logging": {"level": "WARNING"},
    "tracing": {"enabled": True},
}


async def a2a_echo_agent(port: int) -> web.AppRunner:
    """A minimal A2A JSON-RPC agent: the completed task carries the message's data back."""

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        message = body["params"]["message"]
        task = {
            "id": uuid.uuid4().hex,
            "contextId": message.get("contextId", "c"),
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": message["parts"]}],
        }
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"task": task}})

    app = web.Application()
    app.router.add_post("/rpc", rpc)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def timed(call: Call, n: int) -> float:
    """The median latency of ``n`` sequential calls, in ms."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


class One(TypedDict, total=False):
    sku: str
    result: Any
    reach_status: str
    reach_error: Any


async def main(calls: int, rounds: int) -> dict[str, Any]:
    from a2a.client import ClientConfig, create_client
    from a2a.helpers.proto_helpers import new_data_part
    from a2a.types import Message, Role, SendMessageRequest
    from autogen_core import CancellationToken
    from langgraph.graph import END, START, StateGraph
    from mcp import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    paths: dict[str, Call] = {}
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agent = await FakeAgent("echo-agent", tasks=("echo",), input_schema={"sku": "string"}).start()
        await agent.register(router.url, vectors=False)
        a2a_port = free_port()
        a2a_runner = await a2a_echo_agent(a2a_port)
        async with aiohttp.ClientSession() as http:
            profile = {
                "id": "a2a-echo",
                "network": {"protocol": "a2a", "endpoint": f"http://127.0.0.1:{a2a_port}/rpc"},
                "capabilities": [{"task": "echo_a2a", "input_schema": {"sku": "string"}}],
                "managed": True,
            }
            async with http.post(f"{router.url}/agents", json=profile) as resp:
                assert resp.status == 201, await resp.text()
            client = ReachClient(router.url, source_agent="bench")
            payload = {"sku": "SKU-1"}

            async def native() -> Any:
                reply = await client.call("echo", payload)
                assert reply.ok, reply
                return reply

            async def native_to_a2a() -> Any:
                reply = await client.call("echo_a2a", payload)
                assert reply.ok, reply
                return reply

            graph = StateGraph(One)
            graph.add_node("call", reach_node("echo", inputs=["sku"], client=client))
            graph.add_edge(START, "call")
            graph.add_edge("call", END)
            compiled = graph.compile()

            async def langgraph() -> Any:
                state = await compiled.ainvoke({"sku": "SKU-1"})
                assert state["reach_status"] == "SUCCESS", state
                return state

            (tool,) = await router_tools(client=client, tasks={"echo"})
            token = CancellationToken()

            async def autogen() -> Any:
                return await tool.run_json(payload, token)

            reach_body = json.dumps({"targetTask": "echo", "payload": payload}).encode()

            async def raw_reach() -> Any:
                async with http.post(f"{router.url}/reach", data=reach_body, headers=headers) as resp:
                    return await resp.read()

            def rpc_body() -> bytes:
                message = {
                    "messageId": uuid.uuid4().hex,
                    "role": "ROLE_USER",
                    "parts": [{"data": payload}],
                    "metadata": {"skill": "echo"},
                }
                request = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
                return json.dumps(request).encode()

            headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}

            async def raw_a2a() -> Any:
                async with http.post(f"{router.url}/a2a/jsonrpc", data=rpc_body(), headers=headers) as resp:
                    answer = await resp.json()
                    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer
                    return answer

            a2a_client = await create_client(router.url, client_config=ClientConfig(streaming=False))

            async def a2a_sdk() -> Any:
                message = Message(
                    message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[new_data_part(payload)]
                )
                message.metadata.update({"skill": "echo"})
                async for _ in a2a_client.send_message(SendMessageRequest(message=message)):
                    pass

            mcp_server = ReachMCP(router.url)
            await mcp_server.refresh()

            async def mcp_bridge() -> Any:
                result = await mcp_server.call_tool("echo", payload)
                assert not result.is_error
                return result

            async with (
                AsgiServer(mcp_server.streamable_http_app()) as mcp_http,
                Client(f"{mcp_http.url}/mcp") as mcp_client,
            ):

                async def mcp_wire() -> Any:
                    result = await mcp_client.call_tool("echo", payload)
                    assert not result.is_error
                    return result

                paths = {
                    "native: ReachClient.call -> Reach agent": native,
                    "native: raw POST /reach (aiohttp)": raw_reach,
                    "LangGraph: one reach_node graph": langgraph,
                    "AutoGen: ReachTool.run_json": autogen,
                    "A2A export: raw JSON-RPC SendMessage (aiohttp)": raw_a2a,
                    "A2A export: a2a-sdk client (httpx), for information": a2a_sdk,
                    "A2A import: ReachClient.call -> A2A agent": native_to_a2a,
                    "MCP: ReachMCP.call_tool (the bridge)": mcp_bridge,
                    "MCP: mcp client over streamable HTTP, for information": mcp_wire,
                }
                for call in paths.values():  # warm every path: connections, caches, JIT-free imports
                    for _ in range(20):
                        await call()
                results: dict[str, list[float]] = {name: [] for name in paths}
                for _ in range(rounds):
                    for name, call in paths.items():
                        results[name].append(await timed(call, calls))
            await client.aclose()
            await mcp_server.aclose()
            await a2a_client.close()
        await a2a_runner.cleanup()
        await agent.stop()

    medians = {name: statistics.median(values) for name, values in results.items()}
    base = medians["native: ReachClient.call -> Reach agent"]
    raw_base = medians["native: raw POST /reach (aiohttp)"]
    added = {
        "LangGraph": medians["LangGraph: one reach_node graph"] - base,
        "AutoGen": medians["AutoGen: ReachTool.run_json"] - base,
        "A2A export": medians["A2A export: raw JSON-RPC SendMessage (aiohttp)"] - raw_base,
        "A2A import": medians["A2A import: ReachClient.call -> A2A agent"] - base,
        "MCP": medians["MCP: ReachMCP.call_tool (the bridge)"] - base,
    }
    print(f"bridges, c1, {calls} calls x {rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"{'path':58} {'p50 ms':>8}")
    for name, value in medians.items():
        print(f"{name:58} {value:8.3f}")
    print()
    print(f"{'bridge':12} {'added p50':>10}  goal <= 1 ms")
    for name, value in added.items():
        print(f"{name:12} {value:+9.3f} ms  {'pass' if value <= 1.0 else 'miss'}")
    return {"medians_ms": medians, "added_ms": added, "calls": calls, "rounds": rounds}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report = asyncio.run(main(args.calls, args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
