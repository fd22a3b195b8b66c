"""p50 at c1 and the Router's CPU per request at c1, for two or more Router trees, interleaved.

The machine is shared, so one tree measured after the other would see different neighbours:
here every round runs each tree once (in an order that alternates between rounds), all of them
against one agent, and the figures are the median and range over the rounds. wrk -c1 (one
keep-alive connection, one request at a time), the Routers on --server-core, the agent and wrk
on the other core, as ``router_overhead.py`` places them.

    git archive main src | tar -x -C /tmp/before
    .venv/bin/python bench/c1_ab.py before=/tmp/before/src after=src --rounds 8 --duration 4
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
from pathlib import Path

import router_overhead
from router_overhead import Bench


def spread(values: list[float], unit: str, digits: int) -> str:
    return (
        f"{statistics.median(values):.{digits}f} {unit} "
        f"(range {min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+", help="name=path/to/src, one per Router")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measured run")
    parser.add_argument("--rounds", type=int, default=6, help="rounds; medians are reported")
    parser.add_argument("--connections", type=int, default=1, help="wrk connections (default 1)")
    parser.add_argument(
        "--quiet-share",
        type=float,
        default=0.15,
        help="also report the runs during which others took at most this share of a core",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, router_overhead._terminated)  # stop the servers on the way out
    bench = Bench(router_overhead.parse_args(["--duration", str(args.duration)]))
    p50: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    quiet: dict[str, list[tuple[float, float]]] = {}  # (p50, CPU) of the runs others left alone
    direct: list[float] = []
    try:
        _agent, agent_url = bench.start_agent()
        routers = []
        for tree in args.trees:
            name, _, path = tree.partition("=")
            server, url = bench.start_router(agent_url, name, src=str(Path(path).resolve()))
            routers.append((name, server, url))
        for round_no in range(args.rounds):
            bench.wrk(agent_url, 1, 1, 0.3)
            direct.append(bench.wrk(agent_url, 1, 1, 1.0).p50_ms)
            order = routers if round_no % 2 == 0 else list(reversed(routers))
            for name, server, url in order:
                bench.wrk(url, args.connections, 1, 0.5)
                result, spent = bench.bracketed(url, args.connections, 1)
                p50.setdefault(name, []).append(result.p50_ms)
                cpu.setdefault(name, []).append(spent[server.name] / result.requests * 1e6)
                if spent["foreign_core"] <= args.quiet_share:
                    quiet.setdefault(name, []).append((result.p50_ms, cpu[name][-1]))
                print(
                    f"[c{args.connections}] round {round_no + 1} {name}: p50 {result.p50_ms:.3f} ms, "
                    f"{result.rps:.0f} req/s, "
                    f"{cpu[name][-1]:.0f} us CPU/request, others {spent['foreign_core']:.0%} of a core",
                    file=sys.stderr,
                )
        runs = f"c{args.connections}, {args.rounds} rounds of {args.duration:g} s"
        print(f"\n{runs}; direct p50 {spread(direct, 'ms', 3)}")
        for name, _server, _url in routers:
            print(f"{name:<10} p50 {spread(p50[name], 'ms', 3)}   CPU/request {spread(cpu[name], 'us', 0)}")
        first = routers[0][0]
        for name, _server, _url in routers[1:]:
            # The same round's runs are seconds apart: their difference cancels most of the load
            # that drifts between rounds.
            deltas = [(mine - theirs) * 1000 for mine, theirs in zip(p50[name], p50[first], strict=True)]
            print(f"{name} - {first}, p50 in the same round: {spread(deltas, 'us', 0)}")
        print(f"only the runs during which others took at most {args.quiet_share:.0%} of a core:")
        for name, _server, _url in routers:
            kept = quiet.get(name, [])
            if not kept:
                print(f"{name:<10} none")
                continue
            p50s, cpus = [p for p, _ in kept], [c for _, c in kept]
            print(
                f"{name:<10} {len(kept)} runs: p50 {spread(p50s, 'ms', 3)}   "
                f"CPU/request {spread(cpus, 'us', 0)}"
            )
        return 0
    finally:
        bench.stop_all()
        # The Routers' INFO logs run to tens of MB a run.
        shutil.rmtree(bench.workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
