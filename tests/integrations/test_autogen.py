"""AutoGen through the Router: a real AssistantAgent with autogen's scripted replay model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ToolCallExecutionEvent
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, ModelFamily, ModelInfo, RequestUsage
from autogen_ext.models.replay import ReplayChatCompletionClient

from reachmesh import ReachClient
from reachmesh.config import RouterConfig
from reachmesh.integrations.autogen import autogen_agent, router_tools
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import scaled
from tests.streaming_agents import Conn, StreamAgent

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
TOOLS_MODEL = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)


def call(name: str, arguments: str) -> CreateResult:
    """A scripted model turn that calls one tool."""
    return CreateResult(
        finish_reason="function_calls",
        content=[FunctionCall(id="call-1", name=name, arguments=arguments)],
        usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
        cached=False,
    )


async def test_an_assistant_agent_calls_a_capability_through_the_router() -> None:
    """The tool's schema is the capability's; the model's call is routed to the Reach agent."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        price = await FakeAgent("price-agent", tasks=("query_price",), input_schema={"sku": "string"}).start()
        price.descriptions["query_price"] = "the current price of a product"
        try:
            await price.register(router.url, vectors=False)
            async with ReachClient(router.url, source_agent="autogen") as client:
                (tool,) = await router_tools(client=client)
                assert tool.name == "query_price" and tool.description == "the current price of a product"
                assert tool.schema["parameters"]["required"] == ["sku"]
                model = ReplayChatCompletionClient(
                    [call("query_price", '{"sku": "SKU-7"}'), "SKU-7 costs what the agent said."],
                    model_info=TOOLS_MODEL,
                )
                shopper = AssistantAgent(
                    "shopper", model_client=model, tools=[tool], reflect_on_tool_use=True
                )
                result = await shopper.run(task="What does SKU-7 cost?")
                (executed,) = [m for m in result.messages if isinstance(m, ToolCallExecutionEvent)]
                assert not executed.content[0].is_error
                assert '"agent":"price-agent"' in executed.content[0].content
                assert price.received[0]["payload"] == {"sku": "SKU-7"}
                assert price.received[0]["sourceAgent"] == "autogen"
                assert getattr(result.messages[-1], "content", None) == "SKU-7 costs what the agent said."
                await price.stop()
                failed = await tool.run_json({"sku": "SKU-7"}, CancellationToken())
                assert failed["status"] == "NO_AVAILABLE_HANDLER"
        finally:
            await price.stop()


async def test_an_autogen_agent_registers_as_a_reach_agent() -> None:
    """autogen_agent: one call, and a Reach caller gets the AutoGen agent's answer."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        helper = AssistantAgent("helper", model_client=ReplayChatCompletionClient(["hello from autogen"]))
        reach = autogen_agent(
            helper,
            agent_id="autogen-helper",
            task="chat",
            endpoint=f"http://127.0.0.1:{free_port()}/reach",
            router_url=router.url,
        )
        await reach.start()
        try:
            async with ReachClient(router.url) as client:
                reply = await client.call("chat", {"text": "hi"})
            assert reply.status == "SUCCESS" and reply.result["text"] == "hello from autogen"
        finally:
            await reach.stop()


class HeldAutoGenAgent:
    """An AutoGen agent (anything with ``run(task=...)``) whose runs wait for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.runs = 0
        self.description = "held"

    async def run(self, *, task: str) -> Any:
        self.runs += 1
        await self.release.wait()
        return SimpleNamespace(messages=[SimpleNamespace(content=f"done {task}")])


async def _agent_row(router_url: str, agent_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        rows = (await http.get(f"{router_url}/admin/agents")).json()
    (row,) = [r for r in rows if r["id"] == agent_id]
    return dict(row)


async def test_an_autogen_agent_declares_one_run_at_a_time_so_the_router_queues() -> None:
    """autogen_agent runs one AutoGen run at a time; it says so in its profile (capacity 1), so a
    second call waits in the Router's queue, not behind the agent's lock where the wait would
    run out the read timeout and be charged to the agent (busy is not broken, #34)."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        held = HeldAutoGenAgent()
        reach = autogen_agent(
            held,
            agent_id="held",
            task="chat",
            endpoint=f"http://127.0.0.1:{free_port()}/reach",
            router_url=router.url,
        )
        await reach.start()
        try:
            async with ReachClient(router.url) as client:
                calls = [asyncio.ensure_future(client.call("chat", {"text": str(n)})) for n in range(2)]
                # The Router counts the first call in flight when it sends it; the run begins a
                # moment later at the agent, so both are waited for.
                row = await poll(
                    lambda: _agent_row(router.url, "held"), lambda r: r.get("queued") == 1 and held.runs == 1
                )
                assert row["capacity"] == 1 and row["inflight"] == 1 and held.runs == 1
                held.release.set()
                replies = await asyncio.wait_for(asyncio.gather(*calls), scaled(20))
            assert [r.status for r in replies] == ["SUCCESS", "SUCCESS"]
            assert (await _agent_row(router.url, "held"))["circuit"] == "closed"
        finally:
            held.release.set()
            await reach.stop()


async def test_cancelling_a_tool_run_ends_the_call() -> None:
    """A cancelled CancellationToken ends the tool's run at once (its call to the Router is
    closed), instead of the call running on to its read timeout."""

    async def never_answers(conn: Conn) -> None:
        await conn.closed_by_router()

    agent = await StreamAgent("mute", never_answers, task="mute").start()
    config = RouterConfig.model_validate({**POLICY, "timeouts": {"read_ms": 120_000}})
    async with RouterServer(config) as router:
        await agent.register(router.url)
        try:
            (tool,) = await router_tools(router.url, tasks=["mute"])
            token = CancellationToken()
            run = asyncio.ensure_future(tool.run_json({"q": 1}, token))
            await poll(lambda: _value(len(agent.conns)), lambda n: n == 1)
            token.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(run, scaled(5))
        finally:
            await agent.stop()


async def _value(value: Any) -> Any:
    return value


async def poll(read: Any, done: Any, within_s: float = 10) -> Any:
    """``read()`` until ``done(value)``, within a deadline (no fixed sleep)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + scaled(within_s)
    while True:
        value = await read()
        if done(value):
            return value
        assert loop.time() < end, f"still {value!r}"
        await asyncio.sleep(0.02)
