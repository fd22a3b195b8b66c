"""What each observer of the decision record costs per request, in process, with the GC on.

The Router's c32 throughput moves by several percent from run to run on a shared 2-core machine,
more than tracing and metrics cost, so this measures them directly: one real request through a
Router with a fake agent gives a real decision record, then each observer (metrics, the trace
store, the trace-line writer's per-request part) is fed that record ``--requests`` times with a
fresh traceId each time, in the Router's own process, so the store fills and evicts and the
garbage collector sees what it sees in production.

    .venv/bin/python bench/observers.py
    .venv/bin/python bench/observers.py --compare-src /tmp/reach-head/src   # an older tree too
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


async def measure(requests: int, rounds: int) -> dict[str, float]:
    import httpx

    from reachmesh.config import RouterConfig
    from reachmesh.decision import DecisionRecord, Observer
    from reachmesh.testing import FakeAgent, RouterServer

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
            record = got[-1]
            observers: dict[str, Observer] = {
                "metrics": parts.metrics,
                "trace store": parts.traces,
                "trace lines": parts.trace_log,
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
        finally:
            await agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=50_000, help="records fed to each observer per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported")
    parser.add_argument("--compare-src", help="a src/ folder of another version, measured the same way")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    figures = asyncio.run(measure(args.requests, args.rounds))
    if args.json:
        print(json.dumps(figures))
        return
    columns = {"this tree": figures}
    if args.compare_src:
        env = {**os.environ, "PYTHONPATH": args.compare_src}
        child = [
            sys.executable,
            __file__,
            "--json",
            "--requests",
            str(args.requests),
            "--rounds",
            str(args.rounds),
        ]
        out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
        columns = {args.compare_src: json.loads(out.strip().splitlines()[-1]), **columns}
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
