"""Writes held to the end of the event loop's pass, then made back to back.

On loopback, a ``write`` to a socket does the receiving side's TCP work in the writer's system
call, and wakes the reader: when the reader (the agent, the caller) sleeps on another core, that
wake-up is an interrupt to that core, about 10 us of the Router's own CPU per write on the 2-core
machine of ``bench/router_overhead.py`` (perf put 15 % of the Router's CPU there at c32). Under
load, the Router writes many requests to an agent and many answers to callers in one pass of its
loop; made one after another at the end of the pass, the first write wakes the reader and the
rest find it awake.

A write is held only while other exchanges with agents are in flight (:attr:`Outbox.inflight`):
then more writes are coming, and an answer or a request held for the rest of the pass costs no
one a wait they would notice. A lone request (a caller at c1) is written at once: holding it
would add the pass to its latency with nothing to batch it with.

Nothing is reordered: a writer holds its bytes itself and writes them before anything it writes
later, or closes; held bytes of a connection that closed meanwhile are dropped with it.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol


class Holder(Protocol):
    """A connection's writer that holds bytes until :meth:`write_held`."""

    def write_held(self) -> None:
        """Write what is held (if the connection is still open); never raises."""


class Outbox:
    """The writers with bytes held on one event loop, written at the end of its pass."""

    # No reference to the loop: the table below is keyed by it, weakly.
    __slots__ = ("_held", "inflight")

    def __init__(self) -> None:
        self._held: list[Holder] = []
        # Exchanges with agents under way on this loop (counted by the transport's pool): while
        # any is, more writes are on their way.
        self.inflight = 0

    def hold(self, writer: Holder, loop: asyncio.AbstractEventLoop) -> None:
        """Write ``writer``'s held bytes when ``loop``'s pass ends. A writer that holds more
        before then adds to what it holds: it is handed here once."""
        held = self._held
        if not held:
            # Run once the callbacks already due have run, after the loop's next poll for I/O
            # (which does not wait while callbacks are due).
            loop.call_soon(self.write_all)
        held.append(writer)

    def write_all(self) -> None:
        held, self._held = self._held, []
        for writer in held:
            writer.write_held()


_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = weakref.WeakKeyDictionary()


def outbox(loop: asyncio.AbstractEventLoop) -> Outbox:
    """The loop's outbox: one per loop, shared by every server connection and agent pool on it,
    so one pass's writes leave together whoever made them."""
    box = _outboxes.get(loop)
    if box is None:
        box = _outboxes[loop] = Outbox()
    return box
