"""Drills with real processes on loopback: busy agents, crashes, a chaos run and a retry storm.

Each test prints its figures (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml

from agent_reach.testing import FakeAgent, free_port
from tests.procs import ROOT, Proc, wait_for

pytestmark = pytest.mark.e2e

CHAOS_APP = str(ROOT / "examples" / "chaos_agent" / "agent.py") + ":agent"
CHAOS_CONFIG = str(ROOT / "examples" / "chaos_agent" / "reach_config.yaml")


class Drill:
    """A Router process and chaos agent processes, each agent with its own fault file."""

    def __init__(self, tmp: Path, policy: dict[str, Any]) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base: dict[str, Any] = {"registry": {"lease_ttl_seconds": 2, "sweep_interval_seconds": 0.05}}
        for key, value in policy.items():
            base[key] = {**base.get(key, {}), **value}
        (tmp / "router.yaml").write_text(yaml.safe_dump(base))
        self.router = Proc(
            ["router", "--port", str(self.port), "--config", str(tmp / "router.yaml")], tmp / "router.log"
        )
        self.http = httpx.Client(base_url=self.url, timeout=10)
        wait_for(lambda: self.http.get("/healthz").status_code == 200)
        self.agents: dict[str, Proc] = {}
        self.ports: dict[str, tuple[int, int]] = {}

    def fault(self, name: str, **faults: Any) -> None:
        (self.tmp / f"{name}.faults.json").write_text(json.dumps(faults))

    def start_agent(self, name: str) -> Proc:
        if name not in self.ports:
            self.ports[name] = (free_port(), free_port())
            self.fault(name)
        port, health = self.ports[name]
        proc = Proc(
            ["agent", "--config", CHAOS_CONFIG, "--app", CHAOS_APP],
            self.tmp / f"{name}.log",
            env={
                "REACH_SELF_ID": name,
                "REACH_CALLBACK_URL": f"http://127.0.0.1:{port}/reach",
                "REACH_HEALTH_PORT": str(health),
                "REACH_ROUTER_URL": self.url,
                "REACH_FAULT_FILE": str(self.tmp / f"{name}.faults.json"),
            },
        )
        self.agents[name] = proc
        return proc

    def statuses(self) -> dict[str, str]:
        return {row["id"]: row["status"] for row in self.http.get("/admin/agents").json()}

    def wait_available(self, *names: str, timeout: float = 15) -> None:
        wait_for(lambda: all(self.statuses().get(n) == "available" for n in names), timeout=timeout)

    def call(self, **prefs: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.http.post(
            "/reach", json={"targetTask": "chaos", "preferences": prefs}
        ).json()
        return result

    def stop(self) -> None:
        for proc in self.agents.values():
            proc.stop()
        self.router.stop()
        self.http.close()


@pytest.fixture
def drill(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Drill]:
    marker = request.node.get_closest_marker("policy")
    d = Drill(tmp_path, marker.args[0] if marker else {})
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.policy({"health": {"interval_seconds": 0.2, "timeout_ms": 300, "unhealthy_after": 2}})
def test_busy_agent_is_not_taken_out(drill: Drill) -> None:
    """A handler holding the CPU and its loop for 3 s: health keeps answering, the agent stays in."""
    drill.start_agent("busy-1")
    drill.wait_available("busy-1")
    drill.fault("busy-1", mode="cpu_busy", cpu_ms=3000)
    outcome: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: outcome.update(drill.call(timeoutMs=8000, readTimeoutMs=7000)))
    started = time.monotonic()
    caller.start()
    seen: set[str] = set()
    while caller.is_alive():
        seen.add(drill.statuses()["busy-1"])
        time.sleep(0.05)
    took = time.monotonic() - started
    print(f"\nbusy handler took {took:.2f}s; statuses seen meanwhile: {sorted(seen)}")
    assert outcome["status"] == "SUCCESS"
    assert took >= 2.9
    assert seen == {"available"}
    metrics = httpx.get(f"http://127.0.0.1:{drill.ports['busy-1'][1]}/metrics").text
    assert 'reach_agent_handled_requests_total{outcome="success",task="chaos"} 1.0' in metrics


def _crash_detection(drill: Drill) -> tuple[int, float]:
    """Kill -9 one of two agents under traffic; returns (requests touching it, seconds until none)."""
    for name in ("crash-a", "crash-b"):
        drill.start_agent(name)
    drill.wait_available("crash-a", "crash-b")
    for _ in range(10):
        assert drill.call()["status"] == "SUCCESS"
    drill.agents["crash-a"].signal(signal.SIGKILL)
    drill.agents["crash-a"].popen.wait(5)
    killed = time.monotonic()
    touched = 0
    last_touch = killed
    end = killed + 4
    while time.monotonic() < end:
        body = drill.call(timeoutMs=3000)
        assert body["status"] == "SUCCESS", body
        if any(a["agentId"] == "crash-a" for a in body["attempts"]):
            touched += 1
            last_touch = time.monotonic()
        time.sleep(0.01)
    return touched, last_touch - killed


def test_crash_detection_passive(drill: Drill) -> None:
    """Passive detection (refused opens the breaker): at most one request touches the dead agent."""
    touched, after = _crash_detection(drill)
    print(
        f"\npassive detection: {touched} request(s) routed to the killed agent, "
        f"last {after * 1000:.0f} ms after"
    )
    assert touched <= 1


@pytest.mark.policy(
    {"breaker": {"enabled": False}, "health": {"interval_seconds": 0.5, "timeout_ms": 300, "jitter": 0}}
)
def test_crash_detection_by_health_checks(drill: Drill) -> None:
    """With breakers off, health checks stop routing to a killed agent within interval + timeout."""
    touched, after = _crash_detection(drill)
    print(
        f"\nhealth detection: {touched} request(s) routed to the killed agent, "
        f"last {after * 1000:.0f} ms after "
        "(interval 500 ms + timeout 300 ms)"
    )
    assert after <= 0.5 + 0.3 + 0.1


@pytest.mark.policy({"health": {"interval_seconds": 0.5, "timeout_ms": 500}})
def test_chaos_run(drill: Drill) -> None:
    """Four agents under load for 20 s: two killed at 5 s, one slowed at 10 s, one revived at 15 s."""
    names = [f"chaos-{i}" for i in range(4)]
    for name in names:
        drill.start_agent(name)
    drill.wait_available(*names)
    results: list[tuple[float, str, str | None]] = []
    errors: list[str] = []

    async def load(duration: float) -> None:
        start = time.monotonic()
        async with aiohttp.ClientSession() as http:

            async def worker() -> None:
                while (now := time.monotonic()) - start < duration:
                    try:
                        async with http.post(
                            f"{drill.url}/reach",
                            json={"targetTask": "chaos", "preferences": {"timeoutMs": 3000}},
                        ) as resp:
                            body = await resp.json()
                        results.append((now - start, body["status"], body.get("handlerAgentId")))
                    except (aiohttp.ClientError, ValueError, KeyError) as exc:  # no ReachResponse
                        errors.append(repr(exc))
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(worker() for _ in range(4)))

    def script() -> None:
        time.sleep(5)
        for name in names[:2]:
            drill.agents[name].signal(signal.SIGKILL)
        time.sleep(5)
        drill.fault(names[2], delay_ms=800)
        time.sleep(5)
        drill.agents[names[0]].stop()
        drill.start_agent(names[0])

    chaos = threading.Thread(target=script)
    chaos.start()
    asyncio.run(load(20))
    chaos.join()
    total = len(results)
    ok = sum(1 for _, status, _ in results if status == "SUCCESS")
    revived = [t for t, status, handler in results if handler == names[0] and t > 15]
    by_phase: dict[str, dict[str, int]] = {}
    for t, _, handler in results:
        phase = "0-5s" if t < 5 else "5-10s" if t < 10 else "10-15s" if t < 15 else "15-20s"
        by_phase.setdefault(phase, {}).setdefault(handler or "-", 0)
        by_phase[phase][handler or "-"] += 1
    print(
        f"\nchaos run: {total} requests, {ok} SUCCESS ({ok / total * 100:.2f}%), {len(errors)} without a "
        f"ReachResponse; revived agent served {len(revived)} after 15 s (first at "
        f"{min(revived) if revived else float('nan'):.2f}s)"
    )
    for phase, handlers in by_phase.items():
        print(f"  {phase}: {dict(sorted(handlers.items()))}")
    assert errors == []
    assert ok / total >= 0.99
    assert revived, "traffic never returned to the revived agent"


def test_retry_storm(tmp_path: Path) -> None:
    """200 concurrent requests, agents answering in 1.5 s, a 1 s budget: attempts bounded, none late."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = Proc(["router", "--port", str(port), "--log-level", "WARNING"], tmp_path / "router.log")
    try:
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200)
        figures = asyncio.run(_storm(url))
    finally:
        router.stop()
    for name, fig in figures.items():
        print(
            f"\nretry storm ({name}): {fig['requests']} requests, {fig['attempts']} upstream attempts "
            f"(bound {fig['bound']:.0f}), statuses {fig['statuses']}, worst lateness {fig['late_ms']:.1f} ms "
            f"at the Router ({fig['client_late_ms']:.1f} ms seen by the client)"
        )
        assert fig["attempts"] <= fig["bound"]
        assert fig["late_ms"] <= 50
    assert set(figures["as specified"]["statuses"]) <= {"TIMEOUT", "SUCCESS"}
    assert set(figures["short read timeout"]["statuses"]) <= {"TIMEOUT", "SUCCESS", "NO_AVAILABLE_HANDLER"}


