"""Busy is not broken (issue #34): capacity, queues and pool waits, through a real Router and real
agents on loopback. Answers are held back with ``FakeAgent.hold``, never by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import scaled, until

MakeAgent = Callable[..., Awaitable[FakeAgent]]


@pytest.fixture
async def cluster(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, MakeAgent]]:
    marker = request.node.get_closest_marker("policy")
    policy: dict[str, Any] = {"health": {"enabled": False}, "breaker": {"failure_threshold": 1}}
    if marker is not None:
        for section, values in marker.args[0].items():
            policy[section] = {**policy.get(section, {}), **values}
    started: list[FakeAgent] = []
    async with RouterServer(RouterConfig.from_mapping(policy)) as server:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=scaled(30), limits=limits) as http:

            async def make(agent_id: str, **kwargs: Any) -> FakeAgent:
                agent = await FakeAgent(agent_id, **kwargs).start()
                started.append(agent)
                await agent.register(server.url, vectors=False)
                return agent

            yield server, http, make
        for agent in started:
            await agent.stop()


def call(http: httpx.AsyncClient, task: str = "echo", **prefs: Any) -> Awaitable[httpx.Response]:
    return http.post("/reach", json={"targetTask": task, "payload": {}, "preferences": prefs})


async def circuit(http: httpx.AsyncClient, agent_id: str) -> str:
    return str((await http.get(f"/admin/agents/{agent_id}")).json()["circuit"])


async def test_an_agent_never_has_more_than_its_capacity_in_flight_and_the_rest_wait(cluster) -> None:
    """max_concurrency 2 and six calls at once: two reach the agent, four wait in the Router (first
    come, first served); when it answers, every call succeeds and its breaker stays closed."""
    server, http, make = cluster
    agent = await make("small", max_concurrency=2, hold=asyncio.Event())
    # Two calls are held at the agent while the rest queue and the test reads the admin view and
    # the metrics: their read timeout (3 s by default, not scaled) must not end them first on a
    # busy machine, nor the queued ones' default deadline.
    held_ms = int(scaled(20_000))
    calls = [asyncio.ensure_future(call(http, timeoutMs=held_ms, readTimeoutMs=held_ms)) for _ in range(6)]
    capacity = server.app.parts.dispatcher.forwarding.capacity
    await until(lambda: capacity.queued("small") == 4 and len(agent.received) == 2, "two sent, four queued")
    assert capacity.inflight("small") == 2
    row = (await http.get("/admin/agents/small")).json()
    assert (row["inflight"], row["capacity"], row["queued"]) == (2, 2, 4)
    metrics = (await http.get("/metrics")).text
    assert 'reach_agent_queued_requests{agent="small"} 4.0' in metrics
    assert agent.hold is not None
    agent.hold.set()
    answers = await asyncio.gather(*calls)
    assert [a.json()["status"] for a in answers] == ["SUCCESS"] * 6
    assert len(agent.received) == 6
    assert await circuit(http, "small") == "closed"
    metrics = (await http.get("/metrics")).text
    assert 'reach_queue_wait_seconds_count{agent="small"} 4.0' in metrics
    waited = 0
    for a in answers:
        trace = (await http.get(f"/admin/traces/{a.json()['traceId']}")).json()
        (hop,) = trace["hops"]
        assert hop["poolWaitMs"] == 0
        if hop["slotWaitMs"] > 0:
            waited += 1
            assert "for a slot at a full agent" in _rendered(trace)
        else:
            assert "waited in the Router" not in _rendered(trace)
    assert waited == 4


def _rendered(trace: dict[str, Any]) -> str:
    """What ``reach trace`` prints for a trace."""
    from rich.console import Console

    from reachmesh.cli.timeline import render_trace

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_trace(trace))
    return console.export_text()


@pytest.mark.policy({"limits": {"max_queued_per_agent": 2}})
async def test_a_full_agents_callers_get_overloaded_or_their_timeout_within_the_deadline(cluster) -> None:
    """Capacity 1, at most two waiting: a fourth call is answered OVERLOADED with Retry-After at
    once; the two waiting ones end TIMEOUT at their deadline (never a hang); the breaker stays
    closed, and once the agent answers it serves again."""
    _server, http, make = cluster
    agent = await make("one", max_concurrency=1, hold=asyncio.Event())
    first = asyncio.ensure_future(
        call(http, timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(agent.received) == 1, "the first call at the agent")
    deadline_ms = int(scaled(1500))
    waiting = [asyncio.ensure_future(call(http, timeoutMs=deadline_ms)) for _ in range(2)]
    server_caps = _server.app.parts.dispatcher.forwarding.capacity
    await until(lambda: server_caps.queued("one") == 2, "two calls waiting")
    loop = asyncio.get_running_loop()
    began = loop.time()
    refused = await call(http, timeoutMs=deadline_ms)
    assert refused.status_code == 429
    assert refused.json()["status"] == "OVERLOADED"
    assert refused.headers["Retry-After"] == "1"
    assert loop.time() - began < scaled(1.0)
    for waited in await asyncio.gather(*waiting):
        assert waited.json()["status"] == "TIMEOUT"
    assert loop.time() - began < scaled(1.5) + scaled(3.0)
    assert len(agent.received) == 1
    assert await circuit(http, "one") == "closed"
    assert agent.hold is not None
    agent.hold.set()
    assert (await first).json()["status"] == "SUCCESS"
    assert (await call(http)).json()["status"] == "SUCCESS"


@pytest.mark.policy({"outbound": {"max_connections": 1}})
async def test_a_wait_for_the_routers_own_pool_is_not_charged_to_the_agent(cluster) -> None:
    """A pool of one connection held by a slow agent: a call to a healthy agent waits for the pool
    until its deadline. It ends TIMEOUT, but no connection was ever opened to that agent, so its
    breaker (threshold 1) stays closed and its success rate untouched; it serves once there is room."""
    _server, http, make = cluster
    slow = await make("slow", tasks=("slow",), hold=asyncio.Event())
    healthy = await make("healthy")
    held = asyncio.ensure_future(
        call(http, "slow", timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(slow.received) == 1, "the slow agent holds the pool's one connection")
    waited = (await call(http, timeoutMs=int(scaled(600)))).json()
    assert waited["status"] == "TIMEOUT", waited
    (hop,) = (await http.get(f"/admin/traces/{waited['traceId']}")).json()["hops"]
    assert hop["poolWaitMs"] > scaled(600) / 2 and hop["slotWaitMs"] == 0, hop
    assert healthy.received == []
    row = (await http.get("/admin/agents/healthy")).json()
    assert row["circuit"] == "closed"
    assert row["stats"]["successRate"] == 1.0
    assert slow.hold is not None
    slow.hold.set()
    assert (await held).json()["status"] == "SUCCESS"
    served = (await call(http)).json()
    assert served["status"] == "SUCCESS" and served["handlerAgentId"] == "healthy"


@pytest.mark.policy({"outbound": {"max_connections": 16, "max_connections_per_agent": 8}})
async def test_after_a_burst_at_one_agent_a_new_agent_serves_at_once_and_stays_available(cluster) -> None:
    """Forty calls held by one agent fill its share of the pool and queue; a new agent on another
    task registers meanwhile and serves at once, every time, and stays available; the first
    agent's breaker stays closed through the burst, and every call of it is answered."""
    _server, http, make = cluster
    busy = await make("busy", tasks=("slow",), hold=asyncio.Event())
    burst = [
        asyncio.ensure_future(
            call(http, "slow", timeoutMs=int(scaled(30_000)), readTimeoutMs=int(scaled(30_000)))
        )
        for _ in range(40)
    ]
    await until(lambda: len(busy.received) == 8, "the busy agent's share of the pool in use")
    fresh = await make("fresh", tasks=("other",))
    assert fresh.health_probes == 0
    for _ in range(5):
        answer = (await call(http, "other", timeoutMs=int(scaled(5_000)))).json()
        assert answer["status"] == "SUCCESS" and answer["handlerAgentId"] == "fresh", answer
    assert len(fresh.received) == 5
    row = (await http.get("/admin/agents/fresh")).json()
    assert row["status"] == "available" and row["circuit"] == "closed"
    assert len(busy.received) == 8  # the rest wait for its connections, not a burst of connects
    assert busy.hold is not None
    busy.hold.set()
    answers = await asyncio.gather(*burst)
    assert [a.json()["status"] for a in answers] == ["SUCCESS"] * 40
    assert await circuit(http, "busy") == "closed"


