"""Streamed answers through the Router against the same agent called directly (issue #35).

Three figures, each with the agent (bench/stream_agent.py) and the Router in their own processes
and the caller (aiohttp) in this one:

1. time to first chunk, p50 and p90 of ``--calls`` sequential one-chunk streams, direct and
   through the Router; the difference is what the hop adds. Beside it, the p50 of the same call
   through the Router without streaming (the whole answer), as a control for the machine;
2. ``--concurrent`` streams of 100 chunks each at once: all complete, each in order;
3. one stream of ``--mib`` MiB (64 KiB chunks) direct and through the Router: the time of each,
   the Router's CPU time, and its RSS (its rise over the start, sampled after every MiB). Direct
   and through the Router are read the same way (the same reader, the same 1 MiB reads, on
   connections already warm, neither watching the RSS, which costs the reader time), in
   ``--repeat`` pairs, direct then Router: a quiet direct read of 100 MiB takes about 0.1 s,
   where one scheduler hiccup moves a single run's ratio by half. ``big_*`` are the first pair
   (the single-shot figure of earlier runs, which watched the RSS in the Router's read only);
   ``big_median_*`` the medians over every pair, the ratio being the median of the pairs'
   ratios. The RSS rise is the most of two more streams through the Router, watched. Beside
   each time, the CPU seconds of the three processes (the Router's split into user and
   kernel time): on 2 cores the Router's CPU per MiB decides the ratio, and the agent's and the
   caller's in the direct read say what is left for it.

``--compare-src`` starts a second Router from another tree's ``src/`` (``git archive main src |
tar -x -C /tmp/oldsrc``), registered with the same agent and measured in the same rounds
(``old_*``; its large streams interleaved with the others, direct, Router, old Router).

    .venv/bin/python bench/streaming.py [--calls 300] [--concurrent 500] [--mib 100] [--repeat 7]
        [--compare-src /tmp/oldsrc/src]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import psutil

from servers import Server, free_port, http

BENCH_DIR = Path(__file__).resolve().parent


def envelope(chunks: int, size: int) -> bytes:
    prefs = {"timeoutMs": 300_000}
    return json.dumps(
        {"targetTask": "talk", "payload": {"chunks": chunks, "size": size}, "preferences": prefs}
    ).encode()


HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


async def one_stream(http_: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, list[int], int]:
    """(seconds to the first chunk event, the chunk numbers in order, bytes read)."""
    started = time.perf_counter()
    first = 0.0
    order: list[int] = []
    total = 0
    buffer = b""
    async with http_.post(url, data=body, headers=HEADERS) as resp:
        if resp.content_type != "text/event-stream":
            raise RuntimeError(f"{url} answered {resp.status} {(await resp.read())[:300]!r}")
        async for data in resp.content.iter_any():
            total += len(data)
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if event.startswith(b"event: chunk"):
                    if not first:
                        first = time.perf_counter() - started
                    number = event.split(b"data: [", 1)[1].split(b",", 1)[0]
                    order.append(int(number))
    return first, order, total


class Cpu(NamedTuple):
    """CPU seconds over one large stream: the Router's (its user and kernel time apart, to the
    kernel's 10 ms tick), the agent's, the caller's (this process)."""

    router: float
    router_user: float
    router_sys: float
    agent: float
    caller: float


class Procs(NamedTuple):
    router: psutil.Process
    agent: psutil.Process


def run_seconds(process: psutil.Process) -> float:
    """The CPU seconds a process's threads have run, to the nanosecond (the scheduler's own
    count, where psutil's user and system times move by 10 ms ticks: a third of the figure)."""
    try:
        tasks = Path(f"/proc/{process.pid}/task")
        return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks.iterdir()) / 1e9
    except (OSError, ValueError):
        return float(sum(process.cpu_times()[:2]))


def _cpu_now(procs: Procs) -> Cpu:
    router = procs.router.cpu_times()
    return Cpu(
        run_seconds(procs.router), router.user, router.system, run_seconds(procs.agent), time.process_time()
    )


