"""Streaming through the A2A bridges (protocol §14, docs/protocol.md §17): ``SendStreamingMessage``
through the export streams the agent's chunks as artifact updates as they come, and a streaming
A2A agent imported with ``--a2a-import`` streams to a Router caller that asks for an event stream.

Real a2a-sdk client and server on loopback. Timing is proved with events: the agent's last chunk
waits until the caller holds the first.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("a2a")

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_data_part, new_text_part
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
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

from reachmesh import ReachClient
from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport
from reachmesh.integrations.a2a_import import import_agent
from reachmesh.testing import AsgiServer, RouterServer, free_port
from tests.helpers import scaled
from tests.streaming_agents import Conn, StreamAgent

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}


@pytest.fixture
async def exporting_router() -> AsyncIterator[RouterServer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        yield router


def talk_message(skill: str = "talk") -> SendMessageRequest:
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[new_data_part({"q": 1})])
    message.metadata.update({"skill": skill})
    return SendMessageRequest(message=message)


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_send_streaming_message_through_the_export_streams_each_chunk(
    exporting_router: RouterServer, binding: str
) -> None:
    """More than one event; the first chunk's artifact update arrives before the agent sends
    its last chunk (the agent waits for the caller to hold it)."""
    caller_has_first = asyncio.Event()
    finished = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("Hel")
        await asyncio.wait_for(caller_has_first.wait(), scaled(10))
        await conn.chunk("lo")
        await conn.chunk({"n": 3})
        finished.set()
        await conn.done()

    agent = await StreamAgent("talker", script).start()
    await agent.register(exporting_router.url)
    try:
        config = ClientConfig(streaming=True, supported_protocol_bindings=[binding])
        client = await create_client(exporting_router.url, client_config=config)
        events: list[Any] = []
        async with client:
            async for event in client.send_message(talk_message()):
                events.append(event)
                if event.HasField("artifact_update") and not caller_has_first.is_set():
                    assert not finished.is_set()  # the agent has not sent its last chunk yet
                    caller_has_first.set()
        updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
        assert len(updates) == 3
        texts = [MessageToDict(u.artifact)["parts"] for u in updates]
        assert texts == [[{"text": "Hel"}], [{"text": "lo"}], [{"data": {"n": 3.0}}]]
        assert [u.append for u in updates] == [False, True, True]
        assert len({u.artifact.artifact_id for u in updates}) == 1
        last = events[-1]
        assert last.HasField("status_update")
        assert last.status_update.status.state == TaskState.TASK_STATE_COMPLETED
        assert last.status_update.metadata["handlerAgentId"] == "talker"
    finally:
        await agent.stop()


async def test_a_blocking_send_message_still_gets_one_task(exporting_router: RouterServer) -> None:
    """The streaming path is only for streaming calls: a blocking call to a streaming agent ends
    in one completed task whose artifact is the chunks' list (§14 mixed ends)."""

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        for word in ("a", "b"):
            await conn.chunk(word)
        await conn.done()

    agent = await StreamAgent("talker", script).start()
    await agent.register(exporting_router.url)
    try:
        config = ClientConfig(streaming=False, supported_protocol_bindings=["HTTP+JSON"])
        client = await create_client(exporting_router.url, client_config=config)
        async with client:
            events = [e async for e in client.send_message(talk_message())]
        (event,) = events
        assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert MessageToDict(event.task.artifacts[0])["parts"] == [{"data": ["a", "b"]}]
    finally:
        await agent.stop()


async def test_a_failure_before_any_chunk_ends_the_stream_failed(exporting_router: RouterServer) -> None:
    config = ClientConfig(streaming=True, supported_protocol_bindings=["JSONRPC"])
    client = await create_client(exporting_router.url, client_config=config)
    async with client:
        events = [e async for e in client.send_message(talk_message("no_such_task"))]
    assert not any(e.HasField("artifact_update") for e in events)
    last = events[-1]
    assert last.status_update.status.state == TaskState.TASK_STATE_FAILED
    (detail,) = [
        MessageToDict(p)["data"] for p in last.status_update.status.message.parts if p.HasField("data")
    ]
    assert detail["status"] == "NO_AVAILABLE_HANDLER"


