"""The drill's traffic: open-loop at a rate (or closed-loop at a concurrency), bounded in count
and time, every answer kept as a :class:`Sample`, with a live view of rate, success and p50/p99.

Open-loop means a request leaves at its scheduled time whatever happened to the ones before,
as callers in production do; a request that would exceed ``max_inflight`` of the drill's own is
counted as ``dropped`` instead of delaying the schedule.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from rich.console import Console
from rich.live import Live
from rich.table import Table

from reachmesh.cli.console import PIPED_WIDTH
from reachmesh.sse import SseError, SseLimits, SseParser

# The chunks a drill agent streams per call with ``--stream`` (the callers check all came).
STREAM_CHUNKS = 5


@dataclass(slots=True)
class Sample:
    t: float  # when it was sent, seconds since the drill's start
    ms: float
    http: int
    status: str  # the ReachResponse status, or CLIENT_ERROR when none came back
    handler: str | None = None
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (agentId, outcome)
    code: str | None = None
    retry_after: str | None = None
    # A streamed call (``--stream``): ms to its first chunk, chunks, and whether they came whole
    # and in order (``part`` 0, 1, ... from one agent).
    ttfc_ms: float | None = None
    chunks: int = 0
    in_order: bool = True

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"

    def touched(self, agent: str) -> bool:
        return any(a == agent for a, _ in self.attempts)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(samples: list[Sample]) -> dict[str, Any]:
    """Count, success share, p50 and p99 (ms) of ``samples``."""
    ms = [s.ms for s in samples]
    ok = sum(1 for s in samples if s.ok)
    failures = Counter(s.code or s.status for s in samples if not s.ok)
    return {
        "requests": len(samples),
        "success": round(ok / len(samples), 4) if samples else None,
        "p50Ms": _round(percentile(ms, 0.5)),
        "p99Ms": _round(percentile(ms, 0.99)),
        "failures": dict(failures.most_common()),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def ttfc(samples: list[Sample]) -> dict[str, Any]:
    """Time to first chunk of the streamed calls that got one: count, p50 and p99 (ms)."""
    ms = [s.ttfc_ms for s in samples if s.ttfc_ms is not None]
    return {"streams": len(ms), "p50Ms": _round(percentile(ms, 0.5)), "p99Ms": _round(percentile(ms, 0.99))}


class Load:
    """Sends ReachRequests for one task to a Router and keeps every answer."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        router_url: str,
        task: str,
        started: float,
        *,
        budget_ms: int = 10_000,
        read_timeout_ms: int | None = None,
        max_inflight: int = 256,
        stream: bool = False,
    ) -> None:
        self._session = session
        self._stream = stream
        self._url = f"{router_url}/reach"
        self._task = task
        self._started = started
        self._preferences: dict[str, Any] = {"timeoutMs": budget_ms}
        if read_timeout_ms is not None:
            self._preferences["readTimeoutMs"] = read_timeout_ms
        self._gate = asyncio.Semaphore(max_inflight)
        self._seq = 0
        self.samples: list[Sample] = []
        self.dropped = 0
        self.phase = ""
        self.begin = 0.0  # when traffic started, on the drill's clock

    def now(self) -> float:
        return time.monotonic() - self._started

    async def open_loop(self, rate: Callable[[float], float], duration: float) -> None:
        """Requests at ``rate(t)`` per second for ``duration`` seconds from now."""
        begin = self.begin = self.now()
        next_at = begin
        pending: set[asyncio.Task[None]] = set()
        while next_at < begin + duration:
            delay = next_at - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._gate.locked():
                self.dropped += 1
            else:
                task = asyncio.get_running_loop().create_task(self._one())
                pending.add(task)
                task.add_done_callback(pending.discard)
            next_at += 1.0 / max(rate(self.now() - begin), 0.1)
        if pending:
            await asyncio.gather(*pending)

    async def closed_loop(self, concurrency: int, duration: float) -> None:
        """``concurrency`` callers, each sending its next request when its last one is answered."""
        self.begin = self.now()
        end = self.begin + duration

        async def caller() -> None:
            while self.now() < end:
                await self._one()

        await asyncio.gather(*(caller() for _ in range(concurrency)))

    async def burst(self, calls: int) -> None:
        """``calls`` requests sent at once (a fan-out), each waited for."""
        self.begin = self.now()
        await asyncio.gather(*(self._one() for _ in range(calls)))

    async def _one(self) -> None:
        async with self._gate:
            self._seq += 1
            body = {
                "version": "1.0",
                "sourceAgent": "reach-drill",
                "targetTask": self._task,
                "payload": {"seq": self._seq},
                "preferences": self._preferences,
            }
            sent = self.now()
            try:
                if self._stream:
                    self.samples.append(await self._streamed(body, sent))
                    return
                async with self._session.post(self._url, json=body) as resp:
                    answer = await resp.json(content_type=None)
                    retry_after = resp.headers.get("Retry-After")
                    http = resp.status
            except (TimeoutError, aiohttp.ClientError, ValueError, SseError) as exc:
                self.samples.append(
                    Sample(sent, (self.now() - sent) * 1000, 0, "CLIENT_ERROR", code=type(exc).__name__)
                )
                return
            self.samples.append(_sample(sent, (self.now() - sent) * 1000, http, answer, retry_after))

    async def _streamed(self, body: dict[str, Any], sent: float) -> Sample:
        """One call that asks for a stream: its chunks timed as they come, then its ``done``
        (or, when it failed before any chunk, the plain ReachResponse)."""
        headers = {"Accept": "text/event-stream"}
        async with self._session.post(self._url, json=body, headers=headers) as resp:
            if resp.content_type != "text/event-stream":
                answer = await resp.json(content_type=None)
                ms = (self.now() - sent) * 1000
                return _sample(sent, ms, resp.status, answer, resp.headers.get("Retry-After"))
            parser = SseParser(SseLimits(max_line=1 << 20, max_event=1 << 20, max_total=64 << 20))
            first: float | None = None
            parts: list[Any] = []
            while True:
                data = await resp.content.readany()
                if not data:
                    raise ValueError("the stream ended without a done event")
                for event in parser.feed(data):
                    if event.event == "chunk":
                        first = self.now() if first is None else first
                        chunk = orjson.loads(event.data)
                        parts.append(chunk.get("part") if isinstance(chunk, dict) else None)
                    elif event.event == "done":
                        sample = _sample(
                            sent, (self.now() - sent) * 1000, resp.status, orjson.loads(event.data), None
                        )
                        sample.ttfc_ms = None if first is None else (first - sent) * 1000
                        sample.chunks = len(parts)
                        sample.in_order = parts == list(range(len(parts)))
                        return sample


