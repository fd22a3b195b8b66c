"""Background work owned by a component: started with it, cancelled and awaited with it.

Every long-lived loop of the Router (the lease sweep, health probes, the loop-lag monitor, the
embedding retries, the policy watch, async requests) runs in a :class:`Background`, so starting
and stopping one is two lines, and none is left running after ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("reachmesh.lifecycle")


async def unless_first(work: asyncio.Future[Any], stop: asyncio.Future[Any] | None) -> None:
    """Wait until ``work`` is done or ``stop`` (a caller going away) is, whichever comes first;
    then cancel ``stop``, and ``work`` too if it is not done, and wait for it to end. The caller
    reads ``work.cancelled()`` or ``work.result()`` after."""
    try:
        await asyncio.wait([f for f in (work, stop) if f is not None], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stop is not None:
            stop.cancel()
        if not work.done():
            # Cancelling the work (a request) closes what it holds, the agent's connection too.
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work


class Background:
    """A set of tasks that share one owner and end together."""

    __slots__ = ("_name", "_tasks")

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` until it ends or :meth:`close` cancels it."""
        task = asyncio.create_task(coro, name=f"{self._name}-{name}" if name else self._name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def every(
        self, interval_s: Callable[[], float], tick: Callable[[], Awaitable[None]], name: str
    ) -> asyncio.Task[Any]:
        """Await ``tick()`` every ``interval_s()`` seconds; a failing tick is logged, not fatal."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s())
                try:
                    await tick()
                except Exception:  # one bad tick must not stop the loop for good
                    log.exception("background loop %s-%s failed; it keeps running", self._name, name)

        return self.spawn(loop(), name)

    async def close(self) -> None:
        """Cancel every task and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
