"""The registry contract.

Writes (register, renew, deregister, learning) are async: a remote backend needs a round trip.
Reads are synchronous and come from the backend's :class:`~reachmesh.registry.snapshot.Snapshot`,
because the Router reads on every request and must not wait on I/O to choose an agent. A backend
is this contract over a snapshot: it decides each write, and the snapshot records the outcome.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping

from reachmesh.config import RegistryPolicy
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.entry import (
    AgentEntry,
    Claim,
    FailureListener,
    LearnedListener,
    LearnedRoute,
    Listener,
    RegistryEvent,
    compile_capabilities,
    dead_holder,
    digest,
    holds_lease,
    learned_key,
    normalize_phrase,
    same_registrant,
)
from reachmesh.registry.snapshot import EMPTY, Snapshot

__all__ = [
    "AgentEntry",
    "Claim",
    "FailureListener",
    "LearnedListener",
    "LearnedRoute",
    "Listener",
    "Registry",
    "RegistryEvent",
    "Snapshot",
    "compile_capabilities",
    "dead_holder",
    "digest",
    "holds_lease",
    "learned_key",
    "normalize_phrase",
    "same_registrant",
]


class Registry(abc.ABC):
    """The async contract every registry backend implements, read from its :attr:`snapshot`."""

    # Which backend this is, for people reading the admin page and /admin/ui/state; nothing
    # routes on it.
    backend = "memory"

    # True while a shared backend installs the entries it reads back from its store at start:
    # their events are news to this Router's state, not registrations happening now.
    replaying = False

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.snapshot = snapshot if snapshot is not None else Snapshot()
        # The snapshot's own dicts, read here without a call through it: the Router reads them
        # several times per request.
        self._entries = self.snapshot.entries
        self._index = self.snapshot.index

    # -- reads: the snapshot, no I/O ----------------------------------------------------------

    def get(self, agent_id: str) -> AgentEntry | None:
        """The entry for ``agent_id`` from the local snapshot."""
        return self._entries.get(agent_id)

    def agents(self) -> list[AgentEntry]:
        """Every entry, offline ones included until their grace period ends."""
        return list(self._entries.values())

    def tasks(self) -> Collection[str]:
        """Every task some entry declares."""
        return self._index.keys()

    def by_task(self, task: str) -> Collection[AgentEntry]:
        """The entries that declare ``task``, from the task index (no scan)."""
        return self._index.get(task, EMPTY).values()

    def learned(self) -> Mapping[str, LearnedRoute]:
        """Every learned route, by normalized phrase (a snapshot read: no I/O)."""
        return self.snapshot.learned

    def negatives(self) -> Mapping[tuple[str, str, str], LearnedRoute]:
        """Every learned negative, by (normalized phrase, task, agent) (a snapshot read: no I/O)."""
        return self.snapshot.negatives

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(event, entry)`` on every change, synchronously and in order."""
        self.snapshot.subscribe(listener)

    def subscribe_failures(self, listener: FailureListener) -> None:
        """Call ``listener(agent_id, reason, router)`` when another Router reports a failing agent."""
        self.snapshot.subscribe_failures(listener)

    def subscribe_learned(self, listener: LearnedListener) -> None:
        """Call ``listener(phrase_key, route_or_None)`` whenever a learned route arrives or goes."""
        self.snapshot.subscribe_learned(listener)

    def evict_offline(self, holder: str | None = None, *, keep: str | None = None) -> AgentEntry | None:
        """Drop an offline entry (of agent token ``holder``, when given) before its grace period
        is over, to make room for a live one (never ``keep``, the id being registered); the one
        dropped, or None."""
        return self.snapshot.evict_offline(holder, keep=keep)

    # -- optional hooks -----------------------------------------------------------------------

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (sweeps, watches)."""

    def apply(self, policy: RegistryPolicy) -> None:  # noqa: B027 - optional hook
        """Take a reloaded registry policy (lease TTL, sweep); backends without one ignore it."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work and release connections."""

    @property
    def loaded(self) -> bool:
        """Whether the registry holds what its backend holds: False until a shared store has
        been read once (the Router knows no agent yet, and says so rather than route)."""
        return True

    def ready(self) -> str | None:
        """``None`` when the backend can serve, else the reason it cannot (for /readyz)."""
        return None

    def degraded(self) -> str | None:
        """``None`` while writes can be made durable, else why not: routing goes on from the
        local snapshot, registrations fail fast. For /readyz and the metric."""
        return None

    def report_failure(self, agent_id: str, reason: str) -> None:  # noqa: B027 - optional hook
        """Tell the other Routers that ``agent_id`` is failing here (a circuit opened, health
        checks failed). Returns at once; backends shared by one Router ignore it."""

    def vectors_for(self, model: str, agent_id: str) -> bytes | None:
        """Capability vectors another Router embedded for ``agent_id`` with ``model``, if shared."""
        return None

    def publish_vectors(self, model: str, agent_id: str, block: bytes) -> None:  # noqa: B027
        """Share the vectors this Router embedded for ``agent_id``; backends of one Router ignore it."""

    # -- writes --------------------------------------------------------------------------------

    @abc.abstractmethod
    async def register(
        self,
        profile: AgentProfile,
        *,
        lease_id: str | None = None,
        instance_id: str | None = None,
        holder: str | None = None,
        managed: bool = False,
    ) -> tuple[AgentEntry, bool]:
        """Register or replace ``profile``; returns the entry and whether it is new. The entry's
        ``lease_id`` is the lease to give the registrant.

        A live id is replaced in place (same lease) when ``lease_id`` is its lease, or when the
        registration is the same registrant's: the same ``instance_id`` and the same endpoint (a
        retry of a registration whose answer was lost). Otherwise raises ``AgentIdConflict``.

        ``managed``: the entry has no lease to renew (``ttl_seconds`` 0). It is never made
        suspect or offline by time, only by health checks, and stays until deregistered with
        its ``lease_id`` (which it still gets, as the credential to replace or remove it). The
        caller (the admin API) decides who may ask for it.
        """

    @abc.abstractmethod
    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        """Extend the lease. Raises ``LeaseNotFound`` (expired or unknown) or ``LeaseMismatch``."""

    @abc.abstractmethod
    async def deregister(self, agent_id: str, lease_id: str) -> None:
        """Remove the agent. Raises ``AgentNotFound`` or ``LeaseMismatch``."""

    @abc.abstractmethod
    def set_health(self, agent_id: str, health: AgentStatusValue) -> None:
        """Record what the health checks concluded (available, suspect or unhealthy)."""

    # Learned routes and negatives are kept in the registry, not in the Router, so that on a
    # shared backend what one Router learned routes on every other.

    @abc.abstractmethod
    async def remember(self, route: LearnedRoute, *, limit: int, quota: int | None = None) -> LearnedRoute:
        """Learn ``route`` (a newer confirmation replaces an older one of the same phrase and
        owner), keeping at most ``limit`` routes, and at most ``quota`` made by ``route.by``:
        the oldest confirmations are forgotten first, that token's own before anyone else's."""

    @abc.abstractmethod
    async def forget(self, phrase: str, owner: str | None = None) -> bool:
        """Forget a learned phrase (any spelling that normalizes alike) of ``owner`` (None: the
        route for every caller); False when unknown."""

    @abc.abstractmethod
    async def remember_negative(
        self, route: LearnedRoute, *, limit: int, quota: int | None = None
    ) -> LearnedRoute:
        """Learn that ``route.agent`` declines ``route.phrase`` for ``route.task``, keeping at
        most ``limit`` negatives and ``quota`` of them made by ``route.by``."""

    @abc.abstractmethod
    async def forget_negative(self, phrase: str, task: str, agent: str | None = None) -> bool:
        """Forget that ``task`` declines ``phrase``; False when it was not known."""
