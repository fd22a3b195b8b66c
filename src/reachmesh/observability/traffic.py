"""Requests by final status over the last minutes, for the admin page's chart.

The Router already counts every request by status (``reach_requests_total``); this keeps a short
ring of samples of those running totals, taken off the request path every few seconds, so a page
opened now can draw the minutes before it was opened. Memory is fixed: one small dict per sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from reachmesh.clock import Clock, iso_utc

# Five minutes in two-second steps: fine enough to see a burst, small enough to send each poll.
STEP_SECONDS = 2.0
SPAN_SECONDS = 300.0


def totals_by_status(series: Mapping[tuple[str, ...], float], position: int = 2) -> dict[str, float]:
    """Running totals per status, summed over the other labels of a counter's series."""
    found: dict[str, float] = {}
    for labels, value in list(series.items()):
        status = labels[position]
        found[status] = found.get(status, 0.0) + value
    return found


class TrafficHistory:
    """Samples of running totals by status; :meth:`view` turns them into counts per interval."""

    def __init__(
        self,
        totals: Callable[[], Mapping[str, float]],
        clock: Clock,
        *,
        step_seconds: float = STEP_SECONDS,
        span_seconds: float = SPAN_SECONDS,
    ) -> None:
        self.step_seconds = step_seconds
        self.span_seconds = span_seconds
        self._totals = totals
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, float]]] = deque(
            maxlen=int(span_seconds / step_seconds) + 1
        )

    def sample(self) -> None:
        """Take one sample of the running totals, stamped with the wall clock."""
        self._samples.append((self._clock.time(), dict(self._totals())))

    async def tick(self) -> None:
        self.sample()

    def view(self) -> dict[str, Any]:
        """``{"stepSeconds", "spanSeconds", "points": [{"at", "seconds", "byStatus"}]}``, oldest first.

        Each point counts the requests that ended between the sample before it and its ``at``;
        statuses with none are left out. A last point runs up to now once it spans half a step,
        so a page sees recent traffic before the next sample without a spike from a tiny interval.
        """
        samples: list[tuple[float, dict[str, float]]] = list(self._samples)
        now = self._clock.time()
        if not samples or now - samples[-1][0] >= self.step_seconds / 2:
            samples.append((now, dict(self._totals())))
        points = []
        for (t0, before), (t1, after) in pairwise(samples):
            seconds = t1 - t0
            if seconds <= 0:
                continue
            counts = {s: n - before.get(s, 0.0) for s, n in after.items() if n > before.get(s, 0.0)}
            points.append({"at": iso_utc(t1), "seconds": round(seconds, 3), "byStatus": counts})
        return {"stepSeconds": self.step_seconds, "spanSeconds": self.span_seconds, "points": points}


__all__ = ["SPAN_SECONDS", "STEP_SECONDS", "TrafficHistory", "totals_by_status"]