# ------------------------------------------------------------------------------- the import


class StreamingA2AAgent(AgentExecutor):
    """A real a2a-sdk agent that answers in artifact updates, its last one held by a test."""

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release
        self.finished = asyncio.Event()
        self.fail = False
        self.runs = 0
        self.card_url = ""
        self.lease_id = ""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.runs += 1
        task_id, context_id = context.task_id or "t", context.context_id or "c"
        working = TaskStatus(state=TaskState.TASK_STATE_WORKING)
        await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=working))
        for n, word in enumerate(("Hel", "lo")):
            if n:
                await asyncio.wait_for(self.release.wait(), scaled(10))
            artifact = Artifact(artifact_id="a", parts=[new_text_part(word)])
            await event_queue.enqueue_event(
                TaskArtifactUpdateEvent(
                    task_id=task_id, context_id=context_id, artifact=artifact, append=n > 0
                )
            )
        self.finished.set()
        if self.fail:
            note = Message(message_id="m", role=Role.ROLE_AGENT, parts=[new_text_part("out of words")])
            status = TaskStatus(state=TaskState.TASK_STATE_FAILED, message=note)
        else:
            status = TaskStatus(state=TaskState.TASK_STATE_COMPLETED)
        await event_queue.enqueue_event(
            TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=status)
        )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Nothing to cancel."""


def streaming_card(url: str) -> AgentCard:
    return AgentCard(
        name="Talker",
        description="talks in pieces",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["application/json"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="talk", name="talk", description="talk in pieces", tags=["t"])],
    )


@pytest.fixture
async def imported_talker() -> AsyncIterator[tuple[RouterServer, StreamingA2AAgent]]:
    release = asyncio.Event()
    executor = StreamingA2AAgent(release)
    port = free_port()
    card = streaming_card(f"http://127.0.0.1:{port}/")
    handler = DefaultRequestHandlerV2(
        agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card
    )
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    config = RouterConfig.model_validate(POLICY)
    async with AsgiServer(app, port=port) as a2a_agent, RouterServer(config) as router:
        executor.card_url = a2a_agent.url
        executor.lease_id = (await import_agent(a2a_agent.url, router.url))["leaseId"]
        yield router, executor


async def test_an_imported_streaming_a2a_agent_streams_to_a_router_caller(imported_talker) -> None:
    router, executor = imported_talker
    async with ReachClient(router.url) as client, client.stream("talk", {"q": 1}) as stream:
        got: list[Any] = []
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 1:
                assert not executor.finished.is_set()  # the agent holds its last chunk
                executor.release.set()
        assert got == ["Hel", "lo"]
        assert stream.response.ok and stream.response.handler_agent_id == "talker"


async def test_an_imported_agent_given_a_capacity_is_sent_no_more_than_it(imported_talker) -> None:
    """An A2A card cannot say how many calls its agent takes at once; the import says it
    (``max_concurrency``, ``reach a2a import --max-concurrency``): a second stream waits in the
    Router's queue while the first holds the agent, and both end whole (#34 through the import)."""
    import httpx

    router, executor = imported_talker
    async with httpx.AsyncClient() as http:  # a managed entry changes by removing it first
        gone = await http.delete(f"{router.url}/agents/talker", headers={"X-Reach-Lease": executor.lease_id})
        assert gone.status_code == 204
    await import_agent(executor.card_url, router.url, agent_id="talker", max_concurrency=1)
    started = asyncio.Event()

    async def talk(client: ReachClient) -> list[Any]:
        async with client.stream("talk", {"q": 1}) as stream:
            got = []
            async for chunk in stream:
                got.append(chunk)
                started.set()
            assert stream.response.ok, stream.response
            return got

    async def row() -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            (talker,) = [
                r for r in (await http.get(f"{router.url}/admin/agents")).json() if r["id"] == "talker"
            ]
        return dict(talker)

    async with ReachClient(router.url) as client:
        calls = [asyncio.ensure_future(talk(client)) for _ in range(2)]
        await asyncio.wait_for(started.wait(), scaled(10))
        loop = asyncio.get_running_loop()
        end = loop.time() + scaled(10)
        while (seen := await row())["queued"] != 1:
            assert loop.time() < end, seen
            await asyncio.sleep(0.02)
        assert seen["capacity"] == 1 and seen["inflight"] == 1 and executor.runs == 1
        executor.release.set()
        answers = await asyncio.wait_for(asyncio.gather(*calls), scaled(20))
    assert answers == [["Hel", "lo"], ["Hel", "lo"]]
    assert executor.runs == 2 and (await row())["circuit"] == "closed"


