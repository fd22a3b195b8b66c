"""Streamed answers through a real Router (protocol §14): raw streaming agents on loopback, a
caller reading the Router's event stream as it comes.

Each agent's chunks leave when the test says (events, not sleeps), so "the caller got chunk 1
before the agent sent chunk 2" is a fact of the run, not a timing guess.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.ports import free_port
from reachmesh.resilience.breaker import BreakerState
from reachmesh.sse import SseEvent, SseParser
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until
from tests.server.test_response_writes import Answers
from tests.streaming_agents import Conn, StreamAgent

STREAM_HEADERS = {"Accept": "text/event-stream"}


def envelope(**prefs: Any) -> dict[str, Any]:
    return {"version": "1.0", "targetTask": "talk", "payload": {"q": "hi"}, "preferences": prefs}


class CallerStream:
    """The caller's side: the Router's answer to one streamed call, event by event."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._parser = SseParser()
        self._events: list[SseEvent] = []
        self._raw = response.aiter_raw()

    async def next(self) -> SseEvent:
        async with asyncio.timeout(scaled(10)):
            while not self._events:
                data = await anext(self._raw)
                self._events.extend(self._parser.feed(data))
        return self._events.pop(0)

    async def rest(self) -> list[SseEvent]:
        out = []
        while True:
            event = await self.next()
            out.append(event)
            if event.event == "done":
                return out


@contextlib.asynccontextmanager
async def streamed(router: RouterServer, body: dict[str, Any]) -> AsyncIterator[CallerStream]:
    async with (
        httpx.AsyncClient(timeout=scaled(10)) as http,
        http.stream("POST", f"{router.url}/reach", json=body, headers=STREAM_HEADERS) as resp,
    ):
        yield CallerStream(resp)


def done_of(events: list[SseEvent]) -> dict[str, Any]:
    assert events[-1].event == "done"
    assert [e.event for e in events[:-1]] == ["chunk"] * (len(events) - 1)
    return dict(orjson.loads(events[-1].data))


def chunks_of(events: list[SseEvent]) -> list[Any]:
    return [orjson.loads(e.data) for e in events if e.event == "chunk"]


@pytest.fixture
async def router_with() -> AsyncIterator[Callable[..., Awaitable[RouterServer]]]:
    """A Router with the given policy; stopped at the end."""
    stack = contextlib.AsyncExitStack()

    async def make(policy: dict[str, Any] | None = None) -> RouterServer:
        return await stack.enter_async_context(RouterServer(RouterConfig.model_validate(policy or {})))

    async with stack:
        yield make


@pytest.fixture
async def agents() -> AsyncIterator[Callable[..., Awaitable[StreamAgent]]]:
    started: list[StreamAgent] = []

    async def make(
        agent_id: str, script: Callable[[Conn], Awaitable[None]], router: RouterServer
    ) -> StreamAgent:
        agent = await StreamAgent(agent_id, script).start()
        started.append(agent)
        await agent.register(router.url)
        return agent

    yield make
    for agent in started:
        await agent.stop()


async def test_chunks_reach_the_caller_as_the_agent_sends_them(router_with, agents) -> None:
    router = await router_with()
    go = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk({"text": "Hel"})
        await go.wait()  # the second chunk waits until the caller has the first
        await conn.chunk({"text": "lo"})
        await conn.done({"status": "SUCCESS", "result": {"tokens": 2}})

    agent = await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        first = await stream.next()
        assert first == SseEvent("chunk", '{"text":"Hel"}')
        go.set()
        events = [first, *await stream.rest()]
    assert chunks_of(events) == [{"text": "Hel"}, {"text": "lo"}]
    done = done_of(events)
    assert done["status"] == "SUCCESS"
    assert done["handlerAgentId"] == "talker"
    assert done["result"] == {"tokens": 2}
    assert done["traceId"] and [a["outcome"] for a in done["attempts"]] == ["SUCCESS"]
    assert agent.conns[0].header("accept") == "text/event-stream"
    # The trace and the metrics saw the stream: its first chunk, its chunks and bytes, its end.
    hop = router.app.parts.traces.hops(done["traceId"])[0]
    stream = hop["stream"]
    assert stream["chunks"] == 2 and stream["ended"] == "done"
    assert stream["bytes"] == len(b'{"text":"Hel"}{"text":"lo"}')
    assert 0 < stream["firstChunkMs"] <= stream["marksMs"][1] <= hop["durationMs"]
    metrics = router.app.parts.metrics
    assert metrics.streams.values[("done",)] == 1
    assert metrics.stream_bytes.values[("talk",)] == stream["bytes"]
    exposition = metrics.exposition().decode()
    assert "reach_stream_first_chunk_seconds_count" in exposition
    assert "reach_streams_in_flight 0.0" in exposition


