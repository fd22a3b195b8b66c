"""Streaming through the SDK (protocol §14): an async-generator capability, ReachClient.stream(),
SyncReachClient.stream() and ctx.stream(), against a real Router on loopback.

Chunk timing is proved with events: the agent's last yield waits until the caller has the first.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from reachmesh import AgentError, ReachAgent, ReachClient, ReachContext, SyncReachClient
from reachmesh.exceptions import ConfigError
from reachmesh.sdk.agent import Decline
from reachmesh.sse import SseParser
from reachmesh.testing import RouterServer
from tests.helpers import scaled, until
from tests.sdk.test_agent import agent_config


async def test_round_trip_first_chunk_arrives_before_the_agent_yields_its_last(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))
    caller_has_first = asyncio.Event()
    yielded: list[str] = []

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yielded.append("Hel")
        yield "Hel"
        await caller_has_first.wait()  # held until the caller has read the first chunk
        yielded.append("lo")
        yield "lo"

    await agent.start()
    try:
        async with ReachClient(router.url) as client, client.stream("talk", {}) as stream:
            got: list[Any] = []
            async for chunk in stream:
                got.append(chunk)
                if len(got) == 1:
                    assert yielded == ["Hel"]  # the agent has not yielded its last yet
                    caller_has_first.set()
            assert got == ["Hel", "lo"]
            assert stream.response.ok
            assert stream.response.handler_agent_id == "sdk-agent"
    finally:
        await agent.stop()


async def test_a_plain_caller_of_a_streaming_handler_gets_the_list(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[int]:
        for n in range(3):
            yield n

    await agent.start()
    try:
        async with ReachClient(router.url) as client:
            resp = await client.call("talk", {})
        assert resp.ok and resp.result == [0, 1, 2]
    finally:
        await agent.stop()


async def test_a_plain_handler_streams_as_one_chunk(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("echo",)))
    agent.capability("echo")(lambda payload: {"echo": payload})
    await agent.start()
    try:
        async with ReachClient(router.url) as client, client.stream("echo", {"x": 1}) as stream:
            assert [c async for c in stream] == [{"echo": {"x": 1}}]
            assert stream.response.ok
    finally:
        await agent.stop()


async def test_an_agent_error_mid_stream_ends_it_with_the_agents_error(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yield "partial"
        raise AgentError("the model went away", code="MODEL_DOWN")

    await agent.start()
    try:
        async with ReachClient(router.url) as client, client.stream("talk", {}) as stream:
            assert [c async for c in stream] == ["partial"]
            assert stream.response.status == "AGENT_ERROR"
            assert stream.response.error is not None and stream.response.error.code == "MODEL_DOWN"
    finally:
        await agent.stop()


async def test_a_decline_before_any_chunk_is_a_plain_refusal(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        if payload.get("never", True):
            raise Decline("not mine")
        yield "never"

    await agent.start()
    try:
        async with ReachClient(router.url) as client, client.stream("talk", {}) as stream:
            assert [c async for c in stream] == []
            assert stream.response.status == "NO_AVAILABLE_HANDLER"
    finally:
        await agent.stop()


async def test_cancelling_the_iteration_closes_the_call_and_the_generator(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))
    closed = asyncio.Event()

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[int]:
        try:
            n = 0
            while True:  # an endless answer: only the caller's going away ends it
                yield n
                n += 1
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    await agent.start()
    try:
        async with ReachClient(router.url) as client:

            async def read() -> None:
                async with client.stream("talk", {}, timeout_ms=60_000) as stream:
                    async for _ in stream:
                        pass

            reader = asyncio.create_task(read())
            dispatcher = router.app.parts.dispatcher
            await until(lambda: dispatcher.streams_in_flight > 0, "the stream to be relayed")
            reader.cancel()
            async with asyncio.timeout(scaled(5)):
                await closed.wait()  # the Router closed the agent's connection; the generator ended
            assert reader.cancelled()
    finally:
        await agent.stop()


async def test_ctx_stream_relays_another_agents_chunks(router: RouterServer) -> None:
    inner = ReachAgent(agent_config(router.url, agent_id="inner", tasks=("words",)))
    outer = ReachAgent(agent_config(router.url, agent_id="outer", tasks=("shout",)))

    @inner.capability("words")
    async def words(payload: dict[str, Any]) -> AsyncIterator[str]:
        for word in ("a", "b"):
            yield word

    @outer.capability("shout")
    async def shout(payload: dict[str, Any], ctx: ReachContext) -> AsyncIterator[str]:
        async with ctx.stream("words", {}) as stream:
            async for word in stream:
                yield word.upper()

    await inner.start()
    await outer.start()
    try:
        async with ReachClient(router.url) as client, client.stream("shout", {}) as stream:
            assert [c async for c in stream] == ["A", "B"]
            assert stream.response.ok
    finally:
        await outer.stop()
        await inner.stop()


async def test_sync_client_streams(router: RouterServer) -> None:
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yield "x"
        yield "y"

    await agent.start()
    try:

        def call() -> tuple[list[Any], str]:
            with SyncReachClient(router.url) as client, client.stream("talk", {}) as stream:
                got = list(stream)
                return got, stream.response.status

        got, status = await asyncio.to_thread(call)
        assert got == ["x", "y"] and status == "SUCCESS"
        assert threading.current_thread() is threading.main_thread()
    finally:
        await agent.stop()


def test_a_plain_generator_handler_is_refused_when_bound() -> None:
    """`def` with `yield` (not `async def`): refused at the decorator, saying how to stream. It was
    bound, and every call then failed 'the handler's result is not JSON-serialisable'."""
    agent = ReachAgent(agent_config("http://127.0.0.1:9", tasks=("count",)))
    with pytest.raises(ConfigError, match="async def"):

        @agent.capability("count")
        def count(payload: dict) -> Any:
            yield 1


