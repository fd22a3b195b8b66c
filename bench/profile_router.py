"""Where the Router's CPU goes: py-spy on one Router (every default on) under wrk at c32.

Starts the bench's fast agent and one Router exactly as ``router_overhead.py`` does (same
policy, same pinning), loads it with wrk and records it with py-spy (``pip install py-spy``)::

    .venv/bin/python bench/profile_router.py --seconds 10 --out bench/flame-router.svg
    .venv/bin/python bench/profile_router.py --format speedscope --out /tmp/router.json

``--policy`` adds YAML to the Router's policy (e.g. the router-bare one); ``--gil`` samples only
while the GIL is held, which is the Router's own CPU rather than time spent waiting.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import router_overhead
from router_overhead import Bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of profiling under load")
    parser.add_argument("--out", type=Path, default=Path("bench/flame-router.svg"))
    parser.add_argument("--format", default="flamegraph", choices=["flamegraph", "speedscope", "raw"])
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--policy", default="", help="YAML added to the Router's policy")
    parser.add_argument("--gil", action="store_true", help="py-spy --gil: only samples holding the GIL")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    bench = Bench(router_overhead.parse_args(["--memory-requests", "0"]))
    try:
        _agent, agent_url = bench.start_agent()
        router, url = bench.start_router(agent_url, policy=args.policy)
        bench.wrk(url, 32, 1, 1.0)  # warm-up
        cmd = [
            spy,
            "record",
            "--pid",
            str(router.pid),
            "--duration",
            str(int(args.seconds)),
            "--rate",
            str(args.rate),
            "--format",
            args.format,
            "--output",
            str(args.out),
            "--nonblocking",
        ]
        if args.gil:
            cmd.append("--gil")
        if args.native:
            cmd.append("--native")
        load = threading.Thread(target=bench.wrk, args=(url, 32, 1, args.seconds + 2), daemon=True)
        load.start()
        subprocess.run(cmd, check=True)
        load.join()
    finally:
        bench.stop_all()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    print(f"profile written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
