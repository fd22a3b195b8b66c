"""CPU per byte of an agent's event stream, by the shape of its lines (probe 48).

The event-stream reader's cost is per line, not per byte, so what a hostile agent sends decides
how much of the Router's CPU one stream takes: comments and blank lines, read line by line, cost
10 to 20 times the CPU of kilobyte chunks. Bytes in, no sockets: each shape fed in 64 KiB reads
to a fresh parser for ``--seconds``, the best of ``--rounds``, and beside the rate the CPU one
stream of the shape costs before the default ``streaming.max_bytes`` ends it (each line counts
64 bytes more than it has against it; the tree before counted bytes only); ``--compare-src``
reads the same
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


# streaming.max_bytes by default: what one stream may count against its bound.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def rate(sse: ModuleType, unit: bytes, seconds: float, rounds: int) -> tuple[float, float]:
    """MB/s of CPU time reading ``unit`` over and over, the best of ``rounds``; and the CPU
    seconds one stream of this shape costs before it reaches the default ``streaming.max_bytes``
    (what the parser counts against it: its bytes, and each line's charge where it has one)."""
    read = unit * (65536 // len(unit))
    best = 0.0
    counted = 1.0
    for _ in range(rounds):
        parser = sse.RawSseParser(sse.SseLimits(1 << 20, 1 << 30, 1 << 40))
        fed, began = 0, time.process_time()
        while time.process_time() - began < seconds:
            parser.feed(read)
            fed += len(read)
        best = max(best, fed / (time.process_time() - began) / 1e6)
        counted = parser.total / fed
    return best, DEFAULT_MAX_BYTES / counted / (best * 1e6)


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
    print(
        f"{'shape':28}"
        + "".join(f"{name:>14}" for name in trees)
        + "   (MB/s of CPU; then CPU seconds of one stream to its default bound)"
    )
    for shape, unit in SHAPES.items():
        rates = [rate(sse, unit, args.seconds, args.rounds) for sse in trees.values()]
        print(
            f"{shape:28}"
            + "".join(f"{r[0]:14.1f}" for r in rates)
            + "".join(f"{r[1]:12.1f} s" for r in rates)
        )


if __name__ == "__main__":
    main()
