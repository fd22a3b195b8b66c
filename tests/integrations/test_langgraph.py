"""LangGraph through the Router, against real langgraph graphs and real SDK agents."""

from __future__ import annotations

import asyncio
import importlib.util
import operator
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
import pytest

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph

from reachmesh import ReachClient
from reachmesh.config import RouterConfig
from reachmesh.integrations.langgraph import branch_on, graph_agent, reach_node
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.procs import ROOT, Proc

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
EXAMPLE = ROOT / "examples" / "langgraph"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("langgraph_example", EXAMPLE / "graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: LangGraph resolves the state's type hints through the module.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    async with RouterServer(RouterConfig.model_validate(POLICY)) as server:
        yield server


async def until_registered(router_url: str, *ids: str) -> None:
    """Poll the registry until every id is listed (a bounded wait for a condition, not a sleep)."""
    async with httpx.AsyncClient(base_url=router_url) as http:
        for _ in range(600):
            listed = {row["id"] for row in (await http.get("/admin/agents")).json()}
            if set(ids) <= listed:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{ids} did not register")


class Run(TypedDict, total=False):
    product_id: str
    price: dict[str, Any] | None
    reach_status: str
    reach_error: dict[str, Any] | None
    reach_response: dict[str, Any]
    served: Annotated[list[dict[str, Any]], operator.add]
    gave_up: bool


async def test_failover_under_a_running_graph_and_the_no_handler_branch(router, tmp_path: Path) -> None:
    """Two SDK agent processes; one is killed -9 mid-run and the graph never notices; with both
    gone the graph takes its NO_AVAILABLE_HANDLER branch."""
    procs: dict[str, Proc] = {}
    for name in ("shop-a", "shop-b"):
        procs[name] = Proc(
            [
                "agent",
                "--config",
                str(EXAMPLE / "reach_config.yaml"),
                "--app",
                str(EXAMPLE / "agent.py") + ":agent",
            ],
            tmp_path / f"{name}.log",
            env={
                "REACH_SELF_ID": name,
                "REACH_CALLBACK_URL": f"http://127.0.0.1:{free_port()}/reach",
                "REACH_HEALTH_PORT": str(free_port()),
                "REACH_ROUTER_URL": router.url,
            },
        )
    try:
        await until_registered(router.url, *procs)

        def kill_first_handler(state: Run) -> dict[str, Any]:
            procs[state["served"][0]["handlerAgentId"]].signal(signal.SIGKILL)
            return {}

        def after_step(state: Run) -> str:
            if state["reach_status"] != "SUCCESS":
                return state["reach_status"]
            return "kill" if len(state["served"]) == 1 else ("again" if len(state["served"]) < 4 else "done")

        client = ReachClient(router.url, source_agent="test-graph")
        graph = StateGraph(Run)
        graph.add_node(
            "step",
            reach_node(
                "lookup_price",
                inputs=["product_id"],
                output="price",
                response_key="reach_response",
                client=client,
            ),
        )
        graph.add_node("record", lambda s: {"served": [s["reach_response"]]})
        graph.add_node("kill", kill_first_handler)
        graph.add_node("gave_up", lambda s: {"gave_up": True})
        graph.add_edge(START, "step")
        graph.add_conditional_edges(
            "step", branch_on(), {"SUCCESS": "record", "NO_AVAILABLE_HANDLER": "gave_up"}
        )
        graph.add_conditional_edges("record", after_step, {"kill": "kill", "again": "step", "done": END})
        graph.add_edge("kill", "step")
        graph.add_edge("gave_up", END)
        app = graph.compile()

        state = await app.ainvoke({"product_id": "SKU-1"}, {"configurable": {"thread_id": "run-1"}})
        assert not state.get("gave_up") and len(state["served"]) == 4
        killed = state["served"][0]["handlerAgentId"]
        survivor = ({"shop-a", "shop-b"} - {killed}).pop()
        assert all(s["handlerAgentId"] == survivor for s in state["served"][1:])
        # The Router tried the dead agent at least once after the kill, and failed over.
        tried = [a for s in state["served"][1:] for a in s["attempts"]]
        assert any(a["agentId"] == killed and a["outcome"] == "connect_error" for a in tried)

        procs[survivor].signal(signal.SIGKILL)
        state = await app.ainvoke({"product_id": "SKU-1"}, {"configurable": {"thread_id": "run-2"}})
        assert state["gave_up"] is True and state["reach_status"] == "NO_AVAILABLE_HANDLER"
        assert state["reach_error"]["code"] == "NO_AVAILABLE_HANDLER"
        await client.aclose()
    finally:
        for proc in procs.values():
            proc.stop()


async def test_the_example_graph_and_the_thread_id(router) -> None:
    """examples/langgraph/graph.py runs through the Router; conversationId is the thread id."""
    shop = FakeAgent("shop", tasks=("lookup_price", "lookup_promotion"))
    shop.result = {"price": 100.0, "currency": "CNY", "discount": 0.25}
    await shop.start()
    try:
        await shop.register(router.url, vectors=False)
        async with ReachClient(router.url) as client:
            graph = load_example().build_graph(client)
            state = await graph.ainvoke({"product_id": "SKU-9"}, {"configurable": {"thread_id": "thread-42"}})
            assert state["answer"] == "SKU-9: 75.00 CNY"
            assert [r["conversationId"] for r in shop.received] == ["thread-42", "thread-42"]
            assert shop.received[0]["payload"] == {"product_id": "SKU-9"}
            await shop.stop()
            state = await graph.ainvoke({"product_id": "SKU-9"}, {"configurable": {"thread_id": "thread-43"}})
            assert state["answer"].startswith("no agent can answer right now (NO_AVAILABLE_HANDLER")
    finally:
        await shop.stop()


async def test_a_graph_served_as_a_reach_agent(router) -> None:
    """graph_agent: one call makes a compiled graph a Reach agent; a caller reaches it by task."""

    class Doubling(TypedDict, total=False):
        n: int
        doubled: int

    graph = StateGraph(Doubling)
    graph.add_node("double", lambda s: {"doubled": s["n"] * 2})
    graph.add_edge(START, "double")
    graph.add_edge("double", END)
    agent = graph_agent(
        graph.compile(),
        agent_id="doubler",
        task="double_it",
        endpoint=f"http://127.0.0.1:{free_port()}/reach",
        router_url=router.url,
        input_schema={"n": "integer"},
        output_key="doubled",
    )
    await agent.start()
    try:
        async with ReachClient(router.url) as client:
            reply = await client.call("double_it", {"n": 21})
            assert reply.status == "SUCCESS" and reply.result == 42
    finally:
        await agent.stop()


def test_branch_on_with_failure_sends_every_other_status_to_one_path() -> None:
    """branch_on(failure=...) maps SUCCESS to itself and any other status to the failure path."""
    from reachmesh.integrations.langgraph import branch_on

    route = branch_on(failure="sorry")
    assert route({"reach_status": "SUCCESS"}) == "SUCCESS"
    assert route({"reach_status": "INVALID_REQUEST"}) == "sorry"
    assert route({"reach_status": "OVERLOADED"}) == "sorry"
    assert branch_on()({"reach_status": "TIMEOUT"}) == "TIMEOUT"


class Talk(TypedDict, total=False):
    topic: str
    result: Any
    reach_status: str


async def test_reach_node_streams_the_agents_chunks_into_astream(router: RouterServer) -> None:
    """stream=True: the graph's custom stream yields each chunk while the agent still talks (its
    last yield waits until the graph has yielded the first)."""
    from reachmesh import AgentConfig, ReachAgent

    port = free_port()
    config = AgentConfig.from_mapping(
        {
            "agent": {
                "id": "storyteller",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "talk"}],
            },
            "router": {"url": router.url},
        },
        env={},
    )
    agent = ReachAgent(config)
    graph_has_first = asyncio.Event()

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yield f"once upon {payload['topic']}"
        await graph_has_first.wait()
        yield "the end"

    builder = StateGraph(Talk)
    builder.add_node("talk", reach_node("talk", inputs=["topic"], stream=True, router_url=router.url))
    builder.add_edge(START, "talk")
    builder.add_edge("talk", END)
    graph = builder.compile()
    await agent.start()
    try:
        custom: list[Any] = []
        final: Any = {}
        async for mode, item in graph.astream({"topic": "a time"}, stream_mode=["custom", "values"]):
            if mode == "custom":
                custom.append(item)
                graph_has_first.set()
            else:
                final = item
        assert custom == [
            {"task": "talk", "chunk": "once upon a time"},
            {"task": "talk", "chunk": "the end"},
        ]
        assert final["reach_status"] == "SUCCESS"
        assert final["result"] == ["once upon a time", "the end"]
    finally:
        await agent.stop()
