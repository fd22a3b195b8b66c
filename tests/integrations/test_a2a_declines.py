"""A2A `rejected` is a decline both ways, against the real a2a-sdk client and server."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("a2a")

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.types import Message, Role, Task, TaskState, TaskStatus

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport, import_agent
from reachmesh.sdk import ReachClient
from reachmesh.testing import AsgiServer, FakeAgent, RouterServer, free_port
from tests.integrations.test_a2a import POLICY, a2a_agent_app, final_task, user_message

pytestmark = pytest.mark.integrations


class RejectingA2AAgent(AgentExecutor):
    """An A2A agent that rejects every task: not its kind of work."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.calls += 1
        note = Message(message_id="m", role=Role.ROLE_AGENT, parts=[new_text_part("not my kind of work")])
        status = TaskStatus(state=TaskState.TASK_STATE_REJECTED, message=note)
        task = Task(id=context.task_id or "t", context_id=context.context_id or "c", status=status)
        await event_queue.enqueue_event(task)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Nothing runs long enough to cancel."""


async def test_an_imported_agents_rejected_task_is_a_decline() -> None:
    """The Router moves on to a Reach agent of the same task, and the A2A agent's breaker and
    success rate never see the rejection."""
    port = free_port()
    executor = RejectingA2AAgent()
    config = RouterConfig.model_validate(POLICY)
    async with (
        AsgiServer(a2a_agent_app(f"http://127.0.0.1:{port}", executor), port=port) as agent,
        RouterServer(config) as router,
    ):
        await import_agent(agent.url, router.url)
        peer = await FakeAgent("summary-peer", tasks=("summarise",)).start()
        await peer.register(router.url, vectors=False)
        try:
            async with ReachClient(router.url, source_agent="tester") as client:
                for _ in range(12):
                    ok = await client.call("summarise", {"doc": "x"}, retry_count=0)
                    assert ok.status == "SUCCESS" and ok.handler_agent_id == "summary-peer", ok
                await peer.stop()
                refused = await client.call("summarise", {"doc": "x"})
            assert executor.calls >= 5  # tried first about half the time
            assert refused.status == "NO_AVAILABLE_HANDLER"
            assert refused.error is not None and refused.error.candidates is not None
            reasons = {c.agent_id: c.reason for c in refused.error.candidates}
            assert reasons["summary-service"] == "declined"
            async with httpx.AsyncClient(base_url=router.url) as http:
                status = (await http.get("/admin/agents/summary-service")).json()
            assert status["circuit"] == "closed" and status["stats"]["successRate"] == 1.0
        finally:
            await peer.stop()


async def test_a_request_every_candidate_declined_is_a_rejected_task_through_the_export() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agent = await FakeAgent(
            "no-agent", tasks=("echo",), mode="decline", limits={"echo": ["anything with a date"]}
        ).start()
        await agent.register(router.url, vectors=False)
        try:
            async with httpx.AsyncClient(base_url=router.url) as http:
                card = (await http.get("/.well-known/agent-card.json")).json()
            (skill,) = [s for s in card["skills"] if s["id"] == "echo"]
            assert skill["description"].endswith("Does not handle: anything with a date.")
            client = await create_client(router.url, client_config=ClientConfig(streaming=False))
            async with client:
                declined = await final_task(client, user_message([new_data_part({"a": 1})], "echo"))
                assert declined.status.state == TaskState.TASK_STATE_REJECTED
                agent.mode = "error"
                failed = await final_task(client, user_message([new_data_part({"a": 1})], "echo"))
                assert failed.status.state == TaskState.TASK_STATE_FAILED
        finally:
            await agent.stop()
