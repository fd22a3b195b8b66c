"""The drills: each injects one kind of fault under load and checks the Router's promise about it.

A scenario gets a :class:`Stage` (a Router, the drill's agents on it, the traffic settings),
runs traffic while its fault schedule plays, and returns a :class:`Result`: the figures, each
promise held or missed, the fault's moments (for the plots) and the samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from reachmesh.cli.console import err
from reachmesh.cli.drill.burst import run_burst
from reachmesh.cli.drill.fleet import Fleet, ViewPoller, auth_headers
from reachmesh.cli.drill.load import STREAM_CHUNKS, LiveView, Load, Sample, percentile, summary, ttfc
from reachmesh.exceptions import ConfigError
from reachmesh.redaction import loggable

Action = Callable[[], Any]


@dataclass
class Settings:
    agents: int = 3
    duration: float = 15.0
    rate: float = 40.0
    concurrency: int | None = None
    quiet: bool = False
    stream: bool = False  # streaming agents and callers (latency and crash)
    healthz_p99_ms: float = 100.0  # what storm promises of /healthz


@dataclass
class Promise:
    name: str
    ok: bool
    detail: str


@dataclass
class Result:
    scenario: str
    figures: dict[str, Any]
    promises: list[Promise]
    marks: list[tuple[float, str]]
    samples: list[Sample] = field(repr=False, default_factory=list)
    router: dict[str, Any] = field(default_factory=dict)  # the Router it ran on, and its policy
    breakers: list[tuple[float, str]] = field(default_factory=list)  # (when, agent) a breaker opened

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.promises)


@dataclass
class Stage:
    """Where one scenario runs: a Router, the drill's agents on it, and what it may read."""

    router_url: str
    token: str | None
    fleet: Fleet
    settings: Settings
    policy: dict[str, Any] | None  # the policy in force when the drill started the Router
    freeze: Action | None = None  # partition: stop the registry's store
    thaw: Action | None = None
    # router-crash: the Router killed with -9 (router_url is the one that lives on), and the kill.
    victim_url: str | None = None
    crash: Action | None = None

    # What the drill did not take from the Router's policy as it was (out of bounds, not a number).
    clamped: list[str] = field(default_factory=list)

    def policy_value(self, section: str, key: str, default: Any) -> Any:
        found = (self.policy or {}).get(section, {})
        return found.get(key, default) if isinstance(found, dict) else default

    def policy_number(self, section: str, key: str, default: float, low: float, high: float) -> float:
        """A number from the Router's policy, kept within ``[low, high]``: the Router may be
        broken or hostile, and its value must neither make a drill run on (a breaker
        ``open_seconds`` of 1e9) nor stop it with a traceback. Each change is noted and said."""
        raw = self.policy_value(section, key, default)
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError, OverflowError):
            value = math.nan
        used = default if not math.isfinite(value) else min(max(value, low), high)
        if used != value:
            shown = loggable(repr(raw), 40)
            bounds = f"{low:g}..{high:g}"
            note = f"the Router's {section}.{key} of {shown} is not within {bounds}: the drill uses {used:g}"
            self.clamped.append(note)
            err.print(f"[reach-drill] {note}", highlight=False, markup=False)
        return used


@dataclass
class Run:
    load: Load
    watcher: ViewPoller
    marks: list[tuple[float, str]]
    healthz_ms: list[float]
    inflight_peak: int

    @property
    def breakers(self) -> list[tuple[float, str]]:
        """When each breaker opened during the run, and whose: the plots mark them."""
        return [(c.t, c.agent) for c in self.watcher.changes if c.what == "circuit" and c.value == "open"]