async def test_failover_before_the_first_chunk(router_with, agents) -> None:
    router = await router_with()
    calls = 0

    async def script(conn: Conn) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # whichever agent is tried first fails before any chunk
            await conn.json({"error": "boom"}, status=500)
            return
        await conn.sse_head()
        await conn.chunk(conn.envelope["targetAgent"])
        await conn.done()

    await agents("a", script, router)
    await agents("b", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "SUCCESS"
    assert [a["outcome"] for a in done["attempts"]] == ["agent_error", "SUCCESS"]
    assert chunks_of(events) == [done["handlerAgentId"]]
    assert done["result"] is None  # the agent's done had none


async def test_a_break_after_the_first_chunk_ends_the_stream_and_never_fails_over(
    router_with, agents
) -> None:
    router = await router_with({"breaker": {"failure_threshold": 1}})

    async def breaks(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("from-a")
        conn.reset()

    async def healthy(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("from-b")
        await conn.done()

    a = await agents("a", breaks, router)
    b = await agents("b", healthy, router)
    async with streamed(router, envelope(filterAgentIds=["a"])) as stream:
        events = await stream.rest()
    assert chunks_of(events) == ["from-a"]
    done = done_of(events)
    assert done["status"] == "AGENT_ERROR"
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert done["handlerAgentId"] == "a"
    assert len(a.conns) == 1 and b.conns == []
    # Booked a success at its first chunk, the attempt's break still reaches the breaker.
    assert router.app.parts.breakers.state("a") is BreakerState.OPEN


async def test_break_after_first_chunk_with_a_second_candidate_never_mixes_agents(
    router_with, agents
) -> None:
    router = await router_with()
    calls = 0

    async def script(conn: Conn) -> None:
        nonlocal calls
        calls += 1
        await conn.sse_head()
        await conn.chunk(conn.envelope["targetAgent"])
        if calls == 1:
            conn.reset()
            return
        await conn.done()

    await agents("a", script, router)
    await agents("b", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert len(chunks_of(events)) == 1 and calls == 1


async def test_plain_json_agent_to_a_streaming_caller_is_one_chunk_then_done(router_with) -> None:
    router = await router_with()
    agent = await FakeAgent("plain", tasks=("talk",), result={"answer": 42}).start()
    try:
        await agent.register(router.url, vectors=False)
        async with streamed(router, envelope()) as stream:
            events = await stream.rest()
    finally:
        await agent.stop()
    assert chunks_of(events) == [{"answer": 42}]
    done = done_of(events)
    assert done["status"] == "SUCCESS" and done["handlerAgentId"] == "plain"


async def test_streaming_agent_to_a_plain_caller_is_the_list_of_chunks(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.sse_head()  # streams whatever the caller asked: the Router gathers it
        for piece in ("a", {"b": 1}, [2]):
            await conn.chunk(piece)
        await conn.done()

    agent = await agents("talker", script, router)
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope())
    assert resp.status_code == 200
    assert resp.json()["result"] == ["a", {"b": 1}, [2]]
    assert agent.conns[0].header("accept") != "text/event-stream"


async def test_streaming_agent_to_a_plain_caller_is_bounded_by_the_answer_limit(router_with, agents) -> None:
    router = await router_with({"server": {"response_limit_bytes": 4096}})

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        for _ in range(100):
            await conn.chunk("x" * 100)
        await conn.done()

    await agents("talker", script, router)
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope())
    assert resp.json()["error"]["code"] == "RESPONSE_TOO_LARGE"


async def test_a_caller_that_goes_away_closes_the_agents_connection(router_with, agents) -> None:
    router = await router_with()
    closed = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.closed_by_router()  # the agent would talk for a long time yet
        closed.set()

    await agents("talker", script, router)
    async with streamed(router, envelope(timeoutMs=60_000)) as stream:
        assert (await stream.next()).event == "chunk"
    # The caller's connection is closed now: the Router closes the agent's within a second.
    async with asyncio.timeout(scaled(1.0)):
        await closed.wait()
    streams = router.app.parts.metrics.streams
    await until(lambda: streams.values.get(("caller_gone",)), "the stream's end to be counted")
    assert router.app.parts.dispatcher.streams_in_flight == 0


async def test_an_idle_agent_ends_the_stream(router_with, agents) -> None:
    idle_ms = int(scaled(0.3) * 1000)
    router = await router_with({"streaming": {"idle_timeout_ms": idle_ms}})
    closed = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.closed_by_router()
        closed.set()

    await agents("talker", script, router)
    async with streamed(router, envelope(timeoutMs=60_000)) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert "idle" in done["error"]["message"]
    async with asyncio.timeout(scaled(5)):
        await closed.wait()


async def test_the_deadline_mid_stream_is_a_timeout(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.closed_by_router()

    await agents("talker", script, router)
    async with streamed(router, envelope(timeoutMs=int(scaled(0.5) * 1000))) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "TIMEOUT"
    assert chunks_of(events) == ["first"]
    assert "default" not in done["error"]["message"]  # the caller chose this budget


async def test_a_stream_cut_by_the_default_budget_says_that_timeoutMs_sets_it(router_with, agents) -> None:
    """A caller that gave no timeoutMs has the Router's default budget (5 s unless the policy
    says otherwise), short for a stream: the TIMEOUT said only "the overall budget of 5000 ms ran
    out mid-stream", as if the caller had chosen it. It says where the figure came from."""
    budget_ms = int(scaled(0.5) * 1000)
    router = await router_with({"timeouts": {"overall_ms": budget_ms}})

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.closed_by_router()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "TIMEOUT"
    message = done["error"]["message"]
    assert f"the overall budget of {budget_ms} ms (the Router's default: " in message
    assert "preferences.timeoutMs" in message


async def test_a_malformed_event_after_the_first_chunk_ends_the_stream(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.write(b"event: chunk\ndata: {not json\n\n")
        await conn.closed_by_router()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert "not JSON" in done["error"]["message"]


async def test_a_malformed_stream_before_any_chunk_is_a_structured_error(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.write(b"event: chunk\ndata: \xff\xfe\n\n")
        await conn.closed_by_router()

    await agents("talker", script, router)
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope(), headers=STREAM_HEADERS)
    assert resp.status_code == 503  # no chunk went out: a plain ReachResponse, never a 500
    body = resp.json()
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    assert body["error"]["candidates"][0]["reason"] == "agent_error"


async def test_the_byte_bound_ends_the_stream(router_with, agents) -> None:
    router = await router_with({"streaming": {"max_bytes": 4096}})
    go = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await go.wait()
        for _ in range(100):
            await conn.chunk("x" * 100)
        await conn.done()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = [await stream.next()]
        go.set()
        events += await stream.rest()
    done = done_of(events)
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert "4096-byte limit" in done["error"]["message"]
    assert 0 < len(chunks_of(events)) < 40


async def test_empty_events_count_against_the_byte_bound(router_with, agents) -> None:
    """The Router's cost of a stream is per line as much as per byte: each line counts 64 bytes
    more than it has against ``streaming.max_bytes``, so 2,000 empty events (14,000 bytes, under
    the bound as bytes) end a stream bounded at 64 KiB instead of costing a line each for free."""
    router = await router_with({"streaming": {"max_bytes": 65536}})

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.write(b"data:\n\n" * 2000)
        await conn.done()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["error"]["code"] == "STREAM_BROKEN"
    assert "65536-byte limit" in done["error"]["message"]
    assert chunks_of(events) == ["first"]


async def test_the_agents_own_error_in_its_done_is_the_answer(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("partial")
        await conn.done({"status": "AGENT_ERROR", "error": {"code": "MODEL_OVERLOADED", "message": "no"}})

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "AGENT_ERROR" and done["error"]["code"] == "MODEL_OVERLOADED"


async def test_async_mode_cannot_be_streamed(router_with) -> None:
    router = await router_with()
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope(mode="async"), headers=STREAM_HEADERS)
    assert resp.status_code == 400
    body = resp.json()
    assert body["status"] == "INVALID_REQUEST"
    assert "cannot be streamed" in body["error"]["message"]
    assert body["error"]["details"][0]["field"] == "preferences.mode"


async def test_no_agent_for_a_streamed_call_is_a_plain_error(router_with) -> None:
    router = await router_with()
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope(), headers=STREAM_HEADERS)
    assert resp.status_code == 503
    assert resp.json()["status"] == "NO_AVAILABLE_HANDLER"


async def test_a_slow_caller_slows_the_agent(router_with, agents) -> None:
    """Backpressure: while the caller reads nothing, the agent's writes stop well short of its
    answer; nothing in between gathers it."""
    router = await router_with({"streaming": {"max_bytes": 1 << 30}})
    piece = "y" * (512 * 1024)
    total = 256  # 128 MiB if it were all gathered
    finished = asyncio.Event()
    seen: list[Conn] = []

    async def script(conn: Conn) -> None:
        seen.append(conn)
        await conn.sse_head()
        for _ in range(total):
            await conn.chunk(piece)
        await conn.done()
        finished.set()

    await agents("talker", script, router)
    async with streamed(router, envelope(timeoutMs=120_000)) as stream:
        assert (await stream.next()).event == "chunk"
        # Wait until the agent's writes have stopped moving (the buffers between are full).
        last, still = -1, 0
        async with asyncio.timeout(scaled(30)):
            while still < 5:
                await asyncio.sleep(0.1)
                now = seen[0].written
                still = still + 1 if now == last else 0
                last = now
        assert not finished.is_set()
        assert seen[0].written < 48 * 1024 * 1024
        count = 1 + len(chunks_of(await stream.rest()))
    assert count == total


async def test_a_reset_before_the_answer_is_retried_on_the_same_agent(router_with, agents) -> None:
    router = await router_with()
    calls = 0

    async def script(conn: Conn) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            conn.reset()  # a network error before the answer: the same agent once more
            return
        await conn.sse_head()
        await conn.chunk("whole")
        await conn.done()

    agent = await agents("only", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "SUCCESS" and chunks_of(events) == ["whole"]
    assert [a["outcome"] for a in done["attempts"]] == ["connect_error", "SUCCESS"]
    assert len(agent.conns) == 2


async def test_a_decline_in_the_done_before_any_chunk_tries_the_next_agent(router_with, agents) -> None:
    router = await router_with()

    async def declines(conn: Conn) -> None:
        await conn.sse_head()
        await conn.done({"status": "DECLINED", "error": {"code": "DECLINED", "message": "not mine"}})

    async def answers(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("mine")
        await conn.done()

    await agents("a", declines, router)
    await agents("b", answers, router)
    async with streamed(router, envelope(filterAgentIds=["a", "b"])) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert done["status"] == "SUCCESS" and done["handlerAgentId"] == "b"
    assert chunks_of(events) == ["mine"]


async def test_a_compressed_stream_is_refused(router_with, agents) -> None:
    router = await router_with()

    async def gzipped(conn: Conn) -> None:
        await conn.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            b"Connection: close\r\n\r\n"
        )
        await conn.closed_by_router()

    await agents("a", gzipped, router)
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope(), headers=STREAM_HEADERS)
    assert resp.status_code == 503
    assert resp.json()["error"]["candidates"][0]["reason"] == "agent_error"


async def test_the_trace_keeps_the_first_chunk_times_and_the_last_for_the_waterfall(
    router_with, agents
) -> None:
    """A long stream's trace holds at most MAX_CHUNK_MARKS chunk times (the trace store's memory
    stays bounded), and the last chunk's time besides, so the waterfall shows where it ended."""
    from reachmesh.decision import MAX_CHUNK_MARKS

    router = await router_with()
    total = MAX_CHUNK_MARKS + 50

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        for n in range(total):
            await conn.chunk(n)
        await conn.done()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = [await stream.next(), *await stream.rest()]
    assert chunks_of(events) == list(range(total))
    async with httpx.AsyncClient() as http:
        trace = (await http.get(f"{router.url}/admin/traces/{done_of(events)['traceId']}")).json()
    (hop,) = trace["hops"]
    kept = hop["stream"]
    assert kept["chunks"] == total and len(kept["marksMs"]) == MAX_CHUNK_MARKS
    assert kept["marksMs"] == sorted(kept["marksMs"])
    assert kept["firstChunkMs"] == kept["marksMs"][0] <= kept["marksMs"][-1] <= kept["lastChunkMs"]
    assert kept["lastChunkMs"] <= hop["durationMs"]


CHUNKED_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


DONE_EVENT = b'event: done\ndata: {"status":"SUCCESS"}\n\n'


class KeepAliveAgent:
    """A raw agent that keeps its connections alive: a streamed answer (chunked events) to a
    request that asks for one, a plain JSON answer to any other; it counts connections and
    keeps each request's head."""

    def __init__(self) -> None:
        self.port = free_port()
        self.connections = 0
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> KeepAliveAgent:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.heads.append(head)
                if b"accept: text/event-stream" not in head.lower():
                    body = orjson.dumps({"status": "SUCCESS", "result": "plain"})
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                writer.write(CHUNKED_SSE_HEAD)
                for event in (b'event: chunk\ndata: "one"\n\n', DONE_EVENT):
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        writer.close()


async def test_a_streams_connection_to_the_agent_serves_the_next_call(router_with) -> None:
    """A stream runs on the pool's own connections: read to its end, its connection carries the
    next call, plain or streamed (streams ran on a second client, with connections of its own);
    the agent is asked for the stream with one Accept header."""
    router = await router_with()
    async with KeepAliveAgent() as agent, httpx.AsyncClient(timeout=scaled(10)) as http:
        profile = {
            "id": "keeper",
            "network": {"endpoint": f"http://127.0.0.1:{agent.port}/reach"},
            "capabilities": [{"task": "talk"}],
        }
        assert (await http.post(f"{router.url}/agents", json=profile)).status_code == 201
        async with streamed(router, envelope()) as stream:
            assert chunks_of(await stream.rest()) == ["one"]
        plain = (await http.post(f"{router.url}/reach", json=envelope())).json()
        assert plain["status"] == "SUCCESS" and plain["result"] == "plain"
        async with streamed(router, envelope()) as stream:
            assert chunks_of(await stream.rest()) == ["one"]
    assert len(agent.heads) == 3
    assert agent.connections == 1
    accepts = [line for line in agent.heads[0].lower().split(b"\r\n") if line.startswith(b"accept:")]
    assert accepts == [b"accept: text/event-stream"]


async def test_a_streamed_answer_ends_its_response_and_the_callers_connection_goes_on(
    router_with, agents
) -> None:
    """The relay writes the caller's response itself (not through ASGI send): it still ends the
    response so that the caller's next call on the same connection is served, and closes the
    connection after a stream when the caller asked for that."""
    router = await router_with()

    async def script(conn: Conn) -> None:
        if conn.header("Accept") != "text/event-stream":
            await conn.json({"status": "SUCCESS", "result": "plain"})
            return
        await conn.sse_head()
        await conn.chunk("a")
        await conn.chunk("b")
        await conn.done()

    await agents("talker", script, router)
    port = int(router.url.rsplit(":", 1)[1])
    body = orjson.dumps(envelope())

    def call(extra: bytes) -> bytes:
        return (
            b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (extra, len(body), body)
        )

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = Answers()
    try:
        for extra, count in ((b"Accept: text/event-stream\r\n", 1), (b"", 2)):
            writer.write(call(extra))
            async with asyncio.timeout(scaled(10)):
                while len(answers.done) < count:
                    data = await reader.read(65536)
                    assert data, "the Router closed the connection"
                    answers.parser.feed_data(data)
        writer.write(call(b"Accept: text/event-stream\r\nConnection: close\r\n"))
        async with asyncio.timeout(scaled(10)):
            while data := await reader.read(65536):
                answers.parser.feed_data(data)
    finally:
        writer.close()
    (s1, h1, b1), (s2, _, b2), (s3, h3, b3) = answers.done
    assert s1 == s2 == s3 == 200
    events = SseParser().feed(b1)
    assert [e.event for e in events] == ["chunk", "chunk", "done"]
    assert chunks_of(events) == ["a", "b"]
    assert (b"content-type", b"text/event-stream; charset=utf-8") in h1
    assert orjson.loads(b2)["result"] == "plain"
    assert (b"connection", b"close") in h3 and [e.event for e in SseParser().feed(b3)][-1] == "done"
