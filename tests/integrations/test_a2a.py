"""The A2A bridge both ways, against the real a2a-sdk client and server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("a2a")

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    Message,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

from reachmesh import ReachClient
from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport
from reachmesh.integrations.a2a_import import import_agent
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer, free_port

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}


@pytest.fixture
async def exporting_router() -> AsyncIterator[RouterServer]:
    """A Router that also speaks A2A (the card and both bindings), with one Reach agent."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agent = await FakeAgent(
            "echo-agent", tasks=("echo",), descriptions={"echo": "repeat the payload"}
        ).start()
        await agent.register(router.url, vectors=False)
        yield router
        await agent.stop()


def user_message(parts: list[Any], skill: str | None) -> SendMessageRequest:
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=parts)
    if skill is not None:
        message.metadata.update({"skill": skill})
    return SendMessageRequest(message=message)


async def final_task(client: Any, request: SendMessageRequest) -> Task:
    """The task the (non-streaming) call ends with."""
    last = None
    async for event in client.send_message(request):
        last = event
    assert last is not None and last.HasField("task"), last
    task: Task = last.task
    return task


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_an_a2a_client_calls_a_reach_agent_through_the_router(exporting_router, binding: str) -> None:
    """The real a2a-sdk client reads the card, calls skill `echo`; the payload round-trips."""
    config = ClientConfig(streaming=False, supported_protocol_bindings=[binding])
    client = await create_client(exporting_router.url, client_config=config)
    async with client:
        payload = {"sku": "SKU-1", "qty": 3, "nested": {"ok": True}}
        task = await final_task(client, user_message([new_data_part(payload)], "echo"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        (result,) = get_data_parts(task.artifacts[0].parts)
        assert result["agent"] == "echo-agent"
        assert result["echo"] == payload  # protobuf doubles compare equal to the ints sent

        failed = await final_task(client, user_message([new_data_part({"x": 1})], "no_such_task"))
        assert failed.status.state == TaskState.TASK_STATE_FAILED
        (detail,) = get_data_parts(failed.status.message.parts)
        assert detail["status"] == "NO_AVAILABLE_HANDLER"


async def test_the_router_card_lists_routed_tasks_as_skills(exporting_router) -> None:
    """GET /.well-known/agent-card.json: one skill per task, both interfaces, read live."""
    import httpx

    async with httpx.AsyncClient(base_url=exporting_router.url) as http:
        card = (await http.get("/.well-known/agent-card.json")).json()
        assert [s["id"] for s in card["skills"]] == ["echo", "agent-reach:by-meaning"]
        assert card["skills"][0]["description"] == "repeat the payload"
        bindings = {i["protocolBinding"] for i in card["supportedInterfaces"]}
        assert bindings == {"JSONRPC", "HTTP+JSON"}
        late = await FakeAgent("late-agent", tasks=("late_task",)).start()
        try:
            await late.register(exporting_router.url, vectors=False)
            card = (await http.get("/.well-known/agent-card.json")).json()
            assert [s["id"] for s in card["skills"]] == ["echo", "late_task", "agent-reach:by-meaning"]
        finally:
            await late.stop()


class ScriptedA2AAgent(AgentExecutor):
    """A real a2a-sdk agent: echoes the data it gets, or fails when asked to."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        data = [MessageToDict(p.data) for p in context.message.parts if p.HasField("data")]
        self.seen.append({"data": data, "metadata": MessageToDict(context.message.metadata)})
        task_id, context_id = context.task_id or "t", context.context_id or "c"
        if data and data[0].get("fail"):
            note = Message(message_id="m", role=Role.ROLE_AGENT, parts=[new_text_part("cannot do that")])
            status = TaskStatus(state=TaskState.TASK_STATE_FAILED, message=note)
            await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=status))
            return
        artifact = Artifact(artifact_id="a", parts=[new_data_part({"got": data[0] if data else None})])
        status = TaskStatus(state=TaskState.TASK_STATE_COMPLETED)
        await event_queue.enqueue_event(
            Task(id=task_id, context_id=context_id, status=status, artifacts=[artifact])
        )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Nothing runs long enough to cancel."""


def a2a_agent_app(url: str, executor: AgentExecutor) -> Starlette:
    card = AgentCard(
        name="Summary Service",
        description="an A2A agent outside Agent-Reach",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url + "/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["application/json"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(
                id="summarise",
                name="Summarise",
                description="summarise a document",
                tags=["text"],
                examples=["give me the gist of this"],
            )
        ],
    )
    handler = DefaultRequestHandlerV2(
        agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/rpc")])


async def test_an_imported_a2a_agent_is_called_with_a_reach_request() -> None:
    """`import_agent` registers a real a2a-sdk agent by its card; a ReachRequest reaches it."""
    port = free_port()
    executor = ScriptedA2AAgent()
    config = RouterConfig.model_validate(POLICY)
    async with (
        AsgiServer(a2a_agent_app(f"http://127.0.0.1:{port}", executor), port=port) as agent,
        RouterServer(config) as router,
    ):
        registration = await import_agent(agent.url, router.url)
        assert registration["agentId"] == "summary-service" and registration["ttlSeconds"] == 0
        assert registration["profile"]["capabilities"][0]["examples"] == ["give me the gist of this"]
        async with ReachClient(router.url, source_agent="tester") as client:
            ok = await client.call("summarise", {"doc": "long text", "pages": 12}, conversation_id="conv-1")
            assert ok.status == "SUCCESS", ok
            assert ok.result == {"got": {"doc": "long text", "pages": 12}}
            assert ok.handler_agent_id == "summary-service"
            assert executor.seen[0]["metadata"]["skill"] == "summarise"
            failed = await client.call("summarise", {"fail": True})
            assert failed.status == "AGENT_ERROR"
            assert failed.error is not None and failed.error.code == "A2A_TASK_FAILED"
            assert failed.error.message == "cannot do that"


async def test_plain_text_is_routed_by_meaning() -> None:
    """A text message without a skill goes through semantic_route with the bundled model."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(
        {"health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}, "embedding": {"backend": "auto"}}
    )
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agents = [
            FakeAgent(
                "price-agent",
                tasks=("query_product_price",),
                descriptions={"query_product_price": "查询指定商品的当前售价"},
                examples={"query_product_price": ["what is the price of this item", "how much does it cost"]},
            ),
            FakeAgent(
                "trend-agent",
                tasks=("analyze_price_trend",),
                descriptions={"analyze_price_trend": "分析商品价格历史走势"},
                examples={"analyze_price_trend": ["price history of this product", "has it gotten cheaper"]},
            ),
        ]
        for agent in agents:
            await agent.start()
            await agent.register(router.url)  # waits until its vectors are in
        try:
            client = await create_client(router.url, client_config=ClientConfig(streaming=False))
            async with client:
                task = await final_task(
                    client, user_message([new_text_part("how much does this cost?")], None)
                )
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            (result,) = get_data_parts(task.artifacts[0].parts)
            assert result["agent"] == "price-agent"
            assert result["echo"] == {"text": "how much does this cost?"}
        finally:
            for agent in agents:
                await agent.stop()


async def test_a2a_tasks_belong_to_the_caller_that_made_them(monkeypatch) -> None:
    """With auth on, one caller's task is invisible to another token (GetTask and the list)."""
    import httpx

    monkeypatch.setenv("REACH_CALLER_TOKEN", "caller-one-token-1111,caller-two-token-2222")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agent = await FakeAgent("echo-agent", tasks=("echo",)).start()
        try:
            # Registered in process: the test's tokens are callers', not agents'.
            from reachmesh.protocol import AgentProfile

            await router.app.parts.registry.register(AgentProfile.model_validate(agent.profile()))
            one = {"Authorization": "Bearer caller-one-token-1111", "A2A-Version": "1.0"}
            two = {"Authorization": "Bearer caller-two-token-2222", "A2A-Version": "1.0"}
            send = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": {"n": 1}}]},
                    "metadata": {"skill": "echo", "timeoutMs": 1e308},
                },
            }
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                made = (await http.post("/a2a/jsonrpc", json=send, headers=one)).json()
                task_id = made["result"]["task"]["id"]
                get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task_id}}
                mine = (await http.post("/a2a/jsonrpc", json=get, headers=one)).json()
                theirs = (await http.post("/a2a/jsonrpc", json=get, headers=two)).json()
                listed = (await http.get("/a2a/rest/tasks", headers=two)).json()
            assert mine["result"]["id"] == task_id
            assert "error" in theirs and "result" not in theirs
            assert task_id not in str(listed)
        finally:
            await agent.stop()


async def test_a_body_nested_too_deep_is_refused_before_a2a_sdk_parses_it(exporting_router) -> None:
    """server.max_json_depth holds on /a2a/* too: a 400, not a recursion error inside the SDK."""
    import httpx

    deep = b"[" * 5000 + b"]" * 5000
    base = exporting_router.url
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        for path in ("/a2a/jsonrpc", "/a2a/rest/message:send"):
            resp = await http.post(path, content=deep, headers={"Content-Type": "application/json"})
            assert resp.status_code == 400, (path, resp.text)
            assert resp.json()["error"]["code"] == "INVALID_REQUEST"