def _sample(sent: float, ms: float, http: int, answer: Any, retry_after: str | None) -> Sample:
    if not isinstance(answer, dict):
        return Sample(sent, ms, http, "CLIENT_ERROR", code="NOT_JSON")
    error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
    attempts = [
        (str(a.get("agentId")), str(a.get("outcome")))
        for a in answer.get("attempts") or []
        if isinstance(a, dict)
    ]
    return Sample(
        sent,
        ms,
        http,
        str(answer.get("status", "CLIENT_ERROR")),
        handler=answer.get("handlerAgentId"),
        attempts=attempts,
        code=error.get("code") if error else None,
        retry_after=retry_after,
    )


class LiveView:
    """Rate, success and p50/p99 of the last seconds, on stderr: a live table on a terminal, a
    line every few seconds otherwise (CI logs)."""

    def __init__(self, load: Load, scenario: str, *, quiet: bool = False, window: float = 2.0) -> None:
        self._load = load
        self._scenario = scenario
        self._quiet = quiet
        self._window = window
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self._quiet:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _figures(self) -> dict[str, Any]:
        now = self._load.now()
        recent = [s for s in self._load.samples if s.t >= now - self._window - 1 and s.t < now - 1]
        figures = summary(recent)
        figures["rate"] = round(len(recent) / self._window, 1)
        return figures

    def _table(self) -> Table:
        f = self._figures()
        table = Table(title=f"reach drill {self._scenario}", title_justify="left")
        for column in ("t (s)", "phase", "sent", "rate/s", "success", "p50 ms", "p99 ms", "dropped"):
            table.add_column(column)
        success = "-" if f["success"] is None else f"{f['success']:.1%}"
        table.add_row(
            f"{self._load.now():.1f}",
            self._load.phase,
            str(len(self._load.samples)),
            str(f["rate"]),
            success,
            str(f["p50Ms"] or "-"),
            str(f["p99Ms"] or "-"),
            str(self._load.dropped),
        )
        return table

    async def _run(self) -> None:
        # Piped (a CI log), Rich would wrap each line at 80 columns.
        console = Console(stderr=True, width=None if sys.stderr.isatty() else PIPED_WIDTH)
        if sys.stderr.isatty():
            with Live(self._table(), console=console, refresh_per_second=4, transient=True) as live:
                while True:
                    await asyncio.sleep(0.25)
                    live.update(self._table())
        while True:
            await asyncio.sleep(5)
            f = self._figures()
            success = "-" if f["success"] is None else f"{f['success']:.1%}"
            console.print(
                f"[reach-drill] {self._scenario} t={self._load.now():.0f}s {self._load.phase} "
                f"sent={len(self._load.samples)} rate={f['rate']}/s success={success} "
                f"p50={f['p50Ms']}ms p99={f['p99Ms']}ms",
                highlight=False,
                markup=False,
            )
