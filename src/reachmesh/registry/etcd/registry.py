"""The etcd registry: the contract over a snapshot that a watch keeps in step with etcd."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import ConfigError, RegistryUnavailable
from reachmesh.lifecycle import Background
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.base import Registry
from reachmesh.registry.entry import AgentEntry, LearnedRoute
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcd.compaction import Compactor
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcd.keys import Keys, router_name
from reachmesh.registry.etcd.knowledge import SharedKnowledge
from reachmesh.registry.etcd.watch import Watcher
from reachmesh.registry.etcd.writes import Writer
from reachmesh.registry.etcdclient import EtcdClient, EtcdRejected
from reachmesh.registry.snapshot import Snapshot

log = logging.getLogger("reachmesh.registry")


class EtcdRegistry(Registry):
    """The registry contract over etcd, read from a watched local snapshot.

    Its parts: :class:`Watcher` (the snapshot and the watch), :class:`Writer` (registrations,
    renewals, deregistrations), :class:`SharedKnowledge` (learned routes, negatives, vectors,
    failure reports) and :class:`Health` (the ping, the degraded state, etcd's refusals).
    """

    backend = "etcd"

    def __init__(
        self,
        policy: RegistryPolicy | None = None,
        *,
        endpoints: Sequence[str],
        clock: Clock = SYSTEM_CLOCK,
        router: str | None = None,
        tls: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(Snapshot())
        policy = policy or RegistryPolicy()
        etcd = policy.etcd
        self.client = EtcdClient(
            endpoints,
            attempt_timeout=etcd.attempt_timeout_seconds,
            deadline=etcd.request_timeout_seconds,
            tls=tls,
            credentials=credentials,
        )
        self._background = Background("reach-lease-sweep")
        self._shared = Shared(
            policy,
            client=self.client,
            snapshot=self.snapshot,
            clock=clock,
            router=router or router_name(),
            background=self._background,
        )
        self.health = Health(self._shared, credentials[0] if credentials else None)
        self.knowledge = SharedKnowledge(self._shared, self.health)
        self.watcher = Watcher(self._shared, self.health, self.knowledge)
        self.writer = Writer(self._shared, self.health)
        self.compactor = Compactor(self._shared, self.health)

    # -- what the parts share, for operators and tests ---------------------------------------

    @property
    def policy(self) -> RegistryPolicy:
        return self._shared.policy

    @property
    def keys(self) -> Keys:
        return self._shared.keys

    @property
    def router(self) -> str:
        """This Router's name in what it writes (failure reports, learned routes)."""
        return self._shared.router

    @property
    def revision(self) -> int:
        """The last etcd revision applied to the snapshot."""
        return self._shared.revision

    @revision.setter
    def revision(self, value: int) -> None:
        self._shared.revision = value

    @property
    def replaying(self) -> bool:  # type: ignore[override]
        return self._shared.replaying

    @property
    def loaded(self) -> bool:
        """Whether a first full read of etcd has been applied."""
        return self.watcher.loaded

    @property
    def resyncs(self) -> int:
        """How many full reads of etcd have been applied (the first one included)."""
        return self.watcher.resyncs

    @property
    def _pings(self) -> int:
        return self.health.pings

    @property
    def _restart(self) -> asyncio.Event:
        return self._shared.restart

    def _warn_plain_login(self) -> None:
        self.health.warn_plain_login()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.health.warn_plain_login()
        await self.client.open()
        try:
            # Each member tried once for the first page (a refused connection fails at once, a
            # silent member costs one attempt): a Router whose etcd is down listens at once,
            # rather than after the whole deadline. A large registry is still read whole here.
            await self.watcher.resync(once=True)
            await self.health.may_write()
        except EtcdRejected as exc:
            # etcd answered, and said no (a wrong password, a role without the prefix): nothing
            # would work, so the Router stops with a line saying what to change.
            await self.client.close()
            raise ConfigError(self.health.refusal_hint(exc)) from exc
        except RegistryUnavailable as exc:
            # Serve anyway: /readyz says why not ready, /reach answers REGISTRY_UNAVAILABLE, and
            # the watch loop reads etcd once it answers.
            self._shared.last_error = exc.message
            self.health.out_of_reach_at_start(exc.message)
            log.warning(
                "[registry] etcd at %s: %s; serving, not ready until it answers",
                ", ".join(self.client.endpoints),
                exc.message,
            )
        if self.client.auth_off:
            log.warning(
                "[registry] registry.etcd.username is set but etcd has authentication off: "
                "whoever reaches etcd can change the registry"
            )
        if not self._background:
            self._background.every(lambda: self.policy.sweep_interval_seconds, self._sweep_tick, "loop")
        etcd = self.policy.etcd
        self._background.spawn(self.watcher.loop(), "watch")
        if etcd.compact_interval_seconds > 0:
            self._background.every(lambda: etcd.compact_interval_seconds, self.compactor.tick, "compact")
        else:
            log.warning(
                "[registry] registry.etcd.compact_interval_seconds is 0: unless etcd runs with "
                "--auto-compaction-retention, every re-registration stays in its history until "
                "its quota (--quota-backend-bytes) is full and it refuses all writes"
            )
        self._background.every(lambda: etcd.ping_interval_seconds, self.health.ping, "ping")

    def apply(self, policy: RegistryPolicy) -> None:
        # The endpoints and prefix are read at start: a shared store is not switched under load.
        self._shared.policy = policy.model_copy(update={"etcd": self.policy.etcd})

    async def close(self) -> None:
        await self._background.close()
        await self.client.close()

    def ready(self) -> str | None:
        if not self.watcher.loaded:
            # The ping's word first: it says for each member why (refused, silent, no leader).
            why = self.health.unreachable or self._shared.last_error
            return f"the registry is not loaded from etcd yet ({why})"
        # Not merely degraded: every Router sharing this etcd refuses every registration.
        return self.health.nospace

    def degraded(self) -> str | None:
        return self.health.degraded()

    async def _sweep_tick(self) -> None:
        self.sweep()

    def sweep(self) -> None:
        """Drop offline entries after their grace period; etcd itself expires the leases."""
        now = self._shared.clock.monotonic()
        grace = self.policy.offline_grace_seconds
        for entry in list(self.snapshot.entries.values()):
            if entry.status is AgentStatusValue.OFFLINE:
                self.snapshot.drop_if_gone(entry, now, grace)

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
        return await self.writer.register(
            profile, lease_id=lease_id, instance_id=instance_id, holder=holder, managed=managed
        )

    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        return await self.writer.renew(agent_id, lease_id)

    async def deregister(self, agent_id: str, lease_id: str) -> None:
        await self.writer.deregister(agent_id, lease_id)

    def set_health(self, agent_id: str, health: AgentStatusValue) -> None:
        entry = self.snapshot.get(agent_id)
        if entry is not None and entry.health_status is not health:
            entry.health_status = health
            self.snapshot.changed(entry)
        if health is AgentStatusValue.UNHEALTHY:
            self.report_failure(agent_id, "unhealthy")

    # -- shared knowledge --------------------------------------------------------------------

    def report_failure(self, agent_id: str, reason: str) -> None:
        self.knowledge.report_failure(agent_id, reason)

    def vectors_for(self, model: str, agent_id: str) -> bytes | None:
        return self.knowledge.vectors_for(model, agent_id)

    def publish_vectors(self, model: str, agent_id: str, block: bytes) -> None:
        self.knowledge.publish_vectors(model, agent_id, block)

    async def remember(self, route: LearnedRoute, *, limit: int, quota: int | None = None) -> LearnedRoute:
        return await self.knowledge.remember(route, limit=limit, quota=quota)

    async def forget(self, phrase: str, owner: str | None = None) -> bool:
        return await self.knowledge.forget(phrase, owner)

    async def remember_negative(
        self, route: LearnedRoute, *, limit: int, quota: int | None = None
    ) -> LearnedRoute:
        return await self.knowledge.remember_negative(route, limit=limit, quota=quota)

    async def forget_negative(self, phrase: str, task: str, agent: str | None = None) -> bool:
        return await self.knowledge.forget_negative(phrase, task, agent)
