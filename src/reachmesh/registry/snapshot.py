"""The registry as the Router reads it: one in-memory view that every backend keeps.

A backend decides (a lease ran out, etcd sent a change, an agent registered); the snapshot
records the outcome and tells the listeners, synchronously and in order. It does no I/O and
reads no clock, so the Router can read it on every request, and both backends keep it the same
way whether the change was made here or arrived from a shared store.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Collection
from typing import TypeVar

from reachmesh.exceptions import AgentIdConflict, RegistryFull
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.redaction import loggable
from reachmesh.registry.entry import (
    AgentEntry,
    Claim,
    FailureListener,
    LearnedListener,
    LearnedRoute,
    Listener,
    RegistryEvent,
    dead_holder,
    holds_lease,
    same_registrant,
)

_K = TypeVar("_K", str, tuple[str, str, str])

log = logging.getLogger("reachmesh.registry")

EMPTY: dict[str, AgentEntry] = {}


class Snapshot:
    """Entries by id, the task index, the learned routes and negatives, and their listeners."""

    def __init__(self) -> None:
        self.entries: dict[str, AgentEntry] = {}  # never rebound either
        # Task -> the entries declaring it, by id. Never rebound, only changed in place: the
        # registry reads it directly on the hot path.
        self.index: dict[str, dict[str, AgentEntry]] = {}
        # Learned routes by LearnedRoute.key (the phrase, and its owner), in the order they were
        # (re)confirmed.
        self.learned: dict[str, LearnedRoute] = {}
        # Learned negatives by (normalized phrase, task, agent): that agent declined that phrase.
        self.negatives: dict[tuple[str, str, str], LearnedRoute] = {}
        self._listeners: list[Listener] = []
        self._failure_listeners: list[FailureListener] = []
        self._learned_listeners: list[LearnedListener] = []

    # -- reads -------------------------------------------------------------------------------

    def get(self, agent_id: str) -> AgentEntry | None:
        return self.entries.get(agent_id)

    def agents(self) -> list[AgentEntry]:
        return list(self.entries.values())

    def by_task(self, task: str) -> Collection[AgentEntry]:
        return self.index.get(task, EMPTY).values()

    def tasks(self) -> Collection[str]:
        return self.index.keys()

    # -- listeners ---------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: RegistryEvent, entry: AgentEntry) -> None:
        for listener in self._listeners:
            listener(event, entry)

    def subscribe_failures(self, listener: FailureListener) -> None:
        self._failure_listeners.append(listener)

    def emit_failure(self, agent_id: str, reason: str, router: str) -> None:
        for listener in self._failure_listeners:
            listener(agent_id, reason, router)

    def subscribe_learned(self, listener: LearnedListener) -> None:
        self._learned_listeners.append(listener)

    # -- entries -----------------------------------------------------------------------------

    def install(self, entry: AgentEntry, replacing: bool) -> None:
        """Put ``entry`` in the snapshot and the task index, in place of any entry with its id."""
        current = self.entries.get(entry.id)
        if current is not None:
            self._unindex(current)
        self.entries[entry.id] = entry
        for task in entry.capabilities:
            self.index.setdefault(task, {})[entry.id] = entry
        self.emit(RegistryEvent.REPLACED if replacing else RegistryEvent.REGISTERED, entry)

    def remove(self, entry: AgentEntry, event: RegistryEvent | None = None) -> None:
        """Take ``entry`` out of the snapshot; tell the listeners ``event``, when given."""
        if self.entries.get(entry.id) is entry:
            del self.entries[entry.id]
        self._unindex(entry)
        if event is not None:
            self.emit(event, entry)

    def _unindex(self, entry: AgentEntry) -> None:
        for task in entry.capabilities:
            holders = self.index.get(task)
            if holders is not None and holders.get(entry.id) is entry:
                del holders[entry.id]
                if not holders:
                    del self.index[task]

    def changed(self, entry: AgentEntry) -> None:
        """Derive ``entry``'s status again after its lease or health state moved; tell on change."""
        if entry.refresh_status():
            self.emit(RegistryEvent(entry.status.value), entry)

    def go_offline(self, entry: AgentEntry, now: float) -> None:
        """``entry``'s lease is over at monotonic ``now``: it waits out its grace period offline."""
        entry.lease_status = AgentStatusValue.OFFLINE
        entry.offline_since = now
        self.changed(entry)

    def drop_if_gone(self, entry: AgentEntry, now: float, grace: float) -> None:
        """Drop an offline entry whose grace period (``grace`` seconds) is over at ``now``."""
        if entry.offline_since is not None and now - entry.offline_since >= grace:
            self.remove(entry, RegistryEvent.REMOVED)

    def evict_offline(self, holder: str | None = None, *, keep: str | None = None) -> AgentEntry | None:
        """Drop the entry that went offline first (of agent token ``holder``, when given; never
        ``keep``) before its grace period is over, to make room; None when there is none."""
        offline = [
            e
            for e in self.entries.values()
            if e.status is AgentStatusValue.OFFLINE
            and e.id != keep
            and (holder is None or e.holder == holder)
        ]
        if not offline:
            return None
        oldest = min(offline, key=lambda e: e.offline_since or 0.0)
        self.remove(oldest, RegistryEvent.REMOVED)
        return oldest

    # -- claims ------------------------------------------------------------------------------

    def claim(
        self,
        current: AgentEntry | None,
        profile: AgentProfile,
        lease_id: str | None,
        instance_id: str | None,
        *,
        max_agents: int,
    ) -> Claim:
        """What a registration does to a ``current`` entry (see :class:`Claim`); raises
        ``AgentIdConflict`` when a live holder keeps the id, ``RegistryFull`` at ``max_agents``."""
        if current is None or current.status is AgentStatusValue.OFFLINE:
            # An offline entry only waits out its grace period: it gives its place to a live agent.
            full = len(self.entries) >= max_agents
            if current is None and full and self.evict_offline() is None:
                raise RegistryFull(
                    f"the registry holds {len(self.entries)} agents, the most registry.max_agents allows"
                )
            return Claim.NEW
        if (lease_id is not None and holds_lease(current, lease_id)) or same_registrant(
            current, profile, instance_id
        ):
            return Claim.IN_PLACE
        why = dead_holder(self._probed(current), profile)
        if why is None:
            raise AgentIdConflict(
                f"agent id {profile.id!r} is held by a live lease at another endpoint; register with "
                "its leaseId to replace the profile, or wait for the lease to expire"
            )
        holder_at = loggable(current.endpoint)
        log.info("[registry] %s taken over from its holder at %s: %s", profile.id, holder_at, why)
        return Claim.TAKEOVER

    def _probed(self, current: AgentEntry) -> AgentEntry:
        """``current`` as this Router's health probes know it: a shared store's record carries no
        health, the snapshot's entry for the same lease does."""
        local = self.entries.get(current.id)
        if local is not None and local.lease_digest == current.lease_digest:
            return local
        return current

    # -- learned routes and negatives --------------------------------------------------------

    def keep(self, route: LearnedRoute) -> str:
        """Learn ``route`` (it is the newest confirmation of its phrase, for its owner); its key."""
        key = route.key
        self.learned.pop(key, None)  # re-confirmed: it is the newest again
        self.learned[key] = route
        for listener in self._learned_listeners:
            listener(key, route)
        return key

    def drop_learned(self, key: str) -> bool:
        if self.learned.pop(key, None) is None:
            return False
        for listener in self._learned_listeners:
            listener(key, None)
        return True

    def excess(self, limit: int, by: str | None = None, quota: int | None = None) -> list[str]:
        """The keys beyond ``limit``, oldest confirmation first; with ``by``, also the oldest of
        that token's beyond its ``quota`` (one token never pushes out another's)."""
        return _excess(self.learned, limit, by, quota)

    def keep_negative(self, route: LearnedRoute) -> tuple[str, str, str]:
        key = route.negative_key
        self.negatives.pop(key, None)
        self.negatives[key] = route
        return key

    def drop_negative(self, key: tuple[str, str, str]) -> bool:
        return self.negatives.pop(key, None) is not None

    def excess_negatives(
        self, limit: int, by: str | None = None, quota: int | None = None
    ) -> list[tuple[str, str, str]]:
        """The negatives beyond ``limit`` (and ``by``'s beyond its ``quota``), oldest first."""
        return _excess(self.negatives, limit, by, quota)


def _excess(table: dict[_K, LearnedRoute], limit: int, by: str | None, quota: int | None) -> list[_K]:
    """The keys to drop so ``table`` keeps ``limit`` entries and ``by`` at most ``quota`` of them:
    the token over its quota loses its own oldest first, so a flood from one token costs only it."""
    victims: list[_K] = []
    if by is not None and quota is not None:
        own = [(k, r) for k, r in table.items() if r.by == by]
        if len(own) > quota:
            victims = [k for k, _ in heapq.nsmallest(len(own) - quota, own, key=lambda kv: kv[1].at)]
    over = len(table) - len(victims) - limit
    if over <= 0:
        return victims
    gone = set(victims)
    rest = ((k, r) for k, r in table.items() if k not in gone)
    return victims + [k for k, _ in heapq.nsmallest(over, rest, key=lambda kv: kv[1].at)]