async def drive(
    stage: Stage,
    scenario: str,
    schedule: list[tuple[float, str, Action]],
    *,
    rate: Callable[[float], float] | None = None,
    poll_health: bool = False,
    read_timeout_ms: int | None = None,
    duration: float | None = None,
) -> Run:
    """Traffic for ``settings.duration`` seconds while ``schedule`` plays: (at, label, action)."""
    started = time.monotonic()
    settings = stage.settings
    headers = auth_headers(stage.token)
    connector = aiohttp.TCPConnector(limit=512)
    async with (
        aiohttp.ClientSession(headers=headers, connector=connector) as session,
        httpx.AsyncClient(base_url=stage.router_url, headers=headers, timeout=5) as http,
    ):
        load = Load(
            session,
            stage.router_url,
            stage.fleet.task,
            started,
            read_timeout_ms=read_timeout_ms,
            stream=settings.stream,
        )
        watcher = ViewPoller(http, stage.fleet.prefix, started)
        view = LiveView(load, scenario, quiet=settings.quiet)
        watcher.start()
        view.start()
        marks: list[tuple[float, str]] = []
        health = _HealthProbe(stage.router_url, headers) if poll_health else None
        if health is not None:
            health.start()
        try:
            seconds = duration or settings.duration
            traffic = (
                load.closed_loop(settings.concurrency, seconds)
                if settings.concurrency
                else load.open_loop(rate or (lambda t: settings.rate), seconds)
            )
            await asyncio.gather(traffic, _play(schedule, load, marks))
        finally:
            if health is not None:
                health.stop()
            await view.stop()
            await watcher.stop()
    return Run(load, watcher, marks, health.ms if health else [], health.inflight_peak if health else 0)


async def _play(
    schedule: list[tuple[float, str, Action]], load: Load, marks: list[tuple[float, str]]
) -> None:
    for at, label, action in sorted(schedule, key=lambda item: item[0]):
        delay = at - load.now()
        if delay > 0:
            await asyncio.sleep(delay)
        # The fault's moment is when it starts (a kill waits for the process to go).
        marks.append((round(load.now(), 3), label))
        load.phase = label
        result = action()
        if isinstance(result, Awaitable):
            await result


class _HealthProbe:
    """``/healthz`` latency every 50 ms and the Router's in-flight gauge from ``/metrics``, on a
    thread of their own: timed from the drill's event loop, which carries the storm's traffic,
    the drill's own delays would be counted against the Router."""

    def __init__(self, router_url: str, headers: dict[str, str]) -> None:
        self._url = router_url
        self._headers = headers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drill-healthz", daemon=True)
        self.ms: list[float] = []
        self.inflight_peak = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, headers=self._headers, timeout=5) as http:
            n = 0
            while not self._stop.is_set():
                sent = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    http.get("/healthz")
                self.ms.append((time.monotonic() - sent) * 1000)
                n += 1
                if n % 4 == 0:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        self.inflight_peak = max(self.inflight_peak, _inflight(http.get("/metrics").text))
                self._stop.wait(0.05)


def _inflight(metrics: str) -> int:
    for line in metrics.splitlines():
        if line.startswith("reach_inflight_requests "):
            return int(float(line.split()[1]))
    return 0


def _between(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.t < end]


