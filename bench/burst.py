"""Bursts at slow agents (issue #34): every caller answered, the Router's p99 beside a direct
burst's, the Router's memory per call in flight, capacity kept, and load-aware shares.

    .venv/bin/python bench/burst.py one   [--calls 2000] [--hold 8]
    .venv/bin/python bench/burst.py many  [--calls 10000] [--hold 30] [--agents 10]
        [--caller-procs 4] [--caller-connecting 256] [--routers 2] [--router-backlog 4096]
    .venv/bin/python bench/burst.py cap   # max_concurrency 20, 200 calls held 0.5 s
    .venv/bin/python bench/burst.py share # capacities 10 and 100, a 100-call burst
    .venv/bin/python bench/burst.py one --hogs 2  # "busy": two CPU hogs beside the run

Agents (bench/slow_agent.py, aiohttp) and the Router (``reach router``) run in processes of
their own; the callers are this process, or ``--caller-procs`` processes. A Router holds two
file descriptors per call in flight, and where ``RLIMIT_NOFILE``'s hard limit cannot be raised
(20,000 here, without CAP_SYS_RESOURCE) one Router holds at most about 9,990 calls:
``--routers 2`` runs two, every agent registered with each and the caller processes spread over
them, and sums their memory. ``one`` sends the burst straight to the agent first,
then through the Router, in the same run. Memory: the Router's RSS just before the burst, and
its peak while the burst is in flight (sampled every 100 ms), over the calls in flight. Each run
is bounded by the hold time plus a minute. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httptools
import uvloop
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import Server, free_port, http

HERE = Path(__file__).resolve().parent


CONNECTING = {"per_agent": 32}  # --connecting sets outbound.max_connecting_per_agent
# --caller-procs: processes the callers are split over; --caller-connecting: connects in
# progress at once in each
CALLERS = {"procs": 1, "connecting": 10_000}
AGENT = {"backlog": 128}  # --agent-backlog: the slow agents' listen backlog (aiohttp's default)
ROUTER = {"backlog": 2048}  # --router-backlog: server.listen_backlog (capped by net.core.somaxconn)
# --per-agent-connections: outbound.max_connections_per_agent (default: above the burst). Below
# it, one Router holds more calls than its file descriptors allow two each for: the calls past
# the cap wait in the Router for a connection (a whole hold) instead of failing at EMFILE.
PER_AGENT: dict[str, int | None] = {"connections": None}


def policy(calls: int, hold_s: float) -> dict[str, Any]:
    """Limits that admit the whole burst: the queueing under test is the per-agent one."""
    wait_ms = int((hold_s + 60) * 1000)
    # Only when set: a Router from before the key (--compare runs of older code) refuses it.
    server = {"server": {"listen_backlog": ROUTER["backlog"]}} if ROUTER["backlog"] != 2048 else {}
    return {
        **server,
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "logging": {"level": "WARNING"},
        "limits": {
            "max_inflight": calls + 100,
            "max_inflight_per_client": calls + 100,
            "max_timeout_ms": wait_ms,
            "loop_lag_shedding": False,
            "max_queued_per_agent": calls,
        },
        "timeouts": {"read_ms": wait_ms, "overall_ms": wait_ms},
        "outbound": {
            "max_connections": calls + 100,
            "max_connections_per_agent": PER_AGENT["connections"] or calls + 100,
            "max_connecting_per_agent": CONNECTING["per_agent"],
        },
    }


class Fleet:
    """Routers (one unless ``--routers``) and slow agents, each its own process."""

    def __init__(self, tmp: Path, calls: int, hold_s: float, routers: int = 1) -> None:
        self.tmp = tmp
        self.hold_s = hold_s
        config = tmp / "router.yaml"
        config.write_text(yaml.safe_dump(policy(calls, hold_s)))
        self.routers: list[tuple[Server, str]] = []
        for index in range(routers):
            port = free_port()
            argv = [sys.executable, "-m", "reachmesh", "router", "--port", str(port), "--config", str(config)]
            name = "router" if index == 0 else f"router-{index}"
            self.routers.append((Server(name, argv, tmp / f"{name}.log"), f"http://127.0.0.1:{port}"))
        self.router, self.url = self.routers[0]
        self.agents: list[tuple[str, Server, int]] = []

    def start(self) -> None:
        for router, url in self.routers:
            router.start()
            router.wait_ready(lambda url=url: http("GET", f"{url}/readyz")[0] == 200, 60)  # type: ignore[misc]

    def agent(self, agent_id: str, capacity: int | None = None) -> str:
        port = free_port()
        backlog = str(AGENT["backlog"])
        argv = [sys.executable, str(HERE / "slow_agent.py"), str(port), str(self.hold_s), backlog]
        server = Server(agent_id, argv, self.tmp / f"{agent_id}.log")
        server.start()
        base = f"http://127.0.0.1:{port}"
        server.wait_ready(lambda: http("GET", f"{base}/healthz")[0] == 200, 30)
        profile: dict[str, Any] = {
            "id": agent_id,
            "network": {"endpoint": f"{base}/reach"},
            "capabilities": [{"task": "slow"}],
        }
        if capacity is not None:
            profile["max_concurrency"] = capacity
        for _, url in self.routers:
            status, answer = http("POST", f"{url}/agents", profile)
            if status not in (200, 201):
                raise RuntimeError(f"registration of {agent_id}: {status} {answer}")
        self.agents.append((agent_id, server, port))
        return f"{base}/reach"

    def peak(self, port: int) -> dict[str, Any]:
        return dict(http("GET", f"http://127.0.0.1:{port}/peak")[1])

    def stop(self) -> None:
        for _, server, _ in self.agents:
            server.stop()
        for router, _ in self.routers:
            router.stop()


class RssPeak:
    """The Routers' RSS (summed), sampled every 100 ms on a thread until stopped."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers
        self.before = self._rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        return sum(server.rss_bytes() for server in self.servers)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class _Call(asyncio.Protocol):
    """One call on a connection of its own: the request written at once, the answer parsed whole.

    Lean on purpose: with aiohttp's client, four caller processes took 20 s to get a 10,000-call
    burst to the Router (the Router itself used 5.5 s of CPU in all), and so measured themselves
    more than the Router."""

    def __init__(self, request: bytes, done: asyncio.Future[tuple[int, bytes]]) -> None:
        self.request = request
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(exc)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.done.done():
            self.done.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self._end(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("closed before the whole answer"))

    def _end(self, exc: Exception | None) -> None:
        if exc is not None and not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


