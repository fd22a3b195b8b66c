"""What the observers cost per request when a turn of the event loop ends with one record, or many.

Under load the Router's ``ObserveAfterTurn`` hands the observers every record finished in one
turn of the loop (about 16 at c32 under wrk); at one connection each turn has one. This feeds one
real decision record (a request through a Router and a fake agent, in this process) to the
Router's own observers through an ``ObserveAfterTurn``, in turns of ``--turn`` records, with a
fresh traceId each, and reports the CPU per record, median of ``--rounds``:

* ``metrics+store``: what tracing and metrics switched on add (router_overhead.py's router
  against router-bare),
* ``trace lines``: what both Routers spend on the text trace lines,
* ``metrics`` and ``store`` alone.

::

    .venv/bin/python bench/observer_turns.py
    .venv/bin/python bench/observer_turns.py --compare-src /tmp/old/src   # another tree, alternated

The machine's load moves every figure; ``--compare-src`` runs each tree in turn, round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


async def measure(turns: list[int], records: int, rounds: int) -> dict[str, float]:
    from observers import router_and_record
    from reachmesh.decision import ObserveAfterTurn, Observer

    async with router_and_record() as (parts, record):
        pass  # measured with the Router stopped: only the observers run
    sets: dict[str, list[Observer]] = {
        "metrics+store": [parts.metrics, parts.traces],
        "trace lines": [parts.trace_log],
        "metrics": [parts.metrics],
        "store": [parts.traces],
    }
    out: dict[str, float] = {}
    for name, observers in sets.items():
        for turn in turns:
            out[f"{name}, turns of {turn}"] = _per_record(
                ObserveAfterTurn(observers, _failed), record, turn, records, rounds
            )
    return out


def _failed(observer: Any) -> None:
    raise RuntimeError(f"observer {observer!r} failed")


def _per_record(observe: Any, record: Any, turn: int, records: int, rounds: int) -> float:
    """µs of CPU per record, median of ``rounds``; the store fills (10,000 hops) in the first."""
    ids = [f"{i:032x}" for i in range(records)]
    runs = []
    for _ in range(rounds + 1):
        started = time.process_time()
        for start in range(0, records, turn):
            for trace_id in ids[start : start + turn]:
                record.trace_id = trace_id
                observe._pending.append(record)
            observe.run()
        runs.append((time.process_time() - started) / records * 1e6)
    return statistics.median(runs[1:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turn", default="1,16", help="records per turn, comma-separated")
    parser.add_argument("--records", type=int, default=20_000, help="records per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare-src", help="a src/ folder of another version, alternated with this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    turns = [int(n) for n in args.turn.split(",")]
    if args.json or not args.compare_src:
        figures = asyncio.run(measure(turns, args.records, args.rounds))
        if args.json:
            print(json.dumps(figures))
            return
        columns = {"this tree": figures}
    else:
        columns = _alternating(args, turns)
    names = list(columns)
    print(f"observer CPU per record, µs (median of {args.rounds} rounds of {args.records:,} records)")
    print("".ljust(30) + "".join(name[-16:].rjust(18) for name in names))
    for part in columns[names[0]]:
        print(part.ljust(30) + "".join(f"{columns[name][part]:18.2f}" for name in names))


def _alternating(args: argparse.Namespace, turns: list[int]) -> dict[str, dict[str, float]]:
    own_src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    runs: dict[str, list[dict[str, float]]] = {args.compare_src: [], "this tree": []}
    for _ in range(args.rounds):
        for name, src in ((args.compare_src, args.compare_src), ("this tree", own_src)):
            child = [sys.executable, __file__, "--json", "--rounds", "1", "--records", str(args.records)]
            child += ["--turn", ",".join(map(str, turns))]
            out = subprocess.run(
                child, env={**os.environ, "PYTHONPATH": src}, check=True, capture_output=True, text=True
            ).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    return {
        name: {part: statistics.median(run[part] for run in values) for part in values[0]}
        for name, values in runs.items()
    }


if __name__ == "__main__":
    main()