@pytest.mark.parametrize("own", [ConnectionResetError("a model's socket"), TimeoutError("a model's call")])
async def test_a_handlers_own_reset_or_timeout_is_its_failure(router: RouterServer, own: Exception) -> None:
    """A streaming handler whose own call fails with ConnectionResetError or TimeoutError (a
    model's socket, an ``asyncio.wait_for``): its stream ends with HANDLER_FAILED in its done.
    The reset was taken for the Router going away (no done at all: the caller read
    STREAM_BROKEN, and nothing was logged), the timeout for the request's deadline."""
    agent = ReachAgent(agent_config(router.url, tasks=("talk",)))

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yield "partial"
        raise own

    await agent.start()
    try:
        async with ReachClient(router.url) as client, client.stream("talk", {}) as stream:
            assert [c async for c in stream] == ["partial"]
            assert stream.response.status == "AGENT_ERROR"
            assert stream.response.error is not None and stream.response.error.code == "HANDLER_FAILED"
    finally:
        await agent.stop()


async def test_a_handler_past_the_requests_deadline_ends_with_deadline_exceeded(router: RouterServer) -> None:
    """The request's own deadline (X-Reach-Deadline-Ms) still ends a stream DEADLINE_EXCEEDED,
    told apart from a timeout of the handler's own by the deadline's scope."""
    config = agent_config(router.url, tasks=("talk",))
    agent = ReachAgent(config)

    @agent.capability("talk")
    async def talk(payload: dict[str, Any]) -> AsyncIterator[str]:
        yield "partial"
        await asyncio.Event().wait()  # never: only the deadline ends it

    await agent.start()
    try:
        envelope = {"version": "1.0", "targetTask": "talk", "payload": {}}
        headers = {"Accept": "text/event-stream", "X-Reach-Deadline-Ms": str(int(scaled(0.3) * 1000))}
        async with httpx.AsyncClient(timeout=scaled(10)) as http:
            resp = await http.post(config.profile.network.endpoint, json=envelope, headers=headers)
        events = SseParser().feed(resp.content)
        assert [e.event for e in events] == ["chunk", "done"]
        assert orjson.loads(events[-1].data)["error"]["code"] == "DEADLINE_EXCEEDED"
    finally:
        await agent.stop()
