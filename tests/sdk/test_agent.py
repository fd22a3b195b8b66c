"""ReachAgent and ReachClient against a real Router on loopback."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh import AgentConfig, AgentError, ReachAgent, ReachClient, ReachContext, SyncReachClient
from reachmesh.clock import ManualClock
from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError, RouterUnavailable
from reachmesh.redaction import fingerprint
from reachmesh.registry.base import AgentEntry
from reachmesh.sdk.lease import LeaseKeeper
from reachmesh.testing import RouterServer, free_port
from tests.helpers import scaled, until


def agent_config(
    router_url: str,
    agent_id: str = "sdk-agent",
    tasks: tuple[str, ...] = ("echo",),
    health_port: int | None = None,
) -> AgentConfig:
    port = free_port()
    health = {"port": health_port} if health_port else {}
    return AgentConfig.from_mapping(
        {
            "agent": {
                "id": agent_id,
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": t} for t in tasks],
                "health_check": health,
            },
            "router": {"url": router_url},
        },
        env={},
    )


# A short lease, so renewals come every 0.2 s (on a quiet machine); on a busy one a pause of
# two renewals must not lapse it, so it is scaled with the suite's other deadlines.
SHORT_TTL = scaled(0.6)


@pytest.fixture
async def short_router() -> AsyncIterator[RouterServer]:
    """A Router with a short lease (SHORT_TTL), so renewals come often."""
    config = RouterConfig.from_mapping(
        {"registry": {"lease_ttl_seconds": SHORT_TTL, "sweep_interval_seconds": 0.05}}
    )
    async with RouterServer(config) as server:
        yield server


async def test_registers_with_the_four_log_lines(
    router: RouterServer, caplog: pytest.LogCaptureFixture
) -> None:
    """start() registers and logs the four [reach-client] lines of §8; stop() deregisters."""
    caplog.set_level(logging.INFO, logger="reachmesh.sdk")
    agent = ReachAgent(agent_config(router.url, tasks=("echo", "other")))
    agent.capability("echo")(lambda payload: payload)
    agent.capability("other")(lambda payload: payload)
    await agent.start()
    try:
        lines = [r.getMessage() for r in caplog.records if "[reach-client]" in r.getMessage()]
        assert lines[:4] == [
            "[reach-client] registering agent: sdk-agent",
            "[reach-client] capabilities: echo, other",
            f"[reach-client] callback endpoint: {agent.config.profile.network.endpoint}",
            f"[reach-client] registration successful, lease id: {fingerprint(agent.lease_id)}",
        ]
        assert router.app.parts.registry.get("sdk-agent") is not None
    finally:
        await agent.stop()
    assert router.app.parts.registry.get("sdk-agent") is None


async def test_handlers_get_payload_and_context(router: RouterServer) -> None:
    """Async and sync handlers answer through the Router; ctx carries traceId and the deadline."""
    agent = ReachAgent(agent_config(router.url, tasks=("async_task", "sync_task")))
    seen: dict[str, Any] = {}

    @agent.capability("async_task")
    async def handle(payload: dict, ctx: ReachContext) -> dict:
        seen.update(trace=ctx.trace_id, remaining=ctx.remaining_ms, source=ctx.source_agent)
        return {"doubled": payload["n"] * 2}

    @agent.capability("sync_task")
    def handle_sync(payload: dict) -> dict:
        return {"thread": threading.current_thread().name != "MainThread"}

    await agent.start()
    try:
        async with ReachClient(router.url, source_agent="tester") as client:
            budget = int(scaled(3000))
            resp = await client.call("async_task", {"n": 21}, timeout_ms=budget, trace_id="sdk-trace-1")
            assert resp.ok and resp.result == {"doubled": 42}
            assert seen["trace"] == "sdk-trace-1"
            assert seen["source"] == "tester"
            assert budget - scaled(1000) < seen["remaining"] <= budget
            resp = await client.call("sync_task", {})
            assert resp.result == {"thread": True}
    finally:
        await agent.stop()


async def test_handler_errors_become_agent_errors(router: RouterServer) -> None:
    """AgentError keeps its code and retryable flag; other exceptions are HANDLER_FAILED."""
    agent = ReachAgent(agent_config(router.url, tasks=("refuse", "crash", "slow")))

    @agent.capability("refuse")
    async def refuse(payload: dict) -> dict:
        raise AgentError("out of stock", code="OUT_OF_STOCK")

    @agent.capability("crash")
    async def crash(payload: dict) -> dict:
        raise ValueError("bug")

    @agent.capability("slow")
    async def slow(payload: dict) -> dict:
        await asyncio.sleep(5)
        return {}

    await agent.start()
    try:
        async with ReachClient(router.url) as client:
            resp = await client.call("refuse", {})
            assert resp.status == "AGENT_ERROR"
            assert resp.error is not None and resp.error.code == "OUT_OF_STOCK"
            resp = await client.call("crash", {})
            assert resp.error is not None and resp.error.code == "HANDLER_FAILED"
            assert "ValueError" in resp.error.message
            started = time.monotonic()
            resp = await client.call("slow", {}, timeout_ms=300)
            assert resp.status == "TIMEOUT"
            assert time.monotonic() - started < 5.0  # the deadline, not the 5 s handler, ended it
    finally:
        await agent.stop()


async def test_registers_again_when_the_router_forgets(short_router: RouterServer) -> None:
    """When renewal answers 404 LEASE_NOT_FOUND, the agent registers again by itself."""
    agent = ReachAgent(agent_config(short_router.url))
    agent.capability("echo")(lambda payload: payload)
    await agent.start()
    try:
        first = agent.lease_id
        assert first is not None
        await short_router.app.parts.registry.deregister("sdk-agent", first)  # the Router forgets
        registry = short_router.app.parts.registry

        def registered_again() -> AgentEntry | None:
            entry = registry.get("sdk-agent")
            fresh = entry is not None and entry.lease_id != first and agent.lease_id == entry.lease_id
            return entry if fresh else None

        entry = await until(registered_again, "the agent to register again with a new lease")
        # And keeps it: renewed on the same lease across two TTLs (a busy machine may make one
        # renewal late, so the status at one instant is not the claim; the lease is).
        lease, since = entry.lease_id, entry.last_heartbeat

        def renewed_for_two_ttls() -> bool:
            now = registry.get("sdk-agent")
            assert now is not None and now.lease_id == lease, "the lease was lost again"
            return now.last_heartbeat >= since + 2 * SHORT_TTL

        await until(renewed_for_two_ttls, "renewals on the same lease over two TTLs")
    finally:
        await agent.stop()


async def test_waits_for_a_router_that_is_not_up_yet(caplog: pytest.LogCaptureFixture) -> None:
    """An agent started before its Router keeps trying and registers once the Router is up."""
    caplog.set_level(logging.INFO, logger="reachmesh.sdk")
    config = RouterConfig()
    server = RouterServer(config)
    agent = ReachAgent(agent_config(server.url))
    agent.capability("echo")(lambda payload: payload)
    starting = asyncio.create_task(agent.start())
    await until(
        lambda: any("unreachable" in r.getMessage() for r in caplog.records),
        "a registration attempt against the absent Router",
    )
    assert not starting.done()
    async with server:
        await asyncio.wait_for(starting, scaled(15))
        assert server.app.parts.registry.get("sdk-agent") is not None
        await agent.stop()


async def test_handlers_must_match_capabilities(router: RouterServer) -> None:
    """A declared capability without a handler, or a handler for an undeclared one, is refused."""
    agent = ReachAgent(agent_config(router.url, tasks=("a", "b")))
    agent.capability("a")(lambda payload: payload)
    with pytest.raises(ConfigError, match="without a handler: b"):
        await agent.start()
    agent2 = ReachAgent(agent_config(router.url, tasks=("a",)))
    agent2.capability("a")(lambda payload: payload)
    agent2.capability("zzz")(lambda payload: payload)
    with pytest.raises(ConfigError, match="undeclared capabilities: zzz"):
        await agent2.start()


@pytest.fixture
async def patient_router() -> AsyncIterator[RouterServer]:
    """A Router that waits up to 30 s for an agent's answer (the default read timeout is 3 s)."""
    config = RouterConfig.model_validate({"limits": {"loop_lag_ms": 10_000}, "timeouts": {"read_ms": 30_000}})
    async with RouterServer(config) as server:
        yield server


