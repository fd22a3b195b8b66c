"""Capacity: how many requests each agent has in flight, and a queue at the full ones.

An agent that declares ``max_concurrency`` (PROTOCOL §15) never has more than that in flight from
this Router. A request that finds it full waits here, within its deadline; at most
``limits.max_queued_per_agent`` wait per agent. The line is first come first served within each
client, and the clients with someone waiting take turns: one client's twenty waiting calls do not
put another's twenty-first (a single client sees exactly first come first served). When the line
is full, a call of a client that holds at least two fewer of it than the client holding the most
takes the place of that client's newest waiter, which is answered at once (:class:`Displaced`);
any other call finds the agent skipped (reason ``at_capacity``). So one client cannot stand the
whole line and leave every other client refused. Agents without a declared capacity are counted
too, for the load-aware choice and the gauges, but never wait here: the transport's pool bounds
their connections.

Waiting is the Router's own business: the breaker and the success rate never hear of it.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Iterator

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import LimitsPolicy
from reachmesh.tally import Tally

# Room is judged against this many slots when an agent declares no capacity: share = n / this.
UNDECLARED_SHARE_BASE = 1024

# A freed slot passes over a late waiter (too little of its deadline left: see take()) for the
# first one that is not, looking at most this many waiters past the one whose turn it is.
LOOKAHEAD = 64

# The longest Retry-After an OVERLOADED estimate says (unless limits.retry_after_seconds is longer).
MAX_ESTIMATED_RETRY_AFTER_S = 60


def retry_after_estimate(ahead: int, capacity: int | None, service_ms: float | None, policy_s: int) -> int:
    """Whole seconds until a caller turned away from a full agent would have been served had it
    waited: the agent's recent service time for each round of ``capacity`` requests it would
    be served with (the ``ahead`` ones and itself), ``ceil(service_s * (ahead + 1) / capacity)``,
    within [1, max(``policy_s``, :data:`MAX_ESTIMATED_RETRY_AFTER_S`)]. ``policy_s``
    (limits.retry_after_seconds) when the agent's service time is not known yet."""
    if service_ms is None or not capacity:
        return policy_s
    seconds = math.ceil(service_ms / 1000 * (ahead + 1) / capacity)
    return min(max(seconds, 1), max(policy_s, MAX_ESTIMATED_RETRY_AFTER_S))


