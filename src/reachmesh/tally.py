"""Who holds the most: clients bucketed by how many of something they hold (calls waiting at a full
agent, async results kept), updated as a client's count moves by one.

Fairness rules ask "which client holds the most" on every refusal past a bound; with many clients
(every address, with auth off) a walk of them all at each question cost the Router time in the
number of clients. Here a move costs O(1) and so does the question.
"""

from __future__ import annotations


class Tally:
    """The clients holding each count, and the largest count held."""

    __slots__ = ("holders", "most")

    def __init__(self) -> None:
        # Each count's clients, in the order they reached it (a dict as an ordered set).
        self.holders: dict[int, dict[str, None]] = {}
        self.most = 0

    def moved(self, client: str, before: int, after: int) -> None:
        """``client`` went from ``before`` to ``after`` (one more or one fewer; 0 is holding none)."""
        holders = self.holders
        if before:
            same = holders[before]
            del same[client]
            if not same:
                del holders[before]
                if self.most == before:
                    self.most = after  # a count moves by one: the next largest is this one
        if after:
            holders.setdefault(after, {})[client] = None
            if after > self.most:
                self.most = after

    def first_of_most(self) -> str:
        """The client that has held the most the longest (the Tally must hold someone)."""
        return next(iter(self.holders[self.most]))

    def last_of_most(self) -> str:
        """The client that reached the most last (the Tally must hold someone)."""
        return next(reversed(self.holders[self.most]))
