"""What one extra hop costs at c1 on this machine, for forwarders from bare to full-featured.

Issue #13 asks for the Router's added p50 at c1 to be at most 0.2 ms. This measures, in one run,
the p50 at c1 of the fast agent alone and through three forwarders: the 60-line asyncio +
httptools floor (``bench/raw_proxy.py``), the baseline proxy (``bench/passthrough_proxy.py``) and
the Router with every default on. Each forwarder runs twice: on its own core, as
``router_overhead.py`` places it, and on the core that the agent and wrk share, where
handing a request on needs no wake-up of an idle core. The difference between the two placements
is what the machine charges for waking a core; the raw proxy's added p50 is the least any Python
forwarder pays here.

    .venv/bin/python bench/latency_floor.py [--duration 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import router_overhead
from router_overhead import BENCH_DIR, REQUEST, Bench
from servers import Server, answers_success, free_port, pinned


def start_raw(bench: Bench, agent_url: str, core: int) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}/reach"
    argv = pinned(core, [sys.executable, str(BENCH_DIR / "raw_proxy.py"), str(port), agent_url])
    server = bench._start(Server(f"raw proxy core {core}", argv, bench.workdir / f"raw{core}.log"))
    server.wait_ready(lambda: answers_success(url, REQUEST))
    return url


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measured run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    args = parser.parse_args()
    bench = Bench(router_overhead.parse_args(["--duration", str(args.duration)]))
    try:
        _agent, agent_url = bench.start_agent()
        own, shared = bench.server_core, bench.agent_core
        assert own is not None and shared is not None
        urls = {"direct": {shared: agent_url}}
        for core in (own, shared):
            bench.server_core = core
            urls.setdefault("raw asyncio proxy", {})[core] = start_raw(bench, agent_url, core)
            urls.setdefault("baseline proxy", {})[core] = bench.start_proxy(agent_url)[1]
            urls.setdefault("Router", {})[core] = bench.start_router(agent_url, f"router-core{core}")[1]
        p50: dict[tuple[str, int], list[float]] = {}
        for round_no in range(args.rounds):
            for name, by_core in urls.items():
                for core, url in by_core.items():
                    print(f"[floor] round {round_no + 1}: {name}, core {core}", file=sys.stderr)
                    bench.wrk(url, 1, 1, 1.0)
                    result = bench.wrk(url, 1, 1, args.duration)
                    p50.setdefault((name, core), []).append(result.p50_ms)
        direct = statistics.median(p50[("direct", shared)])
        print(f"\np50 at c1, median of {args.rounds} rounds; the agent and wrk on core {shared}")
        print(f"{'path':<20}{'own core ' + str(own):>22}{'shared core ' + str(shared):>26}")
        print(f"{'direct':<20}{'':>22}{direct:>18.3f} ms")
        for name in ("raw asyncio proxy", "baseline proxy", "Router"):
            cells = []
            for core in (own, shared):
                value = statistics.median(p50[(name, core)])
                cells.append(f"{value:.3f} ms (+{value - direct:.3f})")
            print(f"{name:<20}{cells[0]:>22}{cells[1]:>26}")
        return 0
    finally:
        bench.stop_all()


if __name__ == "__main__":
    raise SystemExit(main())
