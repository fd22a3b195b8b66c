"""Summarise a py-spy raw profile (``bench/profile_router.py --format raw``) as text.

    python bench/flame_summary.py PROFILE.txt [--top 60]

Prints each function's inclusive and self share of the samples, and the share of a few parts
of the hot path (the upstream client, the trace lines, metrics, ...). py-spy cannot follow a
coroutine back to the event loop once uvloop resumed it, so many stacks start at a coroutine:
the inclusive shares of the outer frames are lower bounds, the self shares are exact.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# Which part of the Router a stack belongs to: the first pattern found in it wins.
PARTS = (
    ("upstream client", ("aiohttp/", "transport/http.py", "transport/pool.py")),
    ("trace lines", ("observability/logging.py",)),
    ("metrics", ("observability/metrics.py", "prometheus_client/")),
    ("trace store", ("observability/traces.py",)),
    ("envelope decode", ("_decode (reachmesh/dispatch/dispatcher.py",)),
    ("uvicorn: writing the response", ("RequestResponseCycle.send",)),
    ("uvicorn: reading requests", ("GuardedHttpTools", "HttpToolsProtocol")),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=60)
    args = parser.parse_args(argv)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        names = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        for name in set(names):
            inclusive[name] += n
        own[names[-1]] += n
        part = next((p for p, marks in PARTS if any(m in stack for m in marks)), "everything else")
        parts[part] += n
    print(f"{total} samples")
    print("\n== parts")
    for name, n in parts.most_common():
        print(f"{100 * n / total:5.1f}% {name}")
    print("\n== self")
    for name, n in own.most_common(args.top):
        print(f"{100 * n / total:5.1f}% {name}")
    print("\n== inclusive")
    for name, n in inclusive.most_common(args.top):
        print(f"{100 * n / total:5.1f}% {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
