"""What each observer of the decision record costs per request, in process, with the GC on.

The Router's c32 throughput moves by several percent from run to run on a shared 2-core machine,
more than tracing and metrics cost, so this measures them directly: one real request through a
Router with a fake agent gives a real decision record, then each observer (metrics, the trace
store, the trace-line writer's per-request part) is fed that record ``--requests`` times with a
fresh traceId each time, in the Router's own process, so the store fills and evicts and the
garbage collector sees what it sees in production.

    .venv/bin/python bench/observers.py
    .venv/bin/python bench/observers.py --compare-src /tmp/reach-head/src   # an older tree too

``--wrk SECONDS`` measures what the in-process figures leave out (the memory a full store
scatters, the trace lines' writes, the loop turns): the Router's CPU per request, from
``/proc``, with tracing and metrics on and off (``bench/router_overhead.py``'s policies, INFO
trace lines in both), under wrk at c32, the Routers of each tree in turn for ``--rounds`` rounds.
CPU per request, unlike req/s, hardly moves when other work shares the machine::

    .venv/bin/python bench/observers.py --wrk 4 --rounds 5 --compare-src /tmp/reach-head/src
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


@contextlib.asynccontextmanager
async def router_and_record() -> AsyncIterator[tuple[Any, Any]]:
    """A Router (every default on, trace lines at INFO to /dev/null) with a fake agent, in this
    process, and the decision record of one real request through it: (the Router's parts, the
    record). The trace lines are written at INFO, as by a Router started from the command line;
    to /dev/null, so a figure is the Router's work, not the terminal's."""
    import httpx

    from reachmesh.config import RouterConfig
    from reachmesh.decision import DecisionRecord
    from reachmesh.observability import logging as reach_logging
    from reachmesh.testing import FakeAgent, RouterServer

    devnull = open(os.devnull, "w")  # noqa: SIM115, ASYNC230 - once, before any load
    reach_logging.configure("INFO", stream=devnull)
    config = RouterConfig.model_validate({"embedding": {"backend": "none"}, "health": {"enabled": False}})
    got: list[DecisionRecord] = []
    async with RouterServer(config) as router:
        agent = await FakeAgent("a1", input_schema={"n": "integer"}).start()
        try:
            await agent.register(router.url)
            parts = router.app.parts
            parts.dispatcher.observers.append(got.append)
            async with httpx.AsyncClient() as http:
                await http.post(router.url + "/reach", json={"targetTask": "echo", "payload": {"n": 1}})
            yield parts, got[-1]
        finally:
            await agent.stop()


async def measure(requests: int, rounds: int) -> dict[str, float]:
    from reachmesh.decision import Observer

    async with router_and_record() as (parts, record):
        observers: dict[str, Observer] = {
            "metrics": parts.metrics,
            "trace store": parts.traces,
            "trace lines": parts.trace_log,
            "route learning": parts.learner,
        }
        ids = [f"{i:032x}" for i in range(requests)]
        runs: dict[str, list[float]] = {name: [] for name in observers}
        for _ in range(rounds):
            for name, observer in observers.items():
                started = time.perf_counter()
                for trace_id in ids:
                    record.trace_id = trace_id
                    observer(record)
                per = (time.perf_counter() - started) / requests * 1e6
                runs[name].append(per)
        return {name: statistics.median(values) for name, values in runs.items()}


# The Routers compared: every default on, and with tracing (the store) and/or metrics off.
MODES = {
    "on": "",
    "off": "tracing:\n  enabled: false\nmetrics:\n  enabled: false\n",
    "no-store": "tracing:\n  enabled: false\n",
    "no-metrics": "metrics:\n  enabled: false\n",
    "store-100": "tracing:\n  store_size: 100\n",
}


def cpu_per_request(seconds: float, rounds: int, compare_src: str | None, modes: list[str]) -> None:
    """Each tree's Router in each mode under its own wrk at c32, all at once: CPU µs per request.

    All at once, on one core: whatever else runs on the machine slows them alike (measured one
    after another, a Router's CPU per request moved by +-20 % between runs a minute apart, more
    than tracing and metrics cost), so their ratios hold even where their levels do not."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import router_overhead

    bench = router_overhead.Bench(router_overhead.parse_args(["--memory-requests", "0"]))
    trees = [("this tree", None)] + ([(compare_src[-20:], compare_src)] if compare_src else [])
    figures: dict[str, list[float]] = {}
    try:
        _agent, agent_url = bench.start_agent()
        routers = []
        for label, src in trees:
            for mode in modes:
                name = f"{label} {mode}"
                slug = "".join(c if c.isalnum() else "_" for c in name)
                routers.append((name, *bench.start_router(agent_url, name=slug, policy=MODES[mode], src=src)))
                figures[name] = []
        _together(bench, routers, 4.0)  # warm-up: the stores fill (10,000 hops), connections open
        for _ in range(rounds):
            for name, per in _together(bench, routers, seconds).items():
                figures[name].append(per)
    finally:
        bench.stop_all()
    _report(figures, trees, rounds, seconds)