async def test_an_imported_agent_that_fails_mid_stream_ends_with_its_error(imported_talker) -> None:
    router, executor = imported_talker
    executor.fail = True
    executor.release.set()
    async with ReachClient(router.url) as client, client.stream("talk", {"q": 1}) as stream:
        got = [chunk async for chunk in stream]
    assert got == ["Hel", "lo"]
    assert stream.response.status == "AGENT_ERROR"
    assert stream.response.error is not None and stream.response.error.code == "A2A_TASK_FAILED"


async def test_a_plain_call_to_an_imported_streaming_agent_still_gets_one_answer(imported_talker) -> None:
    router, executor = imported_talker
    executor.release.set()
    async with ReachClient(router.url) as client:
        resp = await client.call("talk", {"q": 1})
    assert resp.ok and resp.result == {"text": "Hel\nlo"}


async def test_an_imported_agent_that_does_not_stream_answers_a_streaming_caller_in_one_chunk() -> None:
    """Its card says streaming false, so it refuses SendStreamingMessage: the Router asks it
    again with SendMessage, and the caller gets the whole answer as one chunk (§14 mixed ends)."""
    from tests.integrations.test_a2a import ScriptedA2AAgent, a2a_agent_app

    port = free_port()
    config = RouterConfig.model_validate(POLICY)
    async with (
        AsgiServer(a2a_agent_app(f"http://127.0.0.1:{port}", ScriptedA2AAgent()), port=port) as agent,
        RouterServer(config) as router,
    ):
        await import_agent(agent.url, router.url)
        async with ReachClient(router.url) as client, client.stream("summarise", {"doc": "x"}) as stream:
            got = [chunk async for chunk in stream]
        assert stream.response.ok, stream.response
        assert got == [{"got": {"doc": "x"}}]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_an_a2a_caller_that_goes_away_closes_the_agents_connection(
    exporting_router: RouterServer, binding: str
) -> None:
    """The a2a-sdk client leaves after the first chunk: the Router closes its connection to the
    agent within a second (it used to run on until a2a-sdk gave its queue up, about 5 s)."""
    closed = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("Hel")
        await conn.closed_by_router()
        closed.set()

    agent = await StreamAgent("talker", script).start()
    await agent.register(exporting_router.url)
    try:
        config = ClientConfig(streaming=True, supported_protocol_bindings=[binding])
        client = await create_client(exporting_router.url, client_config=config)
        async with client:
            async for event in client.send_message(talk_message()):
                if event.HasField("artifact_update"):
                    break
        await asyncio.wait_for(closed.wait(), scaled(1))
    finally:
        await agent.stop()


# ------------------------------------------------------------------ a busy imported agent