async def test_health_port_answers_while_a_handler_hogs_the_cpu(patient_router: RouterServer) -> None:
    """The dedicated health port answers while a handler holds the CPU and blocks the loop."""
    # The handler blocks until three probes are answered, which on a busy machine may take
    # longer than the default read timeout: the Router here waits as long as the handler may.
    router = patient_router
    health_port = free_port()
    agent = ReachAgent(agent_config(router.url, tasks=("busy",), health_port=health_port))
    busy_now = threading.Event()
    probed = threading.Event()
    answers: list[tuple[int, str, bool]] = []

    @agent.capability("busy")
    async def busy(payload: dict) -> dict:
        # Holds the event loop (not just a thread) until the prober is done, so every probe is
        # answered while the loop is blocked however slow the machine; the cap only ends a run
        # whose health port never answers.
        busy_now.set()
        end = time.monotonic() + 20
        while not probed.is_set() and time.monotonic() < end:
            pass
        busy_now.clear()
        return {"done": True}

    def probe() -> None:
        # A plain thread: the loop that would run asyncio.to_thread is the one the handler blocks.
        try:
            if busy_now.wait(20):
                for _ in range(3):
                    r = httpx.get(f"http://127.0.0.1:{health_port}/healthz", timeout=10)
                    answers.append((r.status_code, r.json()["agent"], busy_now.is_set()))
        finally:
            probed.set()

    await agent.start()
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        async with ReachClient(router.url) as client:
            resp = await client.call("busy", {}, timeout_ms=30000)
        assert answers == [(200, "sdk-agent", True)] * 3
        assert resp.result == {"done": True}
    finally:
        probed.set()
        await asyncio.to_thread(prober.join)
        await agent.stop()


