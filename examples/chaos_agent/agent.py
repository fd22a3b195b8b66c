"""A fault-injecting agent for drills and tests, driven by a JSON file it re-reads on each call.

    REACH_FAULT_FILE=/tmp/faults.json REACH_SELF_ID=chaos-1 \\
      reach agent --config examples/chaos_agent/reach_config.yaml --app examples/chaos_agent/agent.py:agent

The file holds ``{"mode": ..., "delay_ms": N, "cpu_ms": N}``; change it at any time:

- ``ok`` answers ``{"agent": id}``; ``delay_ms`` adds latency first;
- ``error`` / ``retryable_error`` answer AGENT_ERROR (not) allowing failover;
- ``crash`` exits the process on the next call (as a ``kill -9`` would look to the Router);
- ``cpu_busy`` holds the CPU (and the event loop) for ``cpu_ms`` before answering.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from reachmesh import AgentError, ReachAgent, ReachContext

agent = ReachAgent()


def _faults() -> dict[str, Any]:
    path = os.environ.get("REACH_FAULT_FILE")
    if not path:
        return {}
    try:
        found = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


@agent.capability("chaos")
async def chaos(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    faults = _faults()
    mode = faults.get("mode", "ok")
    if faults.get("delay_ms"):
        await asyncio.sleep(float(faults["delay_ms"]) / 1000)
    if mode == "crash":
        os._exit(1)
    if mode == "cpu_busy":
        end = time.monotonic() + float(faults.get("cpu_ms", 3000)) / 1000
        while time.monotonic() < end:  # deliberately blocks the loop: the health port must still answer
            pass
    if mode in ("error", "retryable_error"):
        raise AgentError(f"{agent.id} fails on purpose", code="CHAOS", retryable=mode == "retryable_error")
    return {"agent": agent.id, "trace": ctx.trace_id}