async def burst(url: str, calls: int, budget_ms: int, connecting: int) -> dict[str, Any]:
    """``calls`` POSTs at once, each on its own connection; statuses, handlers, each call's time."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    preferences = {"timeoutMs": budget_ms, "readTimeoutMs": budget_ms}
    body = json.dumps({"targetTask": "slow", "payload": {}, "preferences": preferences}).encode()
    request = (
        f"POST {parsed.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    took: list[float] = []
    statuses: dict[str, int] = {}
    handlers: dict[str, int] = {}
    errors: dict[str, Any] = {}  # one error answer of each status, to say why

    # Connects in progress at once, per caller process, as a client's connection pool would
    # open them: 10,000 SYNs within a millisecond overflowed the Router's listen queue (Linux
    # then answers with SYN cookies, and some failed: reset connections). Every call is still
    # in flight at once; only the opening of their connections is paced.
    opening = asyncio.Semaphore(connecting)

    async def one() -> None:
        sent = time.monotonic()
        done: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        try:
            async with asyncio.timeout(budget_ms / 1000 + 30):
                async with opening:
                    await loop.create_connection(lambda: _Call(request, done), host, port)
                _, raw = await done
            answer = json.loads(raw)
            status = str(answer.get("status"))
            handler = str(answer.get("handlerAgentId") or "direct")
            if status != "SUCCESS" and "error" in answer:
                errors.setdefault(status, answer["error"])
        except (OSError, TimeoutError, ValueError, httptools.HttpParserError) as exc:
            status, handler = f"client:{type(exc).__name__}", "-"
            errors.setdefault(status, str(exc)[:200])
        took.append(time.monotonic() - sent)
        statuses[status] = statuses.get(status, 0) + 1
        handlers[handler] = handlers.get(handler, 0) + 1

    started = time.time()
    await asyncio.gather(*(one() for _ in range(calls)))
    return {"statuses": statuses, "handlers": handlers, "errors": errors, "took": took, "started": started}


def summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The bursts of several caller processes as one: counts added, p50/p99 over every call."""
    statuses: dict[str, int] = {}
    handlers: dict[str, int] = {}
    errors: dict[str, Any] = {}
    took: list[float] = []
    for part in parts:
        for key, value in part["statuses"].items():
            statuses[key] = statuses.get(key, 0) + value
        for key, value in part["handlers"].items():
            handlers[key] = handlers.get(key, 0) + value
        errors.update(part["errors"])
        took.extend(part["took"])
    took.sort()
    return {
        "answered": statuses.get("SUCCESS", 0),
        "statuses": statuses,
        "handlers": handlers,
        "errors": errors,
        "p50_s": round(took[len(took) // 2], 2),
        "p99_s": round(took[min(len(took) - 1, int(len(took) * 0.99))], 2),
        "started": min(part["started"] for part in parts),
    }


def _burst_part(url: str, calls: int, budget_ms: int, connecting: int) -> dict[str, Any]:
    raise_nofile()
    return uvloop.run(burst(url, calls, budget_ms, connecting))


def send_burst(urls: list[str], calls: int, budget_ms: int) -> dict[str, Any]:
    """``calls`` at once from ``CALLERS["procs"]`` processes (one process: this one), the
    processes spread over ``urls`` in turn."""
    procs = max(1, CALLERS["procs"])
    if procs == 1:
        return summed([uvloop.run(burst(urls[0], calls, budget_ms, CALLERS["connecting"]))])
    shares = [calls // procs + (1 if i < calls % procs else 0) for i in range(procs)]
    targets = [urls[i % len(urls)] for i in range(procs)]
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        connecting = [CALLERS["connecting"]] * procs
        parts = list(pool.map(_burst_part, targets, shares, [budget_ms] * procs, connecting))
    return summed(parts)


def raise_nofile() -> None:
    """Room for a burst's descriptors in this process and the processes it starts (they inherit
    it): the Router holds two per call in flight. Up to the kernel's ``nr_open`` where the hard
    limit may be raised (CAP_SYS_RESOURCE), else up to the hard limit."""
    want = 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    with contextlib.suppress(ValueError, OSError):
        ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, ceiling), max(hard, min(want, ceiling))))
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``values``, in seconds, rounded."""
    ordered = sorted(values)
    if not ordered:
        return {}
    at = lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))]  # noqa: E731
    return {"p50_s": round(at(0.5), 2), "p99_s": round(at(0.99), 2), "max_s": round(ordered[-1], 2)}


def arrivals(fleet: Fleet, port: int, found: dict[str, Any]) -> None:
    """When the burst's requests reached the agent, from the burst's start; then clears them. The
    rest of a caller's time is the hold and the way back."""
    started = found.pop("started")
    seen = fleet.peak(port)["arrivals"]
    found["agent_arrival"] = quantiles([t - started for t in seen])
    http("POST", f"http://127.0.0.1:{port}/peak/reset")