def test_first_renewal_counts_from_when_the_registration_was_sent() -> None:
    """A registration answered late is renewed at once, not a third of a TTL after the answer."""
    clock = ManualClock(start=100.0)

    def router(request: httpx.Request) -> httpx.Response:
        # The Router starts the lease when it writes the entry, then answers 1.2 s later (as it
        # does while its embedder warms up); renewals take 0.4 s.
        if request.method == "POST":
            clock.advance(1.2)
            return httpx.Response(201, json={"agentId": "a", "leaseId": "0x1", "ttlSeconds": 3})
        clock.advance(0.4)
        return httpx.Response(200, json={"agentId": "a", "leaseId": "0x1", "ttlSeconds": 3})

    keeper = LeaseKeeper("http://router", {"id": "a"}, callback="http://a/reach", tasks=["t"], clock=clock)
    keeper._http = httpx.Client(transport=httpx.MockTransport(router))
    keeper.register()
    # A third of the 3 s TTL since the request was sent has passed: renew at once.
    assert keeper._next_renewal_in() == 0.05
    keeper.start()
    try:
        wait_until = time.time() + 10
        while keeper._extended_at == 100.0 and time.time() < wait_until:
            time.sleep(0.01)
        # Renewed: the next one is due a third of a TTL after that renewal was sent.
        assert keeper._next_renewal_in() == pytest.approx(1.0 - 0.4)
    finally:
        keeper.stop()
        keeper.close()


async def test_conversation_hook(router: RouterServer) -> None:
    """GET {endpoint}/conversations/{id} answers the agent's hook as {"holds": bool}."""
    agent = ReachAgent(agent_config(router.url))
    agent.capability("echo")(lambda payload: payload)
    agent.conversation_holder(lambda conversation_id: conversation_id == "conv-1")
    await agent.start()
    try:
        base = agent.config.profile.network.endpoint
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{base}/conversations/conv-1")).json() == {"holds": True}
            assert (await http.get(f"{base}/conversations/conv-2")).json() == {"holds": False}
    finally:
        await agent.stop()


async def test_sync_client(router: RouterServer) -> None:
    """SyncReachClient returns the same ReachResponse as the async client."""
    agent = ReachAgent(agent_config(router.url))
    agent.capability("echo")(lambda payload: {"got": payload})
    await agent.start()
    try:

        def call() -> Any:
            with SyncReachClient(router.url) as client:
                return client.call("echo", {"a": 1}), client.call("missing_task", {})

        ok, missing = await asyncio.to_thread(call)
        assert ok.ok and ok.result == {"got": {"a": 1}}
        assert missing.status == "NO_AVAILABLE_HANDLER"
    finally:
        await agent.stop()


async def test_client_reports_an_unreachable_router() -> None:
    """With no Router listening, the client raises RouterUnavailable, not a library error."""
    async with ReachClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(RouterUnavailable):
            await client.call("echo", {})
