"""Capacity: how many requests each agent has in flight, and a queue at the full ones.

An agent that declares ``max_concurrency`` (PROTOCOL §15) never has more than that in flight from
this Router. A request that finds it full waits here, within its deadline; at most
``limits.max_queued_per_agent`` wait per agent, and past that the agent is skipped (reason
``at_capacity``). The line is first come first served within each client, and the clients with
someone waiting take turns: one client's twenty waiting calls do not put another's twenty-first
(a single client sees exactly first come first served). Agents without a declared capacity are
counted too, for the load-aware choice and the gauges, but never wait here: the transport's pool
bounds their connections.

Waiting is the Router's own business: the breaker and the success rate never hear of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Iterator

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import LimitsPolicy

# Room is judged against this many slots when an agent declares no capacity: share = n / this.
UNDECLARED_SHARE_BASE = 1024

# The longest Retry-After an OVERLOADED estimate says (unless limits.retry_after_seconds is longer).
MAX_ESTIMATED_RETRY_AFTER_S = 60


def retry_after_estimate(queued: int, capacity: int | None, service_ms: float | None, policy_s: int) -> int:
    """Whole seconds until a caller turned away from a full agent would have been served had it
    waited: the agent's recent service time for each round of ``capacity`` requests ahead of it
    (the ``queued`` ones and itself), ``ceil(service_s * (queued + 1) / capacity)``, within
    [1, max(``policy_s``, :data:`MAX_ESTIMATED_RETRY_AFTER_S`)]. ``policy_s``
    (limits.retry_after_seconds) when the agent's service time is not known yet."""
    if service_ms is None or not capacity:
        return policy_s
    seconds = math.ceil(service_ms / 1000 * (queued + 1) / capacity)
    return min(max(seconds, 1), max(policy_s, MAX_ESTIMATED_RETRY_AFTER_S))


class _Slots:
    """One agent's slots: in flight, its declared capacity, and its waiters.

    Each client's waiters are a FIFO of their own (``lines``); ``turns`` holds the clients with
    a line, in the order they are served: the one at the front is handed the next slot and goes
    to the back if it has more waiting. A client is in ``turns`` exactly while it has a line.
    """

    __slots__ = ("capacity", "inflight", "lines", "queued", "turns")

    def __init__(self) -> None:
        self.inflight = 0
        self.capacity: int | None = None
        self.queued = 0
        self.lines: dict[str, deque[asyncio.Future[None]]] = {}
        self.turns: deque[str] = deque()

    def join(self, client: str, waiter: asyncio.Future[None]) -> None:
        """``waiter`` at the back of its client's line (a new client's turn comes last)."""
        line = self.lines.get(client)
        if line is None:
            line = self.lines[client] = deque()
            self.turns.append(client)
        line.append(waiter)

    def next_waiter(self) -> asyncio.Future[None] | None:
        """The first live waiter of the client whose turn it is, out of the line; None when
        nobody waits. O(1) but for dead waiters skipped (leave() takes them out as they go)."""
        lines, turns = self.lines, self.turns
        while turns:
            client = turns.popleft()
            line = lines[client]
            while line:
                waiter = line.popleft()
                if not waiter.done():
                    if line:
                        turns.append(client)
                    else:
                        del lines[client]
                    return waiter
            del lines[client]
        return None

    def leave(self, client: str, waiter: asyncio.Future[None]) -> None:
        """A waiter that gave up, out of its line at once. A search of its client's line, and of
        the turns when that line empties: bounded by the queue bound, and only on giving up."""
        line = self.lines.get(client)
        if line is None:
            return
        with contextlib.suppress(ValueError):  # next_waiter() may have taken it out already
            line.remove(waiter)
        if not line:
            del self.lines[client]
            self.turns.remove(client)