def through_router(fleet: Fleet, calls: int, budget_ms: int) -> dict[str, Any]:
    rss = RssPeak([router for router, _ in fleet.routers])
    try:
        found = send_burst([f"{url}/reach" for _, url in fleet.routers], calls, budget_ms)
    finally:
        rss.stop()
    found["router_rss_before_mib"] = round(rss.before / 2**20, 1)
    found["router_rss_peak_mib"] = round(rss.peak / 2**20, 1)
    found["kib_per_call_in_flight"] = round((rss.peak - rss.before) / 1024 / calls, 1)
    return found


def router_side(fleet: Fleet, started: float, sample: int = 200) -> dict[str, Any]:
    """Where a sample of the burst's calls spent their time in the Router, from its traces: when
    each reached the Router (from the burst's start), how long it waited for a slot or a pooled
    connection, and its attempt's duration (the hold and the connect included)."""
    from datetime import datetime

    listed = http("GET", f"{fleet.url}/admin/traces?limit=1000", timeout_s=10)[1] or []
    reached, pool_wait, attempt = [], [], []
    for row in listed[:: max(1, len(listed) // sample)]:
        trace = http("GET", f"{fleet.url}/admin/traces/{row['traceId']}", timeout_s=10)[1] or {}
        hop = trace.get("hops", [{}])[0]
        at = datetime.fromisoformat(str(hop.get("startedAt", "")).replace("Z", "+00:00")).timestamp()
        reached.append(at - started)
        pool_wait.append(float(hop.get("poolWaitMs", 0.0)) / 1000)
        attempt.append(sum(float(a.get("durationMs", 0.0)) for a in hop.get("attempts", [])) / 1000)
    return {
        "sampled": len(reached),
        "reached_router": quantiles(reached),
        "pool_wait": quantiles(pool_wait),
        "attempts": quantiles(attempt),
    }


def failed_attempt(fleet: Fleet) -> dict[str, Any]:
    """The first stored hop with a failed attempt (its events say why), or {}."""
    for status in ("NO_AVAILABLE_HANDLER", "SUCCESS", "TIMEOUT"):
        listed = http("GET", f"{fleet.url}/admin/traces?limit=1000&status={status}", timeout_s=10)[1] or []
        for row in listed:
            if row.get("attempts", 0) == 0:
                continue
            trace = http("GET", f"{fleet.url}/admin/traces/{row['traceId']}", timeout_s=10)[1] or {}
            hop = trace["hops"][0]
            if any(a.get("outcome") != "SUCCESS" for a in hop.get("attempts", [])):
                return dict(hop)
    return {}


@contextlib.contextmanager
def hogs(count: int) -> Any:
    """``count`` processes that spin on a core each for the whole run: the project's "busy
    machine" (two on a 2-core machine). Stopped when the run ends, however it ends."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in spinning:
            proc.kill()
            proc.wait(timeout=5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]  # the machine's own load, before the hogs
    with hogs(args.hogs):
        out = _run(args)
        out["hogs"] = args.hogs
        out["load_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return out


def _run(args: argparse.Namespace) -> dict[str, Any]:
    scenario = args.scenario
    calls, hold = {"cap": (200, 0.5), "share": (100, 2.0)}.get(scenario, (args.calls, args.hold))
    budget_ms = int((hold + 60) * 1000)
    with tempfile.TemporaryDirectory() as name:
        fleet = Fleet(Path(name), calls, hold, args.routers)
        try:
            fleet.start()
            out: dict[str, Any] = {
                "scenario": scenario,
                "calls": calls,
                "hold_s": hold,
                "max_connecting_per_agent": CONNECTING["per_agent"],
                "agent_backlog": AGENT["backlog"],
                "router_backlog": ROUTER["backlog"],
                "routers": args.routers,
                "caller_procs": CALLERS["procs"],
                "caller_connecting": CALLERS["connecting"],
            }
            if scenario == "one":
                direct = fleet.agent("slow-0")
                port = fleet.agents[0][2]
                out["direct"] = send_burst([direct], calls, budget_ms)
                arrivals(fleet, port, out["direct"])
                out["router"] = through_router(fleet, calls, budget_ms)
                out["router"]["inside"] = router_side(fleet, out["router"]["started"])
                arrivals(fleet, port, out["router"])
                out["p99_router_minus_direct_s"] = round(out["router"]["p99_s"] - out["direct"]["p99_s"], 2)
            elif scenario == "many":
                for i in range(args.agents):
                    fleet.agent(f"slow-{i}")
                out["router"] = through_router(fleet, calls, budget_ms)
                out["router"]["inside"] = router_side(fleet, out["router"]["started"])
            elif scenario == "cap":
                fleet.agent("capped", capacity=20)
                out["router"] = through_router(fleet, calls, budget_ms)
                out["agent_peak"] = fleet.peak(fleet.agents[0][2])["peak"]
            else:
                fleet.agent("small", capacity=10)
                fleet.agent("big", capacity=100)
                out["router"] = through_router(fleet, calls, budget_ms)
                out["big_share"] = out["router"]["handlers"].get("big", 0) / calls
            out["router_cpu_s"] = round(sum(router.cpu_seconds() for router, _ in fleet.routers), 1)
            if out["router"]["answered"] < calls:  # say why: the Router's log, its attempts' outcomes
                print(fleet.router.log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
                with urllib.request.urlopen(f"{fleet.url}/metrics", timeout=10) as resp:
                    lines = resp.read().decode().splitlines()
                print("\n".join(x for x in lines if x.startswith("reach_upstream_attempts")), file=sys.stderr)
                print(json.dumps(failed_attempt(fleet))[:3000], file=sys.stderr)
            for found in (out.get("direct"), out["router"]):
                if found is not None:
                    found.pop("started", None)
            return out
        finally:
            fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["one", "many", "cap", "share"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--hold", type=float, default=8.0)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--connecting", type=int, default=32, help="outbound.max_connecting_per_agent")
    parser.add_argument("--caller-procs", type=int, default=1, help="processes the callers are split over")
    parser.add_argument("--agent-backlog", type=int, default=128, help="the agents' listen backlog")
    parser.add_argument("--router-backlog", type=int, default=2048, help="server.listen_backlog")
    parser.add_argument(
        "--per-agent-connections", type=int, default=None, help="outbound.max_connections_per_agent"
    )
    parser.add_argument(
        "--routers", type=int, default=1, help="Router processes, every agent registered with each (fds)"
    )
    parser.add_argument(
        "--caller-connecting", type=int, default=10_000, help="connects in progress at once, per caller"
    )
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs beside the run (busy machine: 2)")
    args = parser.parse_args()
    CALLERS["connecting"] = args.caller_connecting
    AGENT["backlog"] = args.agent_backlog
    ROUTER["backlog"] = args.router_backlog
    PER_AGENT["connections"] = args.per_agent_connections
    CONNECTING["per_agent"] = args.connecting
    CALLERS["procs"] = args.caller_procs
    raise_nofile()
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