async def big_stream(
    http_: aiohttp.ClientSession, url: str, body: bytes, procs: Procs, watch: bool
) -> tuple[float, int, int, Cpu]:
    """(seconds, bytes, peak RSS rise of the Router in bytes, the CPU seconds of each process)
    for one large stream. ``watch`` samples the Router's RSS after every MiB read: that costs
    the reader 10-35 ms per 100 MiB (measured), so the timed reads, direct and through the
    Router alike, do not watch, and the RSS is taken in reads of their own."""
    router = procs.router
    base = router.memory_info().rss
    peak = base
    before = _cpu_now(procs)
    started = time.perf_counter()
    total = 0
    async with http_.post(url, data=body, headers=HEADERS) as resp:
        async for data in resp.content.iter_chunked(1 << 20):
            total += len(data)
            if watch:
                peak = max(peak, router.memory_info().rss)
    seconds = time.perf_counter() - started
    # CPU seconds (user and system) of each process: what the hop costs, apart from how the
    # machine's scheduler shares its cores between three processes.
    after = _cpu_now(procs)
    cpu = Cpu(*(round(a - b, 4) for a, b in zip(after, before, strict=True)))
    return seconds, total, max(peak, router.memory_info().rss) - base, cpu


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def stream_latency(
    args: argparse.Namespace, http_: aiohttp.ClientSession, targets: dict[str, str], procs: dict[str, Procs]
) -> dict[str, Any]:
    """Time to first chunk, direct and through each Router; each Router's CPU per call."""
    out: dict[str, Any] = {}
    for name, url in targets.items():
        for _ in range(20):  # warm the connections and the code paths
            await one_stream(http_, url, envelope(1, 16))
        router = procs[name].router if name in procs else None
        cpu = run_seconds(router) if router is not None else 0.0
        ttfc = [(await one_stream(http_, url, envelope(1, 16)))[0] * 1000 for _ in range(args.calls)]
        if router is not None:
            # The Router's CPU per streamed call: what the hop costs, however loaded the machine.
            used = run_seconds(router) - cpu
            out[f"{name}_cpu_us_per_stream"] = round(used / args.calls * 1e6)
        out[f"ttfc_{name}_p50_ms"] = round(statistics.median(ttfc), 3)
        out[f"ttfc_{name}_p90_ms"] = round(pct(ttfc, 0.9), 3)
    for name in procs:
        out[f"ttfc_{name}_added_p50_ms"] = round(out[f"ttfc_{name}_p50_ms"] - out["ttfc_direct_p50_ms"], 3)
    return out


async def measure(
    args: argparse.Namespace, targets: dict[str, str], procs: dict[str, Procs]
) -> dict[str, Any]:
    """``targets``: direct, router and (with --compare-src) old, each a /reach URL."""
    out: dict[str, Any] = {}
    routed, router = targets["router"], procs["router"].router
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http_:
        out.update(await stream_latency(args, http_, targets, procs))
        # The control: the same call through the Router without streaming (the agent's one
        # chunk gathered into a plain answer), so the machine's own noise is visible beside it.
        plain = []
        cpu = run_seconds(router)
        for _ in range(args.calls):
            started = time.perf_counter()
            async with http_.post(
                routed, data=envelope(1, 16), headers={"Content-Type": "application/json"}
            ) as resp:
                await resp.read()
            plain.append((time.perf_counter() - started) * 1000)
        out["plain_router_p50_ms"] = round(statistics.median(plain), 3)
        out["router_cpu_us_per_plain_call"] = round((run_seconds(router) - cpu) / args.calls * 1e6)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(http_, routed, envelope(100, 32)) for _ in range(args.concurrent))
        )
        out["concurrent_streams"] = args.concurrent
        out["concurrent_seconds"] = round(time.perf_counter() - started, 2)
        out["concurrent_all_whole_and_in_order"] = all(order == list(range(100)) for _, order, _ in results)
        out.update(await big_streams(args, http_, targets, procs))
    return out