class QueueFull(Exception):
    """A full agent's line with no place for this call: the board's own signal, so a KeyError or an
    IndexError of a bug in the board is never mistaken for it (and read as "queue full")."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(agent_id)
        self.agent_id = agent_id


class Displaced(QueueFull):
    """A waiter put out of a full agent's line for another client's call: its client held the
    most of that line. It held no slot and holds none: the caller is answered at once."""

    def __init__(self, agent_id: str, waited_s: float) -> None:
        super().__init__(agent_id)
        self.waited_s = waited_s


class _Slots:
    """One agent's slots: in flight, its declared capacity, and its waiters.

    Each client's waiters are a FIFO of their own (``lines``); ``turns`` holds the clients with
    a line, in the order they are served: the one at the front is handed the next slot and goes
    to the back if it has more waiting. A client is in ``turns`` exactly while it has a line.
    A waiter's future says how its wait ended: True, a slot; False, displaced.

    ``queued`` is the length of all lines together, and ``tally`` the clients by the length
    of their line (each length's clients in the order they came to it) and the longest: kept as
    each waiter joins or leaves a line, so the client to displace is found in O(1).
    """

    __slots__ = ("capacity", "inflight", "late", "lines", "queued", "tally", "turns")

    def __init__(self) -> None:
        self.inflight = 0
        self.capacity: int | None = None
        self.queued = 0
        self.lines: dict[str, deque[asyncio.Future[bool]]] = {}
        self.turns: deque[str] = deque()
        self.tally = Tally()
        # Waiters with a moment (monotonic) past which a slot is better given to one with more
        # of its deadline left; none while the agent's answer time is unknown.
        self.late: dict[asyncio.Future[bool], float] = {}

    def _resized(self, client: str, before: int) -> None:
        """``client``'s line went from ``before`` waiters to one more or one fewer."""
        line = self.lines.get(client)
        after = 0 if line is None else len(line)
        self.tally.moved(client, before, after)
        self.queued += after - before

    def join(self, client: str, waiter: asyncio.Future[bool]) -> None:
        """``waiter`` at the back of its client's line (a new client's turn comes last)."""
        line = self.lines.get(client)
        if line is None:
            line = self.lines[client] = deque()
            self.turns.append(client)
        line.append(waiter)
        self._resized(client, len(line) - 1)

    def next_waiter(self, now: float | None = None) -> asyncio.Future[bool] | None:
        """The first live waiter of the client whose turn it is, out of the line; None when
        nobody waits. O(1) but for dead waiters skipped (leave() takes them out as they go).

        Given ``now``, a waiter that is late by then (``late``) is passed over for the first one
        that is not (:meth:`_fresh_waiter`); when every waiter is late, the turns go as above."""
        if now is not None and self.late:
            fresh = self._fresh_waiter(now)
            if fresh is not None:
                return fresh
        lines, turns = self.lines, self.turns
        while turns:
            client = turns.popleft()
            line = lines[client]
            while line:
                waiter = line.popleft()
                if not line:
                    del lines[client]
                self._resized(client, len(line) + 1)
                if not waiter.done():
                    if line:
                        turns.append(client)
                    return waiter
        return None

    def _fresh_waiter(self, now: float) -> asyncio.Future[bool] | None:
        """When the waiter whose turn it is is late at ``now`` (too little of its deadline left
        for the agent's usual answer time), the first waiter that is not, in the order of the
        turns and within each line, out of its line; its client goes to the back of the turns
        if more of its calls wait. None when the waiter whose turn it is is not late, or when
        every waiter looked at is: the turns go on as ever. Looks at most :data:`LOOKAHEAD`
        waiters in all, so a long line of late ones costs a bounded search per slot."""
        late, looked = self.late, 0
        for position, client in enumerate(self.turns):
            line = self.lines[client]
            for index, waiter in enumerate(line):
                if waiter.done():
                    continue
                if late.get(waiter, math.inf) > now:
                    if position == 0 and looked == 0:
                        return None  # the waiter whose turn it is has the time: served as ever
                    del line[index]
                    if position:
                        del self.turns[position]
                    else:
                        self.turns.popleft()
                    if line:
                        self.turns.append(client)
                    else:
                        del self.lines[client]
                    self._resized(client, len(line) + 1)
                    return waiter
                looked += 1
                if looked >= LOOKAHEAD:
                    return None
        return None

    def leave(self, client: str, waiter: asyncio.Future[bool]) -> None:
        """A waiter that gave up, out of its line at once. A search of its client's line, and of
        the turns when that line empties: bounded by the queue bound, and only on giving up."""
        line = self.lines.get(client)
        if line is None:
            return
        try:
            line.remove(waiter)
        except ValueError:  # next_waiter() took it out already
            return
        if not line:
            del self.lines[client]
            self.turns.remove(client)
        self._resized(client, len(line) + 1)

    def may_displace(self, client: str) -> bool:
        """Whether a call of ``client`` at the full line takes a waiter's place: its client holds
        at least two fewer than the client holding the most. One fewer would only make it the one
        holding the most, and that client's next call would take the place back."""
        line = self.lines.get(client)
        return (0 if line is None else len(line)) + 2 <= self.tally.most

    def displace_for(self, client: str) -> bool:
        """Answer the newest live waiter of the client holding the most (of those holding as
        many, the one that came to it last), to make room for a call of ``client``. False when
        :meth:`may_displace` says no, or that line holds only waiters already gone."""
        if not self.may_displace(client):
            return False
        holder = self.tally.last_of_most()
        line = self.lines[holder]
        victim = next((waiter for waiter in reversed(line) if not waiter.done()), None)
        if victim is None:
            return False
        line.remove(victim)  # the newest, at the end: a search only past waiters already gone
        if not line:  # not while it held the most, two more than none: kept as every removal is
            del self.lines[holder]
            self.turns.remove(holder)
        self._resized(holder, len(line) + 1)
        victim.set_result(False)
        return True

    def place(self, client: str) -> int:
        """The place a new call of ``client`` would be served in, the turns as they stand: its
        own line and itself, and as many of each other client's (up to as many)."""
        line = self.lines.get(client)
        mine = 1 + (0 if line is None else len(line))
        others = sum(min(length, mine) * len(clients) for length, clients in self.tally.holders.items())
        return mine + others - (mine - 1)


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

    def _hand_out(self, slots: _Slots) -> None:
        """New slots to the next waiters in turn, while the capacity has room for them."""
        while slots.capacity is None or slots.inflight < slots.capacity:
            waiter = slots.next_waiter(self.clock.monotonic() if slots.late else None)
            if waiter is None:
                return
            waiter.set_result(True)
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

    def queue_full(self, agent_id: str, capacity: int | None, client: str = "-") -> bool:
        """Full, and as many waiting as may: a request of ``client`` would be turned away at
        once (it holds too many of the line to take another client's place in it)."""
        if capacity is None:
            return False
        slots = self._agents.get(agent_id)
        return (
            slots is not None
            and slots.inflight >= capacity
            and slots.queued >= self.max_queued
            and not slots.may_displace(client)
        )

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

    async def take(
        self, agent_id: str, capacity: int | None, due: float, client: str = "-", late_at: float | None = None
    ) -> float:
        """Take a slot at ``agent_id``, waiting until the monotonic ``due`` at most: first come
        first served among ``client``'s waiters, in turn with the other clients waiting there.
        From the monotonic ``late_at`` on (if given), the call is late: too little of its
        deadline is left to be likely answered, and a slot that comes free goes to a waiter that
        is not late, if one waits, before it (it is served in turn only when all are late).

        Returns the seconds waited. Raises ``TimeoutError`` at ``due``; :class:`QueueFull` at
        once when the agent's queue is full (and ``client`` may not take a place in it); and
        :class:`Displaced` (a QueueFull) when another client's call takes this one's place.
        Whichever way it ends without a slot, none is held.
        """
        slots = self._slots(agent_id, capacity)
        if capacity is None or (slots.inflight < capacity and not slots.queued):
            slots.inflight += 1
            return 0.0
        if slots.queued >= self.max_queued and not slots.displace_for(client):
            raise QueueFull(agent_id)
        started = self.clock.monotonic()
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        slots.join(client, waiter)
        if late_at is not None:
            slots.late[waiter] = late_at
        granted: bool | None = None
        try:
            async with asyncio.timeout(max(due - started, 0.0)):
                granted = await waiter
        finally:
            if late_at is not None:
                slots.late.pop(waiter, None)
            waited = self.clock.monotonic() - started
            if granted is None:  # a timeout or a cancellation
                self._gone(agent_id, slots, client, waiter)
        if not granted:
            raise Displaced(agent_id, waited)
        return waited

    def _gone(self, agent_id: str, slots: _Slots, client: str, waiter: asyncio.Future[bool]) -> None:
        """A waiter whose wait ended by a timeout or a cancellation, whatever it was told."""
        if not waiter.done() or waiter.cancelled():
            waiter.cancel()
            # Out of the line at once: left for give() to skip, the dead waiters of every request
            # that gave up piled up for as long as the agent's slots stayed taken (a stream holds
            # one up to the deadline), without bound.
            slots.leave(client, waiter)
        elif waiter.result():
            # Handed the slot just as it left: pass it on, or the next waiter would never be woken.
            self.give(agent_id)
        # Else displaced just as it left: out of the line and its count already, holding nothing.

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
            waiter = slots.next_waiter(self.clock.monotonic() if slots.late else None)
            if waiter is not None:
                waiter.set_result(True)  # the slot changes hands: in flight stays the same
                return
        slots.inflight = max(slots.inflight - 1, 0)
        if slots.inflight == 0 and not slots.queued:
            del self._agents[agent_id]  # idle agents cost nothing; a gone one is not kept

    def retry_after_s(self, agent_id: str, service_ms: float | None, policy_s: int, client: str = "-") -> int:
        """:func:`retry_after_estimate` for a call of ``client`` at ``agent_id`` as it stands now:
        the calls ahead of it are those of its place in the turns (:meth:`_Slots.place`), not
        the whole line."""
        slots = self._agents.get(agent_id)
        if slots is None:
            return policy_s
        return retry_after_estimate(slots.place(client) - 1, slots.capacity, service_ms, policy_s)

    def waiting(self, agent_id: str) -> int:
        """Waiters held in ``agent_id``'s line (the ones that gave up are not kept)."""
        slots = self._agents.get(agent_id)
        return 0 if slots is None else slots.queued  # kept as each waiter joins or leaves a line

    def capacity_of(self, agent_id: str) -> int | None:
        slots = self._agents.get(agent_id)
        return None if slots is None else slots.capacity