@pytest.fixture
async def busy_a2a_agent() -> AsyncIterator[RouterServer]:
    """An imported A2A agent that answers every JSON-RPC call ``429`` with ``Retry-After: 7``."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    port = free_port()
    card = MessageToDict(streaming_card(f"http://127.0.0.1:{port}/"))

    async def card_endpoint(request: Request) -> Response:
        return JSONResponse(card)

    async def busy(request: Request) -> Response:
        return Response(b"{}", status_code=429, headers={"Retry-After": "7"}, media_type="application/json")

    routes = [Route("/.well-known/agent-card.json", card_endpoint), Route("/", busy, methods=["POST"])]
    config = RouterConfig.model_validate(POLICY)
    async with AsgiServer(Starlette(routes=routes), port=port) as agent, RouterServer(config) as router:
        await import_agent(agent.url, router.url)
        yield router


async def test_a_busy_imported_agent_ends_a_stream_busy_not_broken(busy_a2a_agent: RouterServer) -> None:
    """A streamed call to an imported agent that answers 429 ends before any chunk with the
    Router's structured error (candidate reason ``busy``, the agent's Retry-After), and its
    breaker stays closed: busy is not broken through the import too."""
    import httpx

    router = busy_a2a_agent
    async with ReachClient(router.url) as client, client.stream("talk", {"q": 1}) as stream:
        got = [chunk async for chunk in stream]
    assert got == []
    error = stream.response.error
    assert error is not None and error.retry_after_seconds == 7
    assert [c.reason for c in error.candidates or []] == ["busy"]
    async with httpx.AsyncClient() as http:
        (row,) = (await http.get(f"{router.url}/admin/agents")).json()
    assert row["circuit"] == "closed"


async def test_a_streamed_call_refused_busy_carries_retry_after(busy_a2a_agent: RouterServer) -> None:
    import httpx

    envelope = {"targetTask": "talk", "payload": {"q": 1}}
    async with httpx.AsyncClient(base_url=busy_a2a_agent.url) as http:
        plain = await http.post("/reach", json=envelope)
        streamed = await http.post("/reach", json=envelope, headers={"Accept": "text/event-stream"})
    assert plain.status_code == streamed.status_code == 503
    assert plain.headers.get("retry-after") == "7"
    assert streamed.headers.get("retry-after") == "7"


async def test_a_full_agent_behind_the_export_is_a_failed_task_that_says_when_to_retry() -> None:
    """max_concurrency 1, one call held, no queue: an A2A streaming call ends in a failed status
    whose text says busy and when to try again, and whose DataPart carries OVERLOADED and
    retryAfterSeconds; the agent's breaker stays closed."""
    import httpx

    from reachmesh.testing import FakeAgent

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    policy = {
        **POLICY,
        "limits": {"loop_lag_ms": 10_000, "max_queued_per_agent": 0},
        # The first call is held at the agent while an A2A client is made and streams: the default
        # read timeout (3 s, not scaled) must not end it first on a busy machine.
        "timeouts": {"read_ms": int(scaled(20_000))},
    }
    config = RouterConfig.model_validate(policy)
    agent = FakeAgent("price", tasks=("talk",), max_concurrency=1, hold=asyncio.Event())
    await agent.start()
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        try:
            await agent.register(router.url, vectors=False)
            async with ReachClient(router.url) as reach:
                first = asyncio.ensure_future(reach.call("talk", {"q": 0}))
                loop = asyncio.get_running_loop()
                end = loop.time() + scaled(10)
                while not agent.received:
                    assert loop.time() < end
                    await asyncio.sleep(0.02)
                client = await create_client(router.url, client_config=ClientConfig(streaming=True))
                async with client:
                    events = [e async for e in client.send_message(talk_message())]
                agent.hold.set()  # type: ignore[union-attr]
                assert (await asyncio.wait_for(first, scaled(10))).ok
            last = events[-1].status_update.status
            assert last.state == TaskState.TASK_STATE_FAILED
            parts = [MessageToDict(p) for p in last.message.parts]
            assert parts[0]["text"].startswith("OVERLOADED: ") and "try again in 1 s" in parts[0]["text"]
            assert parts[1]["data"]["status"] == "OVERLOADED"
            assert parts[1]["data"]["error"]["retryAfterSeconds"] == 1
            async with httpx.AsyncClient() as http:
                (row,) = (await http.get(f"{router.url}/admin/agents")).json()
            assert row["circuit"] == "closed"
        finally:
            await agent.stop()