async def big_streams(
    args: argparse.Namespace, http_: aiohttp.ClientSession, targets: dict[str, str], procs: dict[str, Procs]
) -> dict[str, Any]:
    """The large stream, direct then through each Router, ``--repeat`` times."""
    chunk = 64 * 1024
    body = envelope(args.mib * 1024 * 1024 // chunk, chunk)
    runs: dict[str, list[tuple[float, int, int, Cpu]]] = {name: [] for name in targets}
    for _ in range(args.repeat):
        for name, url in targets.items():
            runs[name].append(
                await big_stream(http_, url, body, procs.get(name, procs["router"]), watch=False)
            )
    out: dict[str, Any] = {}
    for name, found in runs.items():
        if any(size < args.mib << 20 for _, size, _, _ in found):
            raise RuntimeError(f"a {name} stream came back short: {[size for _, size, _, _ in found]}")
    seconds, total, _, _ = runs["direct"][0]
    out["big_direct_seconds"] = round(seconds, 3)
    out["big_direct_mib"] = round(total / (1 << 20), 1)
    out["big_repeat"] = args.repeat
    direct = runs["direct"]
    out["big_median_direct_seconds"] = round(statistics.median(d[0] for d in direct), 3)
    out["big_median_direct_agent_cpu_seconds"] = round(statistics.median(d[3].agent for d in direct), 3)
    out["big_median_direct_caller_cpu_seconds"] = round(statistics.median(d[3].caller for d in direct), 3)
    for name in procs:
        routed = runs[name]
        # The Router's RSS, sampled after every MiB of streams of their own (not timed).
        watched = [await big_stream(http_, targets[name], body, procs[name], watch=True) for _ in range(2)]
        out[f"big_{name}_seconds"] = round(routed[0][0], 3)
        out[f"big_{name}_rss_rise_mib"] = round(max(w[2] for w in watched) / (1 << 20), 1)
        out[f"big_{name}_ratio"] = round(routed[0][0] / direct[0][0], 2)
        ratios = [r[0] / d[0] for d, r in zip(direct, routed, strict=True)]
        out[f"big_median_{name}_seconds"] = round(statistics.median(r[0] for r in routed), 3)
        out[f"big_median_{name}_ratio"] = round(statistics.median(ratios), 2)
        out[f"big_{name}_ratios"] = [round(ratio, 2) for ratio in ratios]
        for part, label in CPU_LABELS:
            value = statistics.median(getattr(r[3], part) for r in routed)
            out[f"big_median_{name}_{label}_seconds"] = round(value, 3)
    return out


# Each process's CPU in the Router's large streams, as named in the figures.
CPU_LABELS = (
    ("router", "cpu"),
    ("router_user", "cpu_user"),
    ("router_sys", "cpu_sys"),
    ("agent", "agent_cpu"),
    ("caller", "caller_cpu"),
)

ROUTER_CONFIG = (
    # No lag shedding and room for one client's 500 streams; a connect timeout that a loaded
    # machine's 500 simultaneous connects stay within. No embedding model: the calls name their
    # task exactly, and a Router embedding the new agent's profile in a thread beside the
    # measured calls (the first second or so) measured the model.
    "embedding:\n  backend: none\n"
    "streaming:\n  max_bytes: 1099511627776\n"
    "limits:\n  loop_lag_shedding: false\n  max_inflight_per_client: 1024\n"
    "timeouts:\n  connect_ms: 5000\n"
)


def start_router(name: str, workdir: Path, agent_url: str, src: str | None) -> tuple[Server, str]:
    """A Router (from ``src`` when given) with the streaming agent registered; its base URL."""
    port = free_port()
    config = workdir / "router.yaml"
    config.write_text(ROUTER_CONFIG)
    argv = [sys.executable, "-m", "reachmesh", "router", "--port", str(port), "--config", str(config)]
    env = {"PYTHONPATH": src} if src else None
    router = Server(name, [*argv, "--log-level", "WARNING"], workdir / f"{name}.log", env=env)
    router.start()
    base = f"http://127.0.0.1:{port}"
    try:
        router.wait_ready(lambda: http("GET", f"{base}/healthz")[0] == 200)
        profile = {"id": "streamer", "network": {"endpoint": agent_url}, "capabilities": [{"task": "talk"}]}
        status, answer = http("POST", f"{base}/agents", profile)
        if status != 201:
            raise RuntimeError(f"registration with {name} failed: {status} {answer}")
    except BaseException:
        router.stop()
        raise
    return router, base


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=500)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7, help="pairs of large streams (direct, Router)")
    parser.add_argument(
        "--compare-src", help="a src/ folder of another version: its Router is measured too, as old"
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reach-stream-bench-"))
    started: list[Server] = []
    try:
        agent_port = free_port()
        agent = Server(
            "agent",
            [sys.executable, str(BENCH_DIR / "stream_agent.py"), str(agent_port)],
            workdir / "agent.log",
        )
        agent.start()
        started.append(agent)
        agent.wait_ready(lambda: http("GET", f"http://127.0.0.1:{agent_port}/healthz")[0] == 200)
        agent_url = f"http://127.0.0.1:{agent_port}/reach"
        targets = {"direct": agent_url}
        procs: dict[str, Procs] = {}
        for name, src in (("router", None), ("old", args.compare_src)):
            if name == "old" and not src:
                continue
            (workdir / name).mkdir()
            router, base = start_router(name, workdir / name, agent_url, src)
            started.append(router)
            targets[name] = f"{base}/reach"
            procs[name] = Procs(psutil.Process(router.pid), psutil.Process(agent.pid))
        results = asyncio.run(measure(args, targets, procs))
        print(json.dumps(results, indent=2))
    finally:
        for server in reversed(started):
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