async def _storm(url: str) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    for name, prefs in (
        ("as specified", {"timeoutMs": 1000}),
        ("short read timeout", {"timeoutMs": 1000, "readTimeoutMs": 300}),
    ):
        agents = [await FakeAgent(f"storm-{i}", tasks=("storm",), delay_s=1.5).start() for i in range(4)]
        try:
            for agent in agents:
                await agent.register(url)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:

                async def one(prefs: dict[str, int] = prefs) -> tuple[str, float, float]:
                    t0 = time.monotonic()
                    async with http.post(
                        f"{url}/reach", json={"targetTask": "storm", "preferences": prefs}
                    ) as r:
                        body = await r.json()
                    return body["status"], body["durationMs"], (time.monotonic() - t0) * 1000

                outcomes = await asyncio.gather(*(one() for _ in range(200)))
            statuses: dict[str, int] = {}
            for status, _, _ in outcomes:
                statuses[status] = statuses.get(status, 0) + 1
            figures[name] = {
                "requests": len(outcomes),
                "attempts": sum(len(a.received) for a in agents),
                # Budget: retries <= 20% of requests + 10/s over the 10 s window.
                "bound": 1.2 * len(outcomes) + 10 * 10,
                "statuses": statuses,
                # Lateness as the Router sees it (from the moment it has the request) and as this
                # client sees it (which adds connection set-up for 200 sockets at once).
                "late_ms": max(took - prefs["timeoutMs"] for _, took, _ in outcomes),
                "client_late_ms": max(seen - prefs["timeoutMs"] for _, _, seen in outcomes),
            }
            async with aiohttp.ClientSession() as http:
                for agent in agents:
                    async with http.delete(
                        f"{url}/agents/{agent.agent_id}", headers={"X-Reach-Lease": agent.lease_id or ""}
                    ):
                        pass
        finally:
            for agent in agents:
                await agent.stop()
    return figures
