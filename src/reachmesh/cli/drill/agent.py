"""The drill's agent: an SDK agent whose faults a drill sets through a small JSON file.

``reach drill`` starts each one as its own process (``reach agent --app
reachmesh.cli.drill.agent:agent``), so that ``kill -9`` is real. It serves one task, named by
``REACH_DRILL_TASK``, and re-reads ``REACH_DRILL_FAULTS`` on every call:

- ``{"delay_ms": N}`` answers N ms late;
- ``{"mode": "error"}`` fails every call (AGENT_ERROR, retryable, so the Router fails over);
  ``{"error_rate": P}`` fails a share P of calls that way;
- ``{"mode": "hang_until", "until": T, "hang_ms": H}`` holds each call for H ms until the
  wall-clock time T (past the drill's read timeout, so that each counts against the breaker as
  a timeout; an AGENT_ERROR answer would not, the agent being up), then answers again (the
  breaker drill);
- ``{"mode": "hang"}`` never answers (the Router's read timeout ends the attempt).

With ``REACH_DRILL_STREAM=1`` (``reach drill --stream``) the capability is an async generator:
after the same faults, it yields ``STREAM_CHUNKS`` chunks ``{"agent", "seq", "part"}`` (``part``
counts from 0, so a caller can check they came whole and in order).

It writes the lease it holds to ``REACH_DRILL_LEASE_FILE``, so that a drill can deregister an
agent it killed instead of leaving its entry behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from reachmesh import AgentError, ReachAgent, ReachContext
from reachmesh.cli.drill.load import STREAM_CHUNKS

agent = ReachAgent()
TASK = os.environ.get("REACH_DRILL_TASK", "drill_echo")


def _faults() -> dict[str, Any]:
    path = os.environ.get("REACH_DRILL_FAULTS")
    if not path:
        return {}
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


async def _serve(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    await _suffer()
    return {"agent": agent.id, "seq": payload.get("seq")}


async def _serve_stream(payload: dict[str, Any], ctx: ReachContext) -> AsyncIterator[dict[str, Any]]:
    await _suffer()  # before the first chunk: a fault delays it, so time to first chunk shows it
    for part in range(STREAM_CHUNKS):
        yield {"agent": agent.id, "seq": payload.get("seq"), "part": part}
        await asyncio.sleep(0)  # each chunk its own write, as a model's tokens are


async def _suffer() -> None:
    """The faults the drill set, as the agent's own slowness or failure."""
    faults = _faults()
    mode = faults.get("mode", "ok")
    if faults.get("delay_ms"):
        await asyncio.sleep(float(faults["delay_ms"]) / 1000)
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "error" or random.random() < float(faults.get("error_rate", 0)):
        raise AgentError(f"{agent.id} fails on purpose", code="DRILL_FAULT", retryable=True)
    if mode == "hang_until" and time.time() < float(faults.get("until", 0)):
        await asyncio.sleep(float(faults.get("hang_ms", 2000)) / 1000)


agent.capability(TASK)(_serve_stream if os.environ.get("REACH_DRILL_STREAM") == "1" else _serve)


def _write_lease_forever(path: Path) -> None:
    # A daemon thread of the drill agent's own process: it only mirrors agent.lease_id to a file.
    written: str | None = None
    while True:
        lease = agent.lease_id
        if lease and lease != written:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(lease, encoding="utf-8")
            tmp.replace(path)
            written = lease
        time.sleep(0.1)


if os.environ.get("REACH_DRILL_LEASE_FILE"):
    threading.Thread(
        target=_write_lease_forever,
        args=(Path(os.environ["REACH_DRILL_LEASE_FILE"]),),
        name="drill-lease-file",
        daemon=True,
    ).start()
