"""Load-aware choice among equals (PROTOCOL §15): busy is not broken, but full is not first.

After a strategy has ranked its candidates:

- one with room goes before one that is full (stable: the strategy's order is kept within each
  group, and nothing changes while nobody is full, so weighted round robin keeps its shares);
- the first choice is then weighed against one other candidate the strategy treats alike (the
  same score and routing weight), drawn at random, and the one with fewer requests in flight
  relative to its capacity leads ("two random choices"). The strategy's own pick stays first
  whenever the two are equally loaded, so its rotation is what spreads an idle fleet.
"""

from __future__ import annotations

import random

from reachmesh.resilience.capacity import CapacityBoard
from reachmesh.routing.base import Choice

# Its own generator: the draw needs no strength, and must not touch the process-wide state.
_draw = random.Random()


def _alike(a: Choice, b: Choice) -> bool:
    return a.score == b.score and a.capability.routing_weight == b.capability.routing_weight


def load_aware(ranked: list[Choice], capacity: CapacityBoard, *, keep_first: bool = False) -> list[Choice]:
    """``ranked`` with full candidates last and the lighter of two equals first.

    ``keep_first``: the first choice stays (a conversation bound to its agent).
    """
    if len(ranked) < 2:
        return ranked

    def room(choice: Choice) -> bool:
        return capacity.has_room(choice.entry.id, choice.entry.profile.max_concurrency)

    fixed = 1 if keep_first else 0
    rest = ranked[fixed:]
    full = [c for c in rest if not room(c)]
    if full and len(full) < len(rest):
        rest = [c for c in rest if room(c)] + full
    if not keep_first and room(rest[0]):
        head = rest[0]
        equals = [i for i in range(1, len(rest)) if _alike(rest[i], head) and room(rest[i])]
        if equals:
            other = _draw.choice(equals)
            share = capacity.share
            if share(rest[other].entry.id, rest[other].entry.profile.max_concurrency) < share(
                head.entry.id, head.entry.profile.max_concurrency
            ):
                rest[0], rest[other] = rest[other], rest[0]
    return ranked[:fixed] + rest
