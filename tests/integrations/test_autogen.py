"""AutoGen through the Router: a real AssistantAgent with autogen's scripted replay model."""

from __future__ import annotations

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
