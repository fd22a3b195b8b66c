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
   ratios. The RSS rise is the most of two more streams through the Router, watched.

    .venv/bin/python bench/streaming.py [--calls 300] [--concurrent 500] [--mib 100] [--repeat 7]
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
from typing import Any

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


async def big_stream(
    http_: aiohttp.ClientSession, url: str, body: bytes, router: psutil.Process, watch: bool
) -> tuple[float, int, int, float]:
    """(seconds, bytes, peak RSS rise of the Router in bytes, the Router's CPU seconds) for one
    large stream. ``watch`` samples the Router's RSS after every MiB read: that costs the reader
    10-35 ms per 100 MiB (measured), so the timed reads, direct and through the Router alike,
    do not watch, and the RSS is taken in reads of their own."""
    base = router.memory_info().rss
    peak = base
    cpu = sum(router.cpu_times()[:2])
    started = time.perf_counter()
    total = 0
    async with http_.post(url, data=body, headers=HEADERS) as resp:
        async for data in resp.content.iter_chunked(1 << 20):
            total += len(data)
            if watch:
                peak = max(peak, router.memory_info().rss)
    seconds = time.perf_counter() - started
    # The Router's CPU seconds (user and system): what the hop costs, apart from how the
    # machine's scheduler shares its cores between three processes.
    cpu = sum(router.cpu_times()[:2]) - cpu
    return seconds, total, max(peak, router.memory_info().rss) - base, cpu


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def measure(
    args: argparse.Namespace, direct: str, routed: str, router: psutil.Process
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http_:
        for name, url in (("direct", direct), ("router", routed)):
            for _ in range(20):  # warm the connections and the code paths
                await one_stream(http_, url, envelope(1, 16))
            cpu = sum(router.cpu_times()[:2])
            ttfc = [(await one_stream(http_, url, envelope(1, 16)))[0] * 1000 for _ in range(args.calls)]
            if name == "router":
                # The Router's CPU per streamed call: what the hop costs, however loaded the machine.
                used = sum(router.cpu_times()[:2]) - cpu
                out["router_cpu_us_per_stream"] = round(used / args.calls * 1e6)
            out[f"ttfc_{name}_p50_ms"] = round(statistics.median(ttfc), 3)
            out[f"ttfc_{name}_p90_ms"] = round(pct(ttfc, 0.9), 3)
        # The control: the same call through the Router without streaming (the agent's one
        # chunk gathered into a plain answer), so the machine's own noise is visible beside it.
        plain = []
        cpu = sum(router.cpu_times()[:2])
        for _ in range(args.calls):
            started = time.perf_counter()
            async with http_.post(
                routed, data=envelope(1, 16), headers={"Content-Type": "application/json"}
            ) as resp:
                await resp.read()
            plain.append((time.perf_counter() - started) * 1000)
        out["plain_router_p50_ms"] = round(statistics.median(plain), 3)
        out["router_cpu_us_per_plain_call"] = round((sum(router.cpu_times()[:2]) - cpu) / args.calls * 1e6)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(http_, routed, envelope(100, 32)) for _ in range(args.concurrent))
        )
        out["concurrent_streams"] = args.concurrent
        out["concurrent_seconds"] = round(time.perf_counter() - started, 2)
        out["concurrent_all_whole_and_in_order"] = all(order == list(range(100)) for _, order, _ in results)
        out.update(await big_streams(args, http_, direct, routed, router))
    out["ttfc_added_p50_ms"] = round(out["ttfc_router_p50_ms"] - out["ttfc_direct_p50_ms"], 3)
    return out


