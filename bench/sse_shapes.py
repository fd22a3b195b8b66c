"""CPU per byte of an agent's event stream, by the shape of its lines (probe 48).

The event-stream reader's cost is per line, not per byte, so what a hostile agent sends decides
how much of the Router's CPU one stream takes: comments and blank lines, read line by line, cost
10 to 20 times the CPU of kilobyte chunks. Bytes in, no sockets: each shape fed in 64 KiB reads
to a fresh parser for ``--seconds``, the best of ``--rounds``; ``--compare-src`` reads the same
shapes with another tree's parser (``git archive <commit> src | tar -x -C /tmp/old``).

Run::

    .venv/bin/python bench/sse_shapes.py [--seconds 0.5] [--rounds 3] [--compare-src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType

SHAPES = {
    "comments": b":\n",
    "blank lines": b"\n",
    "comments, CRLF": b":\r\n",
    "id lines": b"id: 1\n",
    "events with no data": b"event: a\n\n",
    "event lines in one event": b"event: a\n",
    "empty unnamed events": b"data:\n\n",
    "tiny chunks": b"event: chunk\ndata: 1\n\n",
    "token chunks": b'event: chunk\ndata: "some token text"\n\n',
    "kilobyte chunks": b'event: chunk\ndata: "' + b"x" * 1000 + b'"\n\n',
}


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rate(sse: ModuleType, unit: bytes, seconds: float, rounds: int) -> float:
    """MB/s of CPU time reading ``unit`` over and over, the best of ``rounds``."""
    read = unit * (65536 // len(unit))
    best = 0.0
    for _ in range(rounds):
        parser = sse.RawSseParser(sse.SseLimits(1 << 20, 1 << 30, 1 << 40))
        fed, began = 0, time.process_time()
        while time.process_time() - began < seconds:
            parser.feed(read)
            fed += len(read)
        best = max(best, fed / (time.process_time() - began) / 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare-src", default=None)
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "src" / "reachmesh" / "sse.py"
    trees = {"this tree": load(str(here), "sse_here")}
    if args.compare_src:
        trees["compared"] = load(f"{args.compare_src}/reachmesh/sse.py", "sse_compared")
    print(f"{'shape':28}" + "".join(f"{name:>14}" for name in trees) + "   (MB/s of CPU)")
    for shape, unit in SHAPES.items():
        rates = [rate(sse, unit, args.seconds, args.rounds) for sse in trees.values()]
        print(f"{shape:28}" + "".join(f"{r:14.1f}" for r in rates))


if __name__ == "__main__":
    main()
