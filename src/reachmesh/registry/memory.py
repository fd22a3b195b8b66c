"""The in-memory registry: the embedded default, one process, zero set-up."""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Collection

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import (
    AgentIdConflict,
    AgentNotFound,
    LeaseMismatch,
    LeaseNotFound,
    RegistryFull,
)
from reachmesh.lifecycle import Background
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.base import (
    AgentEntry,
    Claim,
    Registry,
    RegistryEvent,
    compile_capabilities,
    dead_holder,
    holds_lease,
    same_registrant,
)
from reachmesh.secrets import loggable

log = logging.getLogger("reachmesh.registry")

_EMPTY: dict[str, AgentEntry] = {}


def new_lease_id() -> str:
    """An opaque, unguessable lease id, printed as hex like the reference (``0x6e2d1a...``)."""
    return "0x" + secrets.token_hex(8)


class MemoryRegistry(Registry):
    """Leases on a :class:`Clock`, a task index, and a background sweep that expires leases."""

    def __init__(self, policy: RegistryPolicy | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__()
        self.policy = policy or RegistryPolicy()
        self._clock = clock
        self._entries: dict[str, AgentEntry] = {}
        self._by_task: dict[str, dict[str, AgentEntry]] = {}
        self._background = Background("reach-lease-sweep")

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._background:
            self._background.every(lambda: self.policy.sweep_interval_seconds, self._sweep_tick, "loop")

    def apply(self, policy: RegistryPolicy) -> None:
        self.policy = policy

    async def close(self) -> None:
        await self._background.close()

    async def _sweep_tick(self) -> None:
        self.sweep()

    def _now(self) -> float:
        return self._clock.time()

    # -- writes ------------------------------------------------------------------------------

    async def register(
        self,
        profile: AgentProfile,
        *,
        lease_id: str | None = None,
        instance_id: str | None = None,
        holder: str | None = None,
        managed: bool = False,
    ) -> tuple[AgentEntry, bool]:
        now = self._clock.monotonic()
        current = self._entries.get(profile.id)
        claim = self.check_replace(current, profile, lease_id, instance_id)
        caps, validators = compile_capabilities(profile)
        ttl = 0.0 if managed else self.policy.lease_ttl_seconds
        entry = AgentEntry(
            profile=profile,
            lease_id=current.lease_id if claim is Claim.IN_PLACE and current else new_lease_id(),
            ttl_seconds=ttl,
            last_heartbeat=now,
            last_heartbeat_wall=self._clock.time(),
            expires_at=math.inf if managed else now + ttl,
            capabilities=caps,
            validators=validators,
            instance_id=instance_id,
            holder=holder,
            managed=managed,
        )
        self._install(entry, claim is not Claim.NEW)
        return entry, claim is not Claim.IN_PLACE

    def check_replace(
        self, current: AgentEntry | None, profile: AgentProfile, lease_id: str | None, instance_id: str | None
    ) -> Claim:
        """What a registration does to a ``current`` entry (see :class:`Claim`); raises
        ``AgentIdConflict`` when a live holder keeps the id, ``RegistryFull`` at the cap."""
        if current is None or current.status is AgentStatusValue.OFFLINE:
            # An offline entry only waits out its grace period: it gives its place to a live agent.
            full = len(self._entries) >= self.policy.max_agents
            if current is None and full and self.evict_offline() is None:
                raise RegistryFull(
                    f"the registry holds {len(self._entries)} agents, the most registry.max_agents allows"
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
        local = self._entries.get(current.id)
        if local is not None and local.lease_digest == current.lease_digest:
            return local
        return current

    def _install(self, entry: AgentEntry, replacing: bool) -> None:
        """Put ``entry`` in the snapshot and the task index, in place of any entry with its id."""
        current = self._entries.get(entry.id)
        if current is not None:
            self._unindex(current)
        self._entries[entry.id] = entry
        for task in entry.capabilities:
            self._by_task.setdefault(task, {})[entry.id] = entry
        self._emit(RegistryEvent.REPLACED if replacing else RegistryEvent.REGISTERED, entry)

    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        entry = self._entries.get(agent_id)
        if entry is None or entry.status is AgentStatusValue.OFFLINE:
            raise LeaseNotFound(f"no live lease for agent {agent_id!r}; register again")
        if not holds_lease(entry, lease_id):
            raise LeaseMismatch(f"leaseId does not match the lease agent {agent_id!r} holds")
        now = self._clock.monotonic()
        entry.last_heartbeat = now
        entry.last_heartbeat_wall = self._clock.time()
        if not entry.managed:
            entry.expires_at = now + entry.ttl_seconds
        if entry.lease_status is AgentStatusValue.SUSPECT:
            entry.lease_status = AgentStatusValue.AVAILABLE
            self._changed(entry)
        return entry

    def set_health(self, agent_id: str, health: AgentStatusValue) -> None:
        entry = self._entries.get(agent_id)
        if entry is None or entry.health_status is health:
            return
        entry.health_status = health
        self._changed(entry)

    def _changed(self, entry: AgentEntry) -> None:
        if entry.refresh_status():
            self._emit(RegistryEvent(entry.status.value), entry)

    async def deregister(self, agent_id: str, lease_id: str) -> None:
        entry = self._entries.get(agent_id)
        if entry is None:
            raise AgentNotFound(f"no agent {agent_id!r} is registered")
        if not holds_lease(entry, lease_id):
            raise LeaseMismatch(f"leaseId does not match the lease agent {agent_id!r} holds")
        self._remove(entry)
        self._emit(RegistryEvent.DEREGISTERED, entry)

    # -- reads -------------------------------------------------------------------------------

    def get(self, agent_id: str) -> AgentEntry | None:
        return self._entries.get(agent_id)

    def agents(self) -> list[AgentEntry]:
        return list(self._entries.values())

    def by_task(self, task: str) -> Collection[AgentEntry]:
        return self._by_task.get(task, _EMPTY).values()

    def tasks(self) -> Collection[str]:
        """Every task some entry declares."""
        return self._by_task.keys()

    # -- expiry ------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Advance every lease to what the clock says: suspect, offline, or dropped."""
        now = self._clock.monotonic()
        suspect_after = self.policy.suspect_after
        for entry in list(self._entries.values()):
            if entry.managed:
                continue  # no lease: only health checks and deregistration change it
            if entry.status is AgentStatusValue.OFFLINE:
                self._drop_if_gone(entry, now)
            elif now >= entry.expires_at:
                self._go_offline(entry)
            elif (
                entry.lease_status is AgentStatusValue.AVAILABLE
                and now - entry.last_heartbeat >= suspect_after
            ):
                entry.lease_status = AgentStatusValue.SUSPECT
                self._changed(entry)

    def _drop_if_gone(self, entry: AgentEntry, now: float) -> None:
        """Drop an offline entry whose grace period (``offline_grace_seconds``) is over."""
        if entry.offline_since is not None and now - entry.offline_since >= self.policy.offline_grace_seconds:
            self._remove(entry)
            self._emit(RegistryEvent.REMOVED, entry)

    def evict_offline(self, holder: str | None = None, *, keep: str | None = None) -> AgentEntry | None:
        """Drop the entry that went offline first (of agent token ``holder``, when given; never
        ``keep``) before its grace period is over, to make room; None when there is none."""
        offline = [
            e
            for e in self._entries.values()
            if e.status is AgentStatusValue.OFFLINE
            and e.id != keep
            and (holder is None or e.holder == holder)
        ]
        if not offline:
            return None
        oldest = min(offline, key=lambda e: e.offline_since or 0.0)
        self._remove(oldest)
        self._emit(RegistryEvent.REMOVED, oldest)
        return oldest

    def _go_offline(self, entry: AgentEntry) -> None:
        entry.lease_status = AgentStatusValue.OFFLINE
        entry.offline_since = self._clock.monotonic()
        self._changed(entry)

    def _remove(self, entry: AgentEntry) -> None:
        if self._entries.get(entry.id) is entry:
            del self._entries[entry.id]
        self._unindex(entry)

    def _unindex(self, entry: AgentEntry) -> None:
        for task in entry.capabilities:
            holders = self._by_task.get(task)
            if holders is not None and holders.get(entry.id) is entry:
                del holders[entry.id]
                if not holders:
                    del self._by_task[task]
