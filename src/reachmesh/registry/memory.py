"""The in-memory registry: the embedded default, one process, zero set-up."""

from __future__ import annotations

import math
import secrets

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import AgentNotFound, LeaseNotFound
from reachmesh.lifecycle import Background
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.base import Registry
from reachmesh.registry.entry import (
    AgentEntry,
    Claim,
    LearnedRoute,
    RegistryEvent,
    compile_capabilities,
    learned_key,
    normalize_phrase,
    require_lease,
)
from reachmesh.registry.snapshot import Snapshot


def new_lease_id() -> str:
    """An opaque, unguessable lease id, printed as hex like the reference (``0x6e2d1a...``)."""
    return "0x" + secrets.token_hex(8)


class MemoryRegistry(Registry):
    """The contract over a :class:`Snapshot`: leases on a :class:`Clock`, and a background
    sweep that expires them."""

    def __init__(
        self,
        policy: RegistryPolicy | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        snapshot: Snapshot | None = None,
    ) -> None:
        super().__init__(snapshot)
        self.policy = policy or RegistryPolicy()
        self._clock = clock
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
        current = self.snapshot.get(profile.id)
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
        self.snapshot.install(entry, claim is not Claim.NEW)
        return entry, claim is not Claim.IN_PLACE

    def check_replace(
        self, current: AgentEntry | None, profile: AgentProfile, lease_id: str | None, instance_id: str | None
    ) -> Claim:
        """What a registration does to a ``current`` entry (see :class:`Claim`); raises
        ``AgentIdConflict`` when a live holder keeps the id, ``RegistryFull`` at the cap."""
        return self.snapshot.claim(current, profile, lease_id, instance_id, max_agents=self.policy.max_agents)

    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        entry = self.snapshot.get(agent_id)
        if entry is None or entry.status is AgentStatusValue.OFFLINE:
            raise LeaseNotFound(f"no live lease for agent {agent_id!r}; register again")
        require_lease(entry, lease_id)
        now = self._clock.monotonic()
        entry.last_heartbeat = now
        entry.last_heartbeat_wall = self._clock.time()
        if not entry.managed:
            entry.expires_at = now + entry.ttl_seconds
        if entry.lease_status is AgentStatusValue.SUSPECT:
            entry.lease_status = AgentStatusValue.AVAILABLE
            self.snapshot.changed(entry)
        return entry

    def set_health(self, agent_id: str, health: AgentStatusValue) -> None:
        entry = self.snapshot.get(agent_id)
        if entry is None or entry.health_status is health:
            return
        entry.health_status = health
        self.snapshot.changed(entry)

    async def deregister(self, agent_id: str, lease_id: str) -> None:
        entry = self.snapshot.get(agent_id)
        if entry is None:
            raise AgentNotFound(f"no agent {agent_id!r} is registered")
        require_lease(entry, lease_id)
        self.snapshot.remove(entry, RegistryEvent.DEREGISTERED)

    # -- learned routes and negatives ------------------------------------------------------

    async def remember(self, route: LearnedRoute, *, limit: int, quota: int | None = None) -> LearnedRoute:
        self.snapshot.keep(route)
        for key in self.snapshot.excess(limit, route.by, quota):
            self.snapshot.drop_learned(key)
        return route

    async def forget(self, phrase: str, owner: str | None = None) -> bool:
        return self.snapshot.drop_learned(learned_key(phrase, owner))

    async def remember_negative(
        self, route: LearnedRoute, *, limit: int, quota: int | None = None
    ) -> LearnedRoute:
        self.snapshot.keep_negative(route)
        for key in self.snapshot.excess_negatives(limit, route.by, quota):
            self.snapshot.drop_negative(key)
        return route

    async def forget_negative(self, phrase: str, task: str, agent: str | None = None) -> bool:
        phrase_key = normalize_phrase(phrase)
        keys = [k for k in self.snapshot.negatives if k[:2] == (phrase_key, task) and agent in (None, k[2])]
        return sum(self.snapshot.drop_negative(k) for k in keys) > 0

    # -- expiry ------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Advance every lease to what the clock says: suspect, offline, or dropped."""
        now = self._clock.monotonic()
        suspect_after = self.policy.suspect_after
        for entry in list(self.snapshot.entries.values()):
            if entry.managed:
                continue  # no lease: only health checks and deregistration change it
            if entry.status is AgentStatusValue.OFFLINE:
                self.snapshot.drop_if_gone(entry, now, self.policy.offline_grace_seconds)
            elif now >= entry.expires_at:
                self.snapshot.go_offline(entry, now)
            elif (
                entry.lease_status is AgentStatusValue.AVAILABLE
                and now - entry.last_heartbeat >= suspect_after
            ):
                entry.lease_status = AgentStatusValue.SUSPECT
                self.snapshot.changed(entry)