class _DropsTheSecond:
    """An agent on a raw socket: it answers the first request on each connection and keeps it
    alive; it reads the second one, then closes the connection without a byte of answer."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _DropsTheSecond:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        body = await reader.readexactly(length)
        self.seen.append(body)
        return body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await self._read(reader)
            body = b'{"status": "SUCCESS", "result": {"ok": true}}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            writer.write(body)
            await writer.drain()
            await self._read(reader)
        writer.close()

    def profile(self, *, idempotent: bool, weight: float = 1.0) -> dict[str, Any]:
        return {
            "id": "dropper",
            "network": {"endpoint": f"http://127.0.0.1:{self.port}/reach"},
            "capabilities": [{"task": "echo", "idempotent": idempotent, "routing_weight": weight}],
        }


@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_agent_that_closes_a_reused_connection_after_reading_sees_the_request_once(
    cluster, idempotent: bool
) -> None:
    """The second call is read by the agent, which then drops the kept-alive connection. For a
    capability not marked idempotent the Router does not send it again (it did, twice: on a fresh
    connection, then as a same-agent retry), and the caller learns it failed; an idempotent one is
    sent again, and succeeds."""
    _server, http, _make = cluster
    async with _DropsTheSecond() as agent:
        registered = await http.post("/agents", json=agent.profile(idempotent=idempotent))
        assert registered.status_code == 201
        assert (await call(http)).json()["status"] == "SUCCESS"
        second = (await call(http)).json()
        if idempotent:
            assert second["status"] == "SUCCESS"
            assert len(agent.seen) == 3
        else:
            assert second["status"] != "SUCCESS"
            assert len(agent.seen) == 2, "the second request was delivered more than once"
            assert [a["outcome"] for a in second["attempts"]] == ["connect_error"]


async def test_candidates_left_untried_after_an_unknown_outcome_say_why(cluster) -> None:
    """The dropper (leading by weight) reads the second call and drops the connection: the
    Router does not fail over (the capability is not idempotent), and the spare agent is listed
    with reason not_idempotent, not budget_exhausted (no budget ran out), and is never sent it."""
    _server, http, make = cluster
    spare = await make("spare")
    async with _DropsTheSecond() as agent:
        registered = await http.post("/agents", json=agent.profile(idempotent=False, weight=100))
        assert registered.status_code == 201, registered.text
        assert (await call(http)).json()["handlerAgentId"] == "dropper"
        second = (await call(http)).json()
    assert second["status"] == "NO_AVAILABLE_HANDLER", second
    reasons = {c["agentId"]: c["reason"] for c in second["error"]["candidates"]}
    assert reasons == {"dropper": "connect_error", "spare": "not_idempotent"}
    assert spare.received == []
    # The trace says what failed, not only its reason.
    (hop,) = (await http.get(f"/admin/traces/{second['traceId']}")).json()["hops"]
    forwards = [e["text"] for e in hop["events"] if e["kind"] == "forward"]
    assert len(forwards) == 1 and "outcome=connect_error (ServerDisconnected: " in forwards[0], forwards


async def test_the_router_sends_an_idempotency_key_the_same_on_every_attempt(cluster) -> None:
    _server, http, make = cluster
    agent = await make("keyed")
    answer = (
        await http.post("/reach", json={"traceId": "idem-1", "targetTask": "echo", "payload": {}})
    ).json()
    assert answer["status"] == "SUCCESS"
    key = agent.headers[0]["Idempotency-Key"]
    assert key.startswith("idem-1.") and len(key) > len("idem-1.")


async def test_a_transport_pool_of_one_does_not_fail_a_healthy_agent() -> None:
    """The review's demo, through the transport's own constructor: a pool of one connection, held
    by a slow agent, made a healthy agent's call an attempt timeout charged to its breaker, though
    no connection to it was ever opened. Now the wait is the pool's: the breaker stays closed."""
    from reachmesh.transport.http import HttpTransport

    policy = RouterConfig.from_mapping({"health": {"enabled": False}, "breaker": {"failure_threshold": 1}})
    slow = await FakeAgent("slow", tasks=("slow",), hold=asyncio.Event()).start()
    healthy = await FakeAgent("healthy").start()
    try:
        async with (
            RouterServer(policy, transport=HttpTransport(pool_size=1)) as server,
            httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http,
        ):
            await slow.register(server.url, vectors=False)
            await healthy.register(server.url, vectors=False)
            held = asyncio.ensure_future(
                call(http, "slow", timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
            )
            await until(lambda: len(slow.received) == 1, "the slow agent holds the one connection")
            await call(http, timeoutMs=int(scaled(600)))
            assert healthy.received == []
            assert await circuit(http, "healthy") == "closed"
            assert slow.hold is not None
            slow.hold.set()
            assert (await held).json()["status"] == "SUCCESS"
            assert (await call(http)).json()["handlerAgentId"] == "healthy"
    finally:
        await slow.stop()
        await healthy.stop()


async def test_a_burst_goes_mostly_to_the_agent_with_room(cluster) -> None:
    """Capacities 10 and 100, a hundred calls held: the small one never has more than 10, the big
    one takes the rest (at least 80 %), and nobody waits in the Router."""
    server, http, make = cluster
    small = await make("small", max_concurrency=10, hold=asyncio.Event())
    big = await make("big", max_concurrency=100, hold=asyncio.Event())
    slow: dict[str, Any] = {"timeoutMs": int(scaled(30_000)), "readTimeoutMs": int(scaled(30_000))}
    burst = [asyncio.ensure_future(call(http, **slow)) for _ in range(100)]
    await until(lambda: len(small.received) + len(big.received) == 100, "every call at an agent")
    assert len(small.received) <= 10 and len(big.received) >= 80
    assert server.app.parts.dispatcher.forwarding.capacity.queued("small") == 0
    for agent in (small, big):
        assert agent.hold is not None
        agent.hold.set()
    assert [a.json()["status"] for a in await asyncio.gather(*burst)] == ["SUCCESS"] * 100


async def _waited(since: float, seconds: float) -> None:
    """Until ``seconds`` have passed since the loop time ``since`` (a caller's time in a queue)."""
    loop = asyncio.get_running_loop()
    await until(lambda: loop.time() - since >= seconds, f"{seconds} s waited", within=seconds * 4)


async def test_a_waiter_whose_slot_came_too_late_to_answer_is_not_charged(cluster) -> None:
    """Capacity 1: a call waits for the slot until less than its read timeout is left, then the
    agent (busy, not broken) does not answer in what is left. The caller ends TIMEOUT within its
    deadline; the breaker (threshold 1) stays closed and the success rate untouched: the time the
    agent lacked was the Router's queue. (It was charged: a burst's tail opened the breaker.)"""
    server, http, make = cluster
    first_hold = asyncio.Event()
    agent = await make("one", max_concurrency=1, hold=first_hold)
    first = asyncio.ensure_future(
        call(http, timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(agent.received) == 1, "the first call at the agent")
    late = asyncio.ensure_future(call(http, timeoutMs=int(scaled(3000)), readTimeoutMs=int(scaled(2000))))
    capacity = server.app.parts.dispatcher.forwarding.capacity
    await until(lambda: capacity.queued("one") == 1, "the second call waiting for the slot")
    await _waited(asyncio.get_running_loop().time(), scaled(1.2))
    agent.hold = asyncio.Event()  # the second call is held at the agent past its deadline
    first_hold.set()
    assert (await first).json()["status"] == "SUCCESS"
    answer = (await late).json()
    assert answer["status"] == "TIMEOUT", answer
    if len(agent.received) == 2:  # it reached the agent (a stalled machine may time it out queued)
        trace = (await http.get(f"/admin/traces/{answer['traceId']}")).json()
        (hop,) = trace["hops"]
        assert hop["slotWaitMs"] >= scaled(1200) * 0.9, hop
    row = (await http.get("/admin/agents/one")).json()
    assert row["circuit"] == "closed", row
    assert row["stats"]["successRate"] == 1.0
    agent.hold.set()


@pytest.mark.policy({"outbound": {"max_connections": 1}})
async def test_a_call_whose_pool_wait_left_the_agent_too_little_time_is_not_charged(cluster) -> None:
    """The pool's one connection is held by a slow agent; a call to a healthy agent waits for it
    until less than the read timeout is left of its attempt, then that agent does not answer in
    what is left. Its breaker (threshold 1) stays closed: the wait was the Router's pool."""
    _server, http, make = cluster
    slow = await make("slow", tasks=("slow",), hold=asyncio.Event())
    healthy = await make("healthy", hold=asyncio.Event())
    held = asyncio.ensure_future(
        call(http, "slow", timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(slow.received) == 1, "the slow agent holds the pool's one connection")
    began = asyncio.get_running_loop().time()
    late = asyncio.ensure_future(call(http, timeoutMs=int(scaled(3000)), readTimeoutMs=int(scaled(2000))))
    await _waited(began, scaled(1.2))
    assert slow.hold is not None
    slow.hold.set()
    assert (await held).json()["status"] == "SUCCESS"
    answer = (await late).json()
    assert answer["status"] != "SUCCESS", answer
    row = (await http.get("/admin/agents/healthy")).json()
    assert row["circuit"] == "closed", (row, answer)
    assert row["stats"]["successRate"] == 1.0
    assert healthy.hold is not None
    healthy.hold.set()


@pytest.mark.policy({"outbound": {"max_connections": 1}, "breaker": {"open_seconds": scaled(2)}})
async def test_a_half_open_probe_that_waited_in_the_router_does_not_keep_the_agent_out(cluster) -> None:
    """The breaker of a recovered agent is due a probe; the probe waits for the Router's full pool
    until its deadline and never reaches the agent. The next call is the probe (and closes the
    breaker): the lost one kept the agent out for another open period (circuit_open)."""
    server, http, make = cluster
    agent = await make("flaky", mode="http500")
    slow = await make("slow", tasks=("slow",), hold=asyncio.Event())
    assert (await call(http)).json()["status"] != "SUCCESS"
    assert await circuit(http, "flaky") == "open"
    agent.mode = "ok"
    held = asyncio.ensure_future(
        call(http, "slow", timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(slow.received) == 1, "the slow agent holds the pool's one connection")
    breakers = server.app.parts.breakers
    await until(lambda: not breakers.blocked("flaky", "echo"), "a probe due", within=scaled(2) * 3)
    lost = (await call(http, timeoutMs=int(scaled(500)))).json()
    assert lost["status"] != "SUCCESS" and len(agent.received) == 1, lost
    assert slow.hold is not None
    slow.hold.set()
    assert (await held).json()["status"] == "SUCCESS"
    served = (await call(http)).json()
    assert served["status"] == "SUCCESS", served
    assert await circuit(http, "flaky") == "closed"


@pytest.mark.policy({"outbound": {"max_connections": 1}, "breaker": {"open_seconds": scaled(2)}})
async def test_a_probe_timing_out_in_what_a_wait_left_does_not_close_the_breaker(cluster) -> None:
    """A half-open probe waits for the Router's full pool, then the agent does not answer in what
    is left: charged to nobody, but no sign of life either. The breaker stays half-open (the next
    call probes again); it was closed, as by an answer."""
    server, http, make = cluster
    agent = await make("flaky", mode="http500")
    slow = await make("slow", tasks=("slow",), hold=asyncio.Event())
    assert (await call(http)).json()["status"] != "SUCCESS"
    assert await circuit(http, "flaky") == "open"
    agent.mode, agent.hold = "ok", asyncio.Event()
    held = asyncio.ensure_future(
        call(http, "slow", timeoutMs=int(scaled(20_000)), readTimeoutMs=int(scaled(20_000)))
    )
    await until(lambda: len(slow.received) == 1, "the slow agent holds the pool's one connection")
    breakers = server.app.parts.breakers
    await until(lambda: not breakers.blocked("flaky", "echo"), "a probe due", within=scaled(2) * 3)
    began = asyncio.get_running_loop().time()
    probe = asyncio.ensure_future(call(http, timeoutMs=int(scaled(3000)), readTimeoutMs=int(scaled(2000))))
    await _waited(began, scaled(1.2))
    assert slow.hold is not None
    slow.hold.set()
    assert (await held).json()["status"] == "SUCCESS"
    assert (await probe).json()["status"] != "SUCCESS"
    assert await circuit(http, "flaky") != "closed"
    agent.hold.set()
    assert (await call(http)).json()["status"] == "SUCCESS"
    assert await circuit(http, "flaky") == "closed"


@pytest.mark.policy({"limits": {"max_queued_per_agent": 3, "retry_after_seconds": 30}})
async def test_overloaded_retry_after_is_estimated_from_the_queue(cluster) -> None:
    """A full agent with three waiting, whose answers take half a second: the caller turned away
    was told to come back after the policy's fixed 30 s, whatever the queue held. Now it is the
    time the line ahead of it takes: service time x (waiting + 1) / capacity, here at least
    ceil(0.5 x 4 / 1) = 2 s, and well under the policy's ceiling."""
    server, http, make = cluster
    hold = asyncio.Event()
    hold.set()
    agent = await make("slow", max_concurrency=1, delay_s=0.5, hold=hold)
    assert (await call(http)).json()["status"] == "SUCCESS"  # one answer: its service time known
    hold.clear()
    prefs: dict[str, Any] = {"timeoutMs": int(scaled(20_000)), "readTimeoutMs": int(scaled(20_000))}
    held = [asyncio.ensure_future(call(http, "echo", **prefs)) for _ in range(4)]
    capacity = server.app.parts.dispatcher.forwarding.capacity
    await until(lambda: capacity.queued("slow") == 3 and len(agent.received) == 2, "one sent, three queued")
    refused = await call(http, "echo", **prefs)
    assert refused.status_code == 429, refused.text
    said = refused.json()["error"]["retryAfterSeconds"]
    assert refused.headers["Retry-After"] == str(said)
    assert 2 <= said < 30, said
    hold.set()
    assert [(await a).json()["status"] for a in held] == ["SUCCESS"] * 4