class CapacityBoard:
    """Per-agent slots. ``take`` waits for one (or raises); ``give`` hands it to the next waiter."""

    def __init__(self, *, max_queued: int = 1024, clock: Clock = SYSTEM_CLOCK) -> None:
        self.max_queued = max_queued
        self.clock = clock
        self._agents: dict[str, _Slots] = {}
        self._holds: set[asyncio.Future[None]] = set()

    def apply(self, limits: LimitsPolicy) -> None:
        """Take a reloaded bound on each agent's queue (limits.max_queued_per_agent); callers
        already waiting keep their places."""
        self.max_queued = limits.max_queued_per_agent

    def _slots(self, agent_id: str, capacity: int | None) -> _Slots:
        slots = self._agents.get(agent_id)
        if slots is None:
            slots = self._agents[agent_id] = _Slots()
        if slots.capacity != capacity:
            # A re-registration changed it. A raised (or dropped) one has room for waiters now:
            # they are woken at once, not one per request that ends. A lowered one is kept as
            # slots come back (see give()).
            slots.capacity = capacity
            self._hand_out(slots)
        return slots

    @staticmethod
    def _hand_out(slots: _Slots) -> None:
        """New slots to the next waiters in turn, while the capacity has room for them."""
        while slots.capacity is None or slots.inflight < slots.capacity:
            waiter = slots.next_waiter()
            if waiter is None:
                return
            waiter.set_result(None)
            slots.inflight += 1

    # -- reading -----------------------------------------------------------------------------

    def inflight(self, agent_id: str) -> int:
        slots = self._agents.get(agent_id)
        return 0 if slots is None else slots.inflight

    def queued(self, agent_id: str) -> int:
        slots = self._agents.get(agent_id)
        return 0 if slots is None else slots.queued

    def has_room(self, agent_id: str, capacity: int | None) -> bool:
        return capacity is None or self.inflight(agent_id) < capacity

    def share(self, agent_id: str, capacity: int | None) -> float:
        """In flight relative to capacity: 0 idle, 1 full (an undeclared one is never full)."""
        return self.inflight(agent_id) / (capacity or UNDECLARED_SHARE_BASE)

    def queue_full(self, agent_id: str, capacity: int | None) -> bool:
        """Full, and as many waiting as may: a request would be turned away at once."""
        if capacity is None:
            return False
        slots = self._agents.get(agent_id)
        return slots is not None and slots.inflight >= capacity and slots.queued >= self.max_queued

    def readings(self) -> Iterator[tuple[str, int, int]]:
        """(agent, in flight, queued) for each agent with a request in flight or waiting."""
        for agent_id, slots in list(self._agents.items()):
            yield agent_id, slots.inflight, slots.queued

    # -- taking and giving -------------------------------------------------------------------

    def take_now(self, agent_id: str, capacity: int | None) -> bool:
        """Take a slot at ``agent_id`` if one is free and nobody waits for it; else False, and
        :meth:`take` waits in line. Every attempt passes here first: no coroutine for it."""
        slots = self._slots(agent_id, capacity)
        if capacity is None or (slots.inflight < capacity and not slots.queued):
            slots.inflight += 1
            return True
        return False

    async def take(self, agent_id: str, capacity: int | None, due: float, client: str = "-") -> float:
        """Take a slot at ``agent_id``, waiting until the monotonic ``due`` at most: first come
        first served among ``client``'s waiters, in turn with the other clients waiting there.

        Returns the seconds waited. Raises ``TimeoutError`` at ``due``, and ``LookupError`` at
        once when the agent's queue is full; either way no slot is held.
        """
        slots = self._slots(agent_id, capacity)
        if capacity is None or (slots.inflight < capacity and not slots.queued):
            slots.inflight += 1
            return 0.0
        if slots.queued >= self.max_queued:
            raise LookupError(agent_id)
        started = self.clock.monotonic()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slots.join(client, waiter)
        slots.queued += 1
        granted = False
        try:
            async with asyncio.timeout(max(due - started, 0.0)):
                await waiter
            granted = True
        finally:
            slots.queued -= 1
            waited = self.clock.monotonic() - started
            if not granted:
                if waiter.done() and not waiter.cancelled():
                    # Handed the slot just as we left (timeout or cancellation): pass it on, or
                    # the next waiter would never be woken.
                    self.give(agent_id)
                else:
                    waiter.cancel()
                    # Out of the line at once: left for give() to skip, the dead waiters of every
                    # request that gave up piled up for as long as the agent's slots stayed
                    # taken (a stream holds one up to the deadline), without bound.
                    slots.leave(client, waiter)
        return waited

    def hold(self, agent_id: str, capacity: int | None, seconds: float) -> None:
        """Keep one slot at ``agent_id`` taken for ``seconds``, then give it back: the agent said
        it was busy with requests this Router does not count (another Router's), so this Router
        sends it one fewer until its Retry-After has passed."""
        self._slots(agent_id, capacity).inflight += 1
        # On the board's clock, as the busy wait that asks for it (dispatch/busy.py) is: a
        # timer of the loop's would keep the slot for real seconds under a test's clock. Rare
        # (a busy answer), so a task per hold; kept here, as the loop keeps only a weak one.
        hold = asyncio.ensure_future(self._give_after(agent_id, seconds))
        self._holds.add(hold)
        hold.add_done_callback(self._holds.discard)

    async def _give_after(self, agent_id: str, seconds: float) -> None:
        await self.clock.sleep(max(seconds, 0.0))
        self.give(agent_id)

    def give(self, agent_id: str) -> None:
        """The end of a request at ``agent_id``: its slot goes to the next waiter in turn, if any."""
        slots = self._agents.get(agent_id)
        if slots is None:
            return
        # Over a capacity a re-registration lowered: the slot is not handed on, so in flight
        # falls to the new capacity before a waiter is let in.
        if slots.turns and (slots.capacity is None or slots.inflight <= slots.capacity):
            waiter = slots.next_waiter()
            if waiter is not None:
                waiter.set_result(None)  # the slot changes hands: in flight stays the same
                return
        slots.inflight = max(slots.inflight - 1, 0)
        if slots.inflight == 0 and not slots.queued:
            del self._agents[agent_id]  # idle agents cost nothing; a gone one is not kept

    def retry_after_s(self, agent_id: str, service_ms: float | None, policy_s: int) -> int:
        """:func:`retry_after_estimate` for ``agent_id`` as it stands now."""
        slots = self._agents.get(agent_id)
        if slots is None:
            return policy_s
        return retry_after_estimate(slots.queued, slots.capacity, service_ms, policy_s)

    def waiting(self, agent_id: str) -> int:
        """Waiters held in ``agent_id``'s line (the ones that gave up are not kept)."""
        slots = self._agents.get(agent_id)
        return 0 if slots is None else sum(len(line) for line in slots.lines.values())

    def capacity_of(self, agent_id: str) -> int | None:
        slots = self._agents.get(agent_id)
        return None if slots is None else slots.capacity
