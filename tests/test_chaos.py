"""Drills with real processes on loopback: a busy agent stays in, a killed one is skipped.

These assert behaviour only. The service levels (detection times, shares under load, lateness
under a retry storm, the 20 s chaos run) are figures, measured by ``bench/resilience_drills.py``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import scaled
from tests.procs import Drill, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def drill(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Drill]:
    """A Router process with the test's policy; agents are started by the test."""
    marker = request.node.get_closest_marker("policy")
    d = Drill(tmp_path, marker.args[0] if marker else {})
    try:
        yield d
    finally:
        d.stop()


# Probes every 0.2 s with a 300 ms timeout on a quiet machine; on a busy one the agent's health
# thread may wait longer than that for the CPU, which is the machine, not the agent.
@pytest.mark.policy(
    {
        "health": {
            "interval_seconds": scaled(0.2),
            "timeout_ms": int(scaled(300)),
            "unhealthy_after": 2,
        }
    }
)
def test_busy_agent_is_not_taken_out(drill: Drill) -> None:
    """A handler holding the CPU and its loop for 3 s (scaled): health answers, the lease renews,
    it stays in."""
    drill.start_agent("busy-1")
    drill.wait_available("busy-1")
    # The test looks in while the handler is busy: give it the time a busy machine needs.
    busy_ms = int(scaled(3000))
    drill.fault("busy-1", mode="cpu_busy", cpu_ms=busy_ms)
    heartbeat = drill.http.get("/admin/agents/busy-1").json()["lastHeartbeat"]
    outcome: dict[str, Any] = {}
    caller = threading.Thread(
        target=lambda: outcome.update(drill.call(timeoutMs=busy_ms + 5000, readTimeoutMs=busy_ms + 4000))
    )
    caller.start()
    wait_for(lambda: "handle: chaos" in drill.agents["busy-1"].text())
    # The health port answers while the handler holds the loop: the call is still in flight.
    health = httpx.get(f"http://127.0.0.1:{drill.ports['busy-1'][1]}/healthz", timeout=scaled(5))
    answered_while_busy = caller.is_alive()
    seen: set[str] = set()
    renewed_while_busy = False
    while caller.is_alive():
        row = drill.http.get("/admin/agents/busy-1").json()
        seen.add(row["status"])
        renewed_while_busy |= caller.is_alive() and row["lastHeartbeat"] != heartbeat
        time.sleep(0.05)
    caller.join()
    print(f"\nstatuses seen while busy: {sorted(seen)}")
    assert outcome["status"] == "SUCCESS"
    assert health.status_code == 200 and answered_while_busy
    assert renewed_while_busy
    # Never out of routing: unhealthy takes two failed probes in a row, offline a lapsed lease.
    # One slow probe (suspect, still routable) is a matter of how loaded the machine is; the
    # bench prints how often it happens.
    assert seen <= {"available", "suspect"}
    metrics = httpx.get(f"http://127.0.0.1:{drill.ports['busy-1'][1]}/metrics").text
    assert 'reach_agent_handled_requests_total{outcome="success",task="chaos"} 1.0' in metrics


def test_killed_agent_is_skipped_after_one_request(drill: Drill) -> None:
    """After kill -9 every request succeeds and at most one touches the dead agent (its breaker opens)."""
    for name in ("crash-a", "crash-b"):
        drill.start_agent(name)
    drill.wait_available("crash-a", "crash-b")
    handlers = {drill.call()["handlerAgentId"] for _ in range(10)}
    assert handlers == {"crash-a", "crash-b"}
    drill.agents["crash-a"].signal(signal.SIGKILL)
    drill.agents["crash-a"].popen.wait(5)
    touched = 0
    for _ in range(40):
        body = drill.call(timeoutMs=5000)
        assert body["status"] == "SUCCESS", body
        touched += any(a["agentId"] == "crash-a" for a in body["attempts"])
    # A refused connection opens the breaker at once (or a failed probe made it suspect first).
    assert touched <= 1