def _sec(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# -- latency -------------------------------------------------------------------------------------

LATENCY_STEPS_MS = (0, 200, 1000, 3000)


async def latency(stage: Stage) -> Result:
    """One agent slows in steps; the Router should move its share to the peers and lose nothing."""
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    slow = names[0]
    step = stage.settings.duration / len(LATENCY_STEPS_MS)
    schedule: list[tuple[float, str, Action]] = [
        (i * step, f"+{ms} ms", functools.partial(stage.fleet.fault, slow, delay_ms=ms))
        for i, ms in enumerate(LATENCY_STEPS_MS)
    ]
    run = await drive(stage, "latency", schedule)
    starts = [t for t, _ in run.marks] + [float("inf")]
    steps: list[dict[str, Any]] = []
    promises: list[Promise] = []
    for i, ms in enumerate(LATENCY_STEPS_MS):
        window = _between(run.load.samples, starts[i], starts[i + 1])
        figures = summary(window)
        figures["delayMs"] = ms
        figures["slowAgentShare"] = round(
            sum(1 for s in window if s.handler == slow) / max(len(window), 1), 3
        )
        figures["retried"] = sum(1 for s in window if len(s.attempts) > 1)
        if stage.settings.stream:
            figures["firstChunk"] = ttfc(window)
        steps.append(figures)
        failed = sum(1 for s in window if not s.ok)
        # >= 99 %, and one failure is allowed in a step too short for 1 % to be one request.
        ok = bool(window) and failed <= max(1, len(window) // 100)
        detail = f"{failed} of {len(window)} failed"
        promises.append(Promise(f"+{ms} ms: success >= 99% (1 failure allowed)", ok, detail))
    retried = [s.t for s in run.load.samples if len(s.attempts) > 1]
    figures = {
        "slowAgent": slow,
        "steps": steps,
        "firstRetryAtS": _sec(min(retried) if retried else None),
        "breakerOpenedAtS": _sec(run.watcher.first(slow, "circuit", "open")),
        "dropped": run.load.dropped,
    }
    if stage.settings.stream:
        figures["firstChunk"] = ttfc(run.load.samples)
        promises.append(whole_streams(run.load.samples))
    return Result("latency", figures, promises, run.marks, run.load.samples, breakers=run.breakers)


def whole_streams(samples: list[Sample]) -> Promise:
    """``--stream``: every stream that ended SUCCESS carried all the agent's chunks, in order
    (none lost, none from a second agent)."""
    ok = [s for s in samples if s.ok]
    broken = [s for s in ok if s.chunks != STREAM_CHUNKS or not s.in_order]
    detail = f"{len(broken)} of {len(ok)} successful streams were not {STREAM_CHUNKS} chunks in order"
    return Promise("every successful stream whole and in order", bool(ok) and not broken, detail)


# -- crash ---------------------------------------------------------------------------------------


async def crash(stage: Stage) -> Result:
    """``kill -9`` one agent under load: at most one failed request while a peer is healthy."""
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    victim = names[0]
    at = stage.settings.duration / 3
    run = await drive(
        stage, "crash", [(0.0, "steady", lambda: None), (at, "kill -9", lambda: stage.fleet.kill(victim))]
    )
    killed_at = next(t for t, label in run.marks if label == "kill -9")
    after = [s for s in run.load.samples if s.t >= killed_at]
    touched = [s for s in after if s.touched(victim)]
    # A request fails "after the kill" when its answer came after it: those already on their way
    # to the victim when it died are the likeliest to fail.
    failed = [s for s in run.load.samples if not s.ok and s.t + s.ms / 1000 >= killed_at]
    before = [s for s in run.load.samples if killed_at - 2.0 <= s.t < killed_at and s.handler == victim]
    suspect = run.watcher.first(victim, "status", "suspect", after=killed_at)
    unhealthy = run.watcher.first(victim, "status", "unhealthy", after=killed_at)
    offline = run.watcher.first(victim, "status", "offline", after=killed_at)
    figures = {
        "victim": victim,
        "killedAtS": _sec(killed_at),
        "requestsAfterKill": len(after),
        "touchedVictimAfterKill": len(touched),
        "failedAfterKill": len(failed),
        "untouchedAfterS": _sec(max(s.t for s in touched) - killed_at if touched else 0.0),
        "suspectAfterS": _sec(None if suspect is None else suspect - killed_at),
        "unhealthyAfterS": _sec(None if unhealthy is None else unhealthy - killed_at),
        "offlineAfterS": _sec(None if offline is None else offline - killed_at),
        "breakerOpenedAfterS": _sec(
            _minus(run.watcher.first(victim, "circuit", "open", after=killed_at), killed_at)
        ),
        "overall": summary(run.load.samples),
    }
    if stage.settings.stream:
        figures["firstChunk"] = ttfc(run.load.samples)
        figures["firstChunkAfterKill"] = ttfc(after)
    promises = [
        Promise(
            "the victim had traffic when it was killed",
            bool(before),
            f"{len(before)} answers in the 2 s before",
        ),
        Promise(
            "at most 1 failed request after the kill (healthy peers)",
            len(failed) <= 1,
            f"{len(failed)} failed",
        ),
    ]
    if stage.settings.stream:
        promises.append(whole_streams(run.load.samples))
    return Result("crash", figures, promises, run.marks, run.load.samples, breakers=run.breakers)


def _minus(value: float | None, base: float) -> float | None:
    return None if value is None else value - base


# -- storm ---------------------------------------------------------------------------------------

STORM_AGENT_DELAY_MS = 400
STORM_PEAK = 8.0  # the ramp ends at this multiple of --rate
STORM_ERROR_RATE = 0.1  # one agent fails this share of its calls (retryable)


async def storm(stage: Stage) -> Result:
    """Ramp the rate past capacity: shedding begins, retries stay bounded, /healthz answers."""
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    for name in names:
        stage.fleet.fault(name, delay_ms=STORM_AGENT_DELAY_MS)
    # One agent fails a share of its calls, so that retries happen and amplification is measured.
    stage.fleet.fault(names[0], delay_ms=STORM_AGENT_DELAY_MS, error_rate=STORM_ERROR_RATE)
    duration = stage.settings.duration
    low, high = stage.settings.rate / 2, stage.settings.rate * STORM_PEAK

    def ramp(t: float) -> float:
        return low + (high - low) * min(t / duration, 1.0)

    run = await drive(stage, "storm", [(0.0, "ramp", lambda: None)], rate=ramp, poll_health=True)
    samples = run.load.samples
    shed = [s for s in samples if s.status == "OVERLOADED"]
    served = [s for s in samples if s.attempts]
    attempts = sum(len(s.attempts) for s in served)
    amplification = round(attempts / len(served), 3) if served else None
    healthz_p99 = percentile(run.healthz_ms, 0.99)
    bound = stage.settings.healthz_p99_ms
    first_shed = min((s.t for s in shed), default=None)
    figures = {
        "rampPerSecond": [round(low, 1), round(high, 1)],
        "agentDelayMs": STORM_AGENT_DELAY_MS,
        "failingAgentErrorRate": STORM_ERROR_RATE,
        "requests": len(samples),
        "shed": len(shed),
        "shedWithRetryAfter": sum(1 for s in shed if s.retry_after),
        "sheddingBeganAtRate": None if first_shed is None else round(ramp(first_shed - run.load.begin), 1),
        "inflightPeak": run.inflight_peak,
        "retried": sum(1 for s in served if len(s.attempts) > 1),
        "retryAmplification": amplification,
        "healthzP50Ms": _round(percentile(run.healthz_ms, 0.5)),
        "healthzP99Ms": _round(healthz_p99),
        "dropped": run.load.dropped,
        "overall": summary(samples),
    }
    promises = [
        Promise(
            "shedding began (the storm exceeded capacity)", bool(shed), f"{len(shed)} shed; raise --rate if 0"
        ),
        Promise(
            "retry amplification <= 1.2",
            amplification is not None and amplification <= 1.2,
            str(amplification),
        ),
        Promise(
            f"/healthz p99 <= {bound:g} ms during the storm",
            healthz_p99 is not None and healthz_p99 <= bound,
            f"{healthz_p99:.1f} ms" if healthz_p99 else "no probe",
        ),
        Promise(
            "every shed answer carries Retry-After",
            bool(shed) and len(shed) == figures["shedWithRetryAfter"],
            f"{figures['shedWithRetryAfter']}/{len(shed)}",
        ),
    ]
    return Result("storm", figures, promises, run.marks, samples, breakers=run.breakers)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- breaker -------------------------------------------------------------------------------------


BREAKER_FAULT_S = 3.0  # how long the agent fails
BREAKER_READ_TIMEOUT_MS = 500  # the drill's per-request read timeout: each held call is a timeout


async def breaker(stage: Stage) -> Result:
    """An agent fails for 3 s, then recovers: the breaker opens, probes, and closes again."""
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    bad = names[0]
    threshold, open_seconds, duration = breaker_plan(stage)

    def fail() -> None:
        stage.fleet.fault(bad, mode="hang_until", until=time.time() + BREAKER_FAULT_S, hang_ms=2000)

    run = await drive(
        stage,
        "breaker",
        [(1.0, f"fails for {BREAKER_FAULT_S:.0f} s", fail)],
        read_timeout_ms=BREAKER_READ_TIMEOUT_MS,
        duration=duration,
    )
    fault_at = next(t for t, _ in run.marks)
    opened = run.watcher.first(bad, "circuit", "open", after=fault_at)
    closed = None if opened is None else run.watcher.first(bad, "circuit", "closed", after=opened)
    failed_attempts = [s.t for s in run.load.samples for a, o in s.attempts if a == bad and o != "SUCCESS"]
    before_open = sum(1 for t in failed_attempts if opened is not None and t < opened)
    probes = sum(
        1
        for s in run.load.samples
        if opened is not None and s.t >= opened and (closed is None or s.t < closed) and s.touched(bad)
    )
    figures = {
        "agent": bad,
        "failureThreshold": threshold,
        "openSeconds": open_seconds,
        # A Router whose policy could not be read: the defaults were assumed.
        "policyAssumed": stage.policy is None,
        "policyClamped": list(stage.clamped),
        "faultSeconds": BREAKER_FAULT_S,
        "readTimeoutMs": BREAKER_READ_TIMEOUT_MS,
        "failuresBeforeOpen": before_open,
        "openedAtS": _sec(opened),
        "halfOpenProbes": probes,
        "closedAtS": _sec(closed),
        "overall": summary(run.load.samples),
    }
    # Calls already sent to the agent when the breaker opened fail too: its share of the rate
    # over one read timeout, plus the watcher's polling interval.
    if stage.settings.concurrency:
        slack = stage.settings.concurrency  # every caller may be waiting on it
    else:
        share = stage.settings.rate / max(stage.settings.agents, 2)
        slack = math.ceil(share * (BREAKER_READ_TIMEOUT_MS / 1000 + 0.2))
    promises = _breaker_promises(threshold, slack, before_open, opened, closed, duration)
    return Result("breaker", figures, promises, run.marks, run.load.samples, breakers=run.breakers)


# The breaker policy the drill will wait on: a Router's open_seconds beyond this would keep the
# drill running for that long (it waits for the half-open probe).
MAX_OPEN_SECONDS = 300.0
MAX_FAILURE_THRESHOLD = 1000


def breaker_plan(stage: Stage) -> tuple[int, float, float]:
    """The failure threshold and open seconds the drill expects, within bounds, and how long it
    runs: long enough to see the half-open probe succeed after the fault ends."""
    threshold = int(stage.policy_number("breaker", "failure_threshold", 5, 1, MAX_FAILURE_THRESHOLD))
    open_seconds = stage.policy_number("breaker", "open_seconds", 10, 0.001, MAX_OPEN_SECONDS)
    duration = max(stage.settings.duration, 1.0 + BREAKER_FAULT_S + open_seconds + 4.0)
    return threshold, open_seconds, duration


def _breaker_promises(
    threshold: int, slack: int, before_open: int, opened: float | None, closed: float | None, duration: float
) -> list[Promise]:
    return [
        Promise("the breaker opened", opened is not None, "opened" if opened else "never opened"),
        Promise(
            f"opened after <= {threshold} failures (+{slack} in flight)",
            opened is not None and before_open <= threshold + slack,
            str(before_open),
        ),
        Promise(
            "closed again after the agent recovered",
            closed is not None,
            "closed" if closed else f"still open after {duration:.0f} s",
        ),
    ]


# -- partition -----------------------------------------------------------------------------------


async def partition(stage: Stage) -> Result:
    """Freeze etcd under load: routing goes on from the snapshot, and resyncs after the thaw."""
    if stage.freeze is None or stage.thaw is None:
        raise ConfigError("partition needs the drill's own etcd: run it without --router")
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    # etcd is frozen for half the drill, at least 8 s: the Router notices within its etcd request
    # timeout (4 s by default), so a shorter freeze could end before it is seen.
    duration = max(stage.settings.duration, 12.0)
    frozen = max(duration / 2, 8.0)
    start = (duration - frozen) / 2
    schedule = [(start, "etcd SIGSTOP", stage.freeze), (start + frozen, "etcd SIGCONT", stage.thaw)]
    run = await drive(stage, "partition", schedule, duration=duration)
    stopped, resumed = (t for t, _ in run.marks)
    during = _between(run.load.samples, stopped, resumed)
    degraded = next((t for t, state in run.watcher.ready if state != "ready" and t >= stopped), None)
    ready_again = next((t for t, state in run.watcher.ready if state == "ready" and t >= resumed), None)
    if degraded is None and _state_at(run.watcher.ready, resumed) == "ready":
        ready_again = resumed  # never left ready
    served = summary(during)
    figures = {
        "stoppedAtS": _sec(stopped),
        "resumedAtS": _sec(resumed),
        "degradedAfterS": _sec(_minus(degraded, stopped)),
        "timeDegradedS": _sec(None if degraded is None else (ready_again or run.load.now()) - degraded),
        "servedDuringPartition": served,
        "resyncAfterS": _sec(_minus(ready_again, resumed)),
        "overall": summary(run.load.samples),
    }
    promises = [
        Promise(
            "the Router noticed: /readyz turned degraded",
            degraded is not None,
            str(figures["degradedAfterS"]),
        ),
        Promise(
            "routing goes on while etcd is frozen (>= 99% success)",
            (served["success"] or 0) >= 0.99,
            f"{served['success']}",
        ),
        Promise(
            "ready again within 10 s of the thaw",
            ready_again is not None and ready_again - resumed <= 10,
            str(figures["resyncAfterS"]),
        ),
    ]
    return Result("partition", figures, promises, run.marks, run.load.samples, breakers=run.breakers)


# -- router-crash --------------------------------------------------------------------------------

# Each drill agent answers this late, so that requests are in flight when the Router dies.
CRASH_DELAY_MS = 1500


async def router_crash(stage: Stage) -> Result:
    """Two Routers over the drill's etcd; async requests accepted by one, which is killed with -9
    mid-run: every accepted request still finishes (read through the other Router)."""
    if stage.crash is None or stage.victim_url is None:
        raise ConfigError("router-crash needs the drill's own Routers and etcd: run it without --router")
    names = stage.fleet.start(max(stage.settings.agents, 2))
    await stage.fleet.wait_registered(names)
    for name in names:
        stage.fleet.fault(name, delay_ms=CRASH_DELAY_MS)
    duration = max(stage.settings.duration, 8.0)
    kill_at = duration / 2
    sender = _AsyncSender(stage, time.monotonic())
    schedule: list[tuple[float, str, Action]] = [(kill_at, "Router A SIGKILL", stage.crash)]
    run, _ = await asyncio.gather(
        drive(stage, "router-crash", schedule, duration=duration), sender.until(kill_at)
    )
    killed = run.marks[0][0]
    finished, last = await sender.results(stage.router_url, deadline_s=60.0)
    accepted = len(sender.accepted)
    in_flight = sum(1 for at in sender.accepted.values() if at > killed - CRASH_DELAY_MS / 1000)
    figures = {
        "killedAtS": _sec(killed),
        "asyncAccepted": accepted,
        "asyncInFlightAtKill": in_flight,
        "asyncFinished": finished,
        "asyncLost": accepted - finished,
        "lastResultAfterKillS": _sec(_minus(last, killed)),
        "servedThroughTheOther": summary(run.load.samples),
    }
    promises = [
        Promise(
            "requests were accepted, some in flight at the kill",
            accepted > 0 and in_flight > 0,
            str(in_flight),
        ),
        Promise("no accepted async request lost", finished == accepted, f"{finished} of {accepted} finished"),
    ]
    return Result("router-crash", figures, promises, run.marks, run.load.samples)


class _AsyncSender:
    """``mode: async`` requests to the Router that will die, and their results read at the other."""

    def __init__(self, stage: Stage, started: float) -> None:
        self.stage = stage
        self.started = started
        self.accepted: dict[str, float] = {}  # traceId -> when it was accepted (drill clock)

    async def until(self, stop_at: float) -> None:
        body = {"targetTask": self.stage.fleet.task, "preferences": {"mode": "async", "timeoutMs": 30_000}}
        headers = auth_headers(self.stage.token)
        async with httpx.AsyncClient(headers=headers, timeout=5) as http:
            while time.monotonic() - self.started < stop_at - 0.2:
                with contextlib.suppress(httpx.HTTPError):
                    resp = await http.post(f"{self.stage.victim_url}/reach", json=body)
                    if resp.status_code == 202:
                        self.accepted[str(resp.json()["traceId"])] = time.monotonic() - self.started
                await asyncio.sleep(1 / max(self.stage.settings.rate / 4, 1))

    async def results(self, url: str, deadline_s: float) -> tuple[int, float | None]:
        """How many accepted requests have a final answer at ``url``, and when the last came."""
        left = set(self.accepted)
        last: float | None = None
        end = time.monotonic() + deadline_s
        async with httpx.AsyncClient(headers=auth_headers(self.stage.token), timeout=5) as http:
            while left and time.monotonic() < end:
                for trace_id in list(left):
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        resp = await http.get(f"{url}/reach/{trace_id}")
                        if resp.status_code != 202 and resp.json().get("status") not in (None, "ACCEPTED"):
                            left.discard(trace_id)
                            last = time.monotonic() - self.started
                if left:
                    await asyncio.sleep(0.2)
        return len(self.accepted) - len(left), last


def _state_at(changes: list[tuple[float, str]], t: float) -> str | None:
    state = None
    for at, value in changes:
        if at > t:
            break
        state = value
    return state


async def burst(stage: Stage) -> Result:
    """A fan-out at slow agents with a declared capacity: every call answered, no breaker opened."""
    settings = stage.settings
    figures, promises, samples = await run_burst(
        stage.fleet, stage.router_url, stage.token, settings.agents, settings.rate
    )
    return Result("burst", figures, [Promise(*p) for p in promises], [(0.0, "burst")], samples)


SCENARIOS: dict[str, Callable[[Stage], Coroutine[Any, Any, Result]]] = {
    "burst": burst,
    "latency": latency,
    "crash": crash,
    "storm": storm,
    "partition": partition,
    "breaker": breaker,
    "router-crash": router_crash,
}