def _together(bench: Any, routers: list[tuple[str, Any, str]], seconds: float) -> dict[str, float]:
    """One wrk per Router, all running at once; each Router's CPU µs per request."""
    before = {name: server.cpu_seconds() for name, server, _ in routers}
    with ThreadPoolExecutor(len(routers)) as pool:
        runs = {name: pool.submit(bench.wrk, url, 32, 1, seconds) for name, _, url in routers}
        done = {name: run.result() for name, run in runs.items()}
    return {
        name: (server.cpu_seconds() - before[name]) / done[name].requests * 1e6 for name, server, _ in routers
    }


def _report(
    figures: dict[str, list[float]], trees: list[tuple[str, str | None]], rounds: int, seconds: float
) -> None:
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Router CPU per request under wrk c32, all at once, µs "
        f"({rounds} rounds of {seconds:g} s; load {load})"
    )
    for name, values in figures.items():
        shown = " ".join(f"{v:.0f}" for v in values)
        print(f"{name.ljust(34)} median {statistics.median(values):6.1f}  [{shown}]")
    for label, _ in trees:
        if f"{label} on" not in figures or f"{label} off" not in figures:
            continue
        on, off = figures[f"{label} on"], figures[f"{label} off"]
        deltas = [a - b for a, b in zip(on, off, strict=True)]
        ratios = [b / a for a, b in zip(on, off, strict=True)]
        print(
            f"{label}: on - off {statistics.median(deltas):+.1f} µs per request "
            f"(rounds {min(deltas):+.0f} to {max(deltas):+.0f}); off/on CPU "
            f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f} to {max(ratios):.3f})"
        )


def _alternating(compare_src: str, requests: int, rounds: int) -> dict[str, dict[str, float]]:
    """Both trees, one round each in turn (so a change in the machine's load falls on both);
    each observer's median over the rounds."""
    own_src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    runs: dict[str, list[dict[str, float]]] = {compare_src: [], "this tree": []}
    for _ in range(rounds):
        for name, src in ((compare_src, compare_src), ("this tree", own_src)):
            child = [sys.executable, __file__, "--json", "--requests", str(requests), "--rounds", "1"]
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    return {
        name: {part: statistics.median(run[part] for run in values) for part in values[0]}
        for name, values in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=50_000, help="records fed to each observer per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported")
    parser.add_argument("--compare-src", help="a src/ folder of another version, measured the same way")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode
    parser.add_argument(
        "--wrk", type=float, metavar="SECONDS", help="CPU per request of whole Routers instead"
    )
    parser.add_argument("--modes", default="on,off", help=f"with --wrk: which Routers, of {', '.join(MODES)}")
    args = parser.parse_args()
    if args.wrk:
        cpu_per_request(args.wrk, args.rounds, args.compare_src, args.modes.split(","))
        return
    if args.json or not args.compare_src:
        figures = asyncio.run(measure(args.requests, args.rounds))
        if args.json:
            print(json.dumps(figures))
            return
        columns = {"this tree": figures}
    else:
        columns = _alternating(args.compare_src, args.requests, args.rounds)
        figures = columns["this tree"]
    print(
        f"observer cost per request, µs (median of {args.rounds} rounds of {args.requests:,} records, GC on)"
    )
    print("observer".ljust(14) + "".join(name[-24:].rjust(26) for name in columns))
    for name in figures:
        print(name.ljust(14) + "".join(f"{col.get(name, float('nan')):26.2f}" for col in columns.values()))
    totals = [sum(col.values()) for col in columns.values()]
    print("total".ljust(14) + "".join(f"{t:26.2f}" for t in totals))


if __name__ == "__main__":
    main()
