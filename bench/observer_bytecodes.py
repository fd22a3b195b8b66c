"""Python bytecodes the metrics and the trace store run per record: an exact count, without the rest
of the Router.

``bench/bytecodes.py --observability on|off`` counts whole /reach calls, and its on - off
difference moves by tens of bytecodes from run to run (timers, health probes and loop turns fall
differently in the window). This feeds one real decision record (a request through a Router and a
fake agent, in this process, as ``bench/observers.py`` makes it) to the Router's own observers
through an ``ObserveAfterTurn`` and counts, with ``sys.settrace`` opcode events, the bytecodes of
one run, per record, by function::

    .venv/bin/python bench/observer_bytecodes.py
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/observer_bytecodes.py   # another tree

The store is counted as the Router's (10,000 hops, filling: a few hops held) and as a full one
(100 hops held, the oldest leaving for each new one: the steady state).
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def counted(run: Callable[[], None]) -> collections.Counter[str]:
    """Bytecodes ``run`` executes, by ``file:function``."""
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return counts


async def measure() -> None:
    from observers import router_and_record
    from reachmesh.decision import ObserveAfterTurn, Observer
    from reachmesh.observability.traces import TraceStore

    async with router_and_record() as (parts, record):
        pass  # counted with the Router stopped: only the observers run
    full = TraceStore(100)
    for _ in range(200):
        full(record)
    sets: dict[str, list[Observer]] = {
        "metrics + store (filling)": [parts.metrics, parts.traces],
        "metrics": [parts.metrics],
        "store (filling)": [parts.traces],
        "store (full)": [full],
    }
    for name, observers in sets.items():
        for turn in (1, 16):

            def run(observe: ObserveAfterTurn, turn: int = turn) -> None:
                observe._pending.extend([record] * turn)
                observe.run()

            observe, bare = ObserveAfterTurn(observers, _failed), ObserveAfterTurn([], _failed)
            run(observe)  # the first run plans; the cells and the series exist from here on
            run(bare)
            counts = counted(lambda o=observe: run(o))
            # What the observers add: the run's own loop over them counts, an empty run's does not.
            own = sum(counts.values()) - sum(counted(lambda b=bare: run(b)).values())
            ranked = [(fn, n) for fn, n in counts.most_common() if not fn.startswith("observer_bytecodes")]
            top = ", ".join(f"{fn} {n / turn:.0f}" for fn, n in ranked[:4])
            print(f"{name}, turns of {turn}: {own / turn:.1f} per record  ({top})")


def _failed(observer: Any) -> None:
    raise RuntimeError(f"observer {observer!r} failed")


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    asyncio.run(measure())