async def big_streams(
    args: argparse.Namespace, http_: aiohttp.ClientSession, direct: str, routed: str, router: psutil.Process
) -> dict[str, Any]:
    """The large stream, direct then through the Router, ``--repeat`` times."""
    chunk = 64 * 1024
    body = envelope(args.mib * 1024 * 1024 // chunk, chunk)
    runs: dict[str, list[tuple[float, int, int, float]]] = {"direct": [], "router": []}
    for _ in range(args.repeat):
        for name, url in (("direct", direct), ("router", routed)):
            runs[name].append(await big_stream(http_, url, body, router, watch=False))
    # The Router's RSS, sampled after every MiB of streams of their own (not timed).
    watched = [await big_stream(http_, routed, body, router, watch=True) for _ in range(2)]
    out: dict[str, Any] = {}
    for name, found in runs.items():
        seconds, total, _, _ = found[0]
        out[f"big_{name}_seconds"] = round(seconds, 3)
        out[f"big_{name}_mib"] = round(total / (1 << 20), 1)
        if any(size < args.mib << 20 for _, size, _, _ in found):
            raise RuntimeError(f"a {name} stream came back short: {[size for _, size, _, _ in found]}")
    router_runs = runs["router"]
    out["big_router_rss_rise_mib"] = round(max(w[2] for w in watched) / (1 << 20), 1)
    out["big_router_cpu_seconds"] = round(router_runs[0][3], 3)
    out["big_ratio"] = round(router_runs[0][0] / runs["direct"][0][0], 2)
    ratios = [r[0] / d[0] for d, r in zip(runs["direct"], router_runs, strict=True)]
    out["big_repeat"] = args.repeat
    out["big_median_direct_seconds"] = round(statistics.median(d[0] for d in runs["direct"]), 3)
    out["big_median_router_seconds"] = round(statistics.median(r[0] for r in router_runs), 3)
    out["big_median_ratio"] = round(statistics.median(ratios), 2)
    out["big_ratios"] = [round(ratio, 2) for ratio in ratios]
    out["big_median_router_cpu_seconds"] = round(statistics.median(r[3] for r in router_runs), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=500)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7, help="pairs of large streams (direct, Router)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reach-stream-bench-"))
    started: list[Server] = []
    try:
        agent_port, router_port = free_port(), free_port()
        agent = Server(
            "agent",
            [sys.executable, str(BENCH_DIR / "stream_agent.py"), str(agent_port)],
            workdir / "agent.log",
        )
        agent.start()
        started.append(agent)
        config = workdir / "router.yaml"
        # No lag shedding and room for one client's 500 streams; a connect timeout that a
        # loaded machine's 500 simultaneous connects stay within. No embedding model: the
        # calls name their task exactly, and a Router embedding the new agent's profile in a
        # thread beside the measured calls (the first second or so) measured the model.
        config.write_text(
            "embedding:\n  backend: none\n"
            "streaming:\n  max_bytes: 1099511627776\n"
            "limits:\n  loop_lag_shedding: false\n  max_inflight_per_client: 1024\n"
            "timeouts:\n  connect_ms: 5000\n"
        )
        argv = [
            sys.executable,
            "-m",
            "reachmesh",
            "router",
            "--port",
            str(router_port),
            "--config",
            str(config),
            "--log-level",
            "WARNING",
        ]
        router = Server("router", argv, workdir / "router.log")
        router.start()
        started.append(router)
        base = f"http://127.0.0.1:{router_port}"
        agent.wait_ready(lambda: http("GET", f"http://127.0.0.1:{agent_port}/healthz")[0] == 200)
        router.wait_ready(lambda: http("GET", f"{base}/healthz")[0] == 200)
        profile = {
            "id": "streamer",
            "network": {"endpoint": f"http://127.0.0.1:{agent_port}/reach"},
            "capabilities": [{"task": "talk"}],
        }
        status, answer = http("POST", f"{base}/agents", profile)
        if status != 201:
            raise RuntimeError(f"registration failed: {status} {answer}")
        results = asyncio.run(
            measure(args, f"http://127.0.0.1:{agent_port}/reach", f"{base}/reach", psutil.Process(router.pid))
        )
        print(json.dumps(results, indent=2))
    finally:
        for server in reversed(started):
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
