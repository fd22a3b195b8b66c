"""The registry contract.

Writes (register, renew, deregister) are async: a remote backend needs a round trip. Reads are
synchronous and come from a local snapshot, because the Router reads on every request and must
not wait on I/O to choose an agent.
"""

from __future__ import annotations

import abc
import hashlib
import heapq
import hmac
import re
import unicodedata
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from reachmesh.clock import SYSTEM_CLOCK, iso_utc
from reachmesh.config import RegistryPolicy
from reachmesh.protocol import AgentProfile, AgentStatusValue, Capability
from reachmesh.schema import PayloadValidator
from reachmesh.secrets import fingerprint


class RegistryEvent(StrEnum):
    """What happened to an entry; listeners (metrics, logs, routing state) subscribe to these."""

    REGISTERED = "registered"
    REPLACED = "replaced"
    SUSPECT = "suspect"
    UNHEALTHY = "unhealthy"
    AVAILABLE = "available"
    OFFLINE = "offline"
    DEREGISTERED = "deregistered"
    REMOVED = "removed"


@dataclass(slots=True, eq=False)
class AgentEntry:
    """One registered agent as the Router sees it."""

    profile: AgentProfile
    lease_id: str
    ttl_seconds: float
    last_heartbeat: float  # monotonic, to decide with
    last_heartbeat_wall: float  # epoch seconds, to show
    expires_at: float  # monotonic
    # Two sources of truth, one status: the lease (available, suspect, offline) and the health
    # checks (available, suspect, unhealthy). `status` is derived by refresh_status().
    status: AgentStatusValue = AgentStatusValue.AVAILABLE
    lease_status: AgentStatusValue = AgentStatusValue.AVAILABLE
    health_status: AgentStatusValue = AgentStatusValue.AVAILABLE
    offline_since: float | None = None
    capabilities: dict[str, Capability] = field(default_factory=dict)
    validators: dict[str, PayloadValidator | None] = field(default_factory=dict)
    # The registrant's instance token (``instanceId``): a retry from the same process gets its
    # lease back instead of a 409. It is a credential, so it stays out of repr() and of logs.
    instance_id: str | None = field(default=None, repr=False)
    # Who registered it: the agent token's fingerprint (``registry.max_agents_per_token``).
    holder: str | None = None
    # Shared backends keep no secrets in the store: the SHA-256 of the lease and of the instance
    # token stand in for them, so any Router can check a renewal it did not grant.
    lease_digest: str = field(default="", repr=False)
    instance_digest: str | None = field(default=None, repr=False)
    # The lease's fingerprint, the same on every Router (the lease itself may be unknown here).
    lease_tag: str = "-"
    # Where the entry came from in a shared store (0 for the in-memory registry).
    revision: int = 0
    backend_lease: int = 0
    # A managed entry has no lease to keep: an admin registered it on the agent's behalf (an
    # imported A2A agent), it never expires by time, and its liveness is the health checks'.
    managed: bool = False

    # Copies of the profile's id, endpoint and wire protocol as plain attributes: they are read
    # several times per candidate on every request, and a property through the profile costs.
    id: str = field(init=False)
    endpoint: str = field(init=False)
    protocol: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.profile.id
        self.endpoint = self.profile.network.endpoint
        if self.lease_id:
            self.lease_digest = self.lease_digest or digest(self.lease_id)
            self.lease_tag = fingerprint(self.lease_id)
        if self.instance_id is not None and self.instance_digest is None:
            self.instance_digest = digest(self.instance_id)
        self.protocol = self.profile.network.protocol

    @property
    def routable(self) -> bool:
        """Available or suspect: suspect agents are kept as a last resort."""
        return self.status is AgentStatusValue.AVAILABLE or self.status is AgentStatusValue.SUSPECT

    @property
    def last_heartbeat_iso(self) -> str:
        return iso_utc(self.last_heartbeat_wall)

    def refresh_status(self) -> bool:
        """Derive ``status`` from the lease and health states; True when it changed."""
        if self.lease_status is AgentStatusValue.OFFLINE:
            status = AgentStatusValue.OFFLINE
        elif self.health_status is AgentStatusValue.UNHEALTHY:
            status = AgentStatusValue.UNHEALTHY
        elif AgentStatusValue.SUSPECT in (self.lease_status, self.health_status):
            status = AgentStatusValue.SUSPECT
        else:
            status = AgentStatusValue.AVAILABLE
        changed = status is not self.status
        self.status = status
        return changed


@dataclass(slots=True, frozen=True)
class LearnedRoute:
    """A phrase confirmed for a task: by a caller's successful explicit retry, or by an operator."""

    phrase: str  # as it was confirmed; routes match it normalized (normalize_phrase)
    task: str
    source: str  # "caller" or "operator"
    at: float  # epoch seconds of the (latest) confirmation

    def to_json(self) -> dict[str, object]:
        return {"phrase": self.phrase, "task": self.task, "source": self.source, "at": self.at}


_SPACES = re.compile(r"\s+")


def normalize_phrase(text: str) -> str:
    """The form a learned phrase is matched in: NFKC (full-width and half-width alike), casefolded,
    runs of whitespace as one space, no space at either end. "Where is  MY parcel" and
    "where is my parcel" are one phrase; a paraphrase is not (the semantic index serves those)."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


Listener = Callable[[RegistryEvent, AgentEntry], None]
# (normalized phrase, the route, or None when it was forgotten or evicted).
LearnedListener = Callable[[str, "LearnedRoute | None"], None]
# (agent id, reason, reporting Router): another Router saw the agent fail (shared backends only).
FailureListener = Callable[[str, str, str], None]


def digest(secret: str) -> str:
    """The SHA-256 hex digest that stands in for a lease or an instance token in a shared store."""
    return hashlib.sha256(secret.encode()).hexdigest()


def holds_lease(entry: AgentEntry, lease_id: str) -> bool:
    """Whether ``lease_id`` is the entry's lease, compared in constant time."""
    return hmac.compare_digest(entry.lease_digest.encode(), digest(lease_id).encode())


def compile_capabilities(
    profile: AgentProfile,
) -> tuple[dict[str, Capability], dict[str, PayloadValidator | None]]:
    """Index a profile's capabilities by task and compile their input schemas once."""
    caps = {cap.task: cap for cap in profile.capabilities}
    validators = {
        cap.task: PayloadValidator(cap.input_schema) if cap.input_schema else None
        for cap in profile.capabilities
    }
    return caps, validators


def same_registrant(entry: AgentEntry, profile: AgentProfile, instance_id: str | None) -> bool:
    """Whether a registration comes from the process that holds ``entry``: same token and endpoint."""
    if instance_id is None or entry.instance_digest is None:
        return False
    # Constant time: the token is a credential, and a timing oracle would let it be guessed.
    same_token = hmac.compare_digest(entry.instance_digest.encode(), digest(instance_id).encode())
    return same_token and entry.endpoint == profile.network.endpoint


class Claim(StrEnum):
    """What a registration does to the id it names."""

    NEW = "new"  # no live holder: a new lease
    IN_PLACE = "in place"  # the holder itself (its lease, or its instance token): the lease stays
    TAKEOVER = "takeover"  # a holder known dead: a new lease, and the old one ends


def dead_holder(entry: AgentEntry, profile: AgentProfile) -> str | None:
    """Why the live ``entry`` may be taken over by ``profile``'s registrant, or None when not.

    The same endpoint means the same instance restarting (one process can listen there, and a
    restart gets a new instance token); a holder the Router's own health probes mark down (its
    last probe failed) is not serving. Two live instances at different endpoints are neither.
    """
    if entry.managed:
        return None  # an admin's entry: only an admin's registration with its lease replaces it
    if entry.endpoint == profile.network.endpoint:
        return "the same endpoint (a restart)"
    if entry.health_status is not AgentStatusValue.AVAILABLE:
        return f"its health checks failing ({entry.health_status.value})"
    return None


class Registry(abc.ABC):
    """The async contract every registry backend implements."""

    # True while a shared backend installs the entries it reads back from its store at start:
    # their events are news to this Router's state, not registrations happening now.
    replaying = False

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._failure_listeners: list[FailureListener] = []
        self._learned_listeners: list[LearnedListener] = []
        # Learned routes by normalized phrase, in the order they were (re)confirmed.
        self._learned: dict[str, LearnedRoute] = {}
        # Learned negatives by (normalized phrase, task): that capability declined that phrase.
        self._negatives: dict[tuple[str, str], LearnedRoute] = {}

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(event, entry)`` on every change, synchronously and in order."""
        self._listeners.append(listener)

    def _emit(self, event: RegistryEvent, entry: AgentEntry) -> None:
        for listener in self._listeners:
            listener(event, entry)

    def subscribe_failures(self, listener: FailureListener) -> None:
        """Call ``listener(agent_id, reason, router)`` when another Router reports a failing agent."""
        self._failure_listeners.append(listener)

    def _emit_failure(self, agent_id: str, reason: str, router: str) -> None:
        for listener in self._failure_listeners:
            listener(agent_id, reason, router)

    def report_failure(self, agent_id: str, reason: str) -> None:  # noqa: B027 - optional hook
        """Tell the other Routers that ``agent_id`` is failing here (a circuit opened, health
        checks failed). Returns at once; backends shared by one Router ignore it."""

    def vectors_for(self, model: str, agent_id: str) -> bytes | None:
        """Capability vectors another Router embedded for ``agent_id`` with ``model``, if shared."""
        return None

    def publish_vectors(self, model: str, agent_id: str, block: bytes) -> None:  # noqa: B027
        """Share the vectors this Router embedded for ``agent_id``; backends of one Router ignore it."""

    # -- learned routes -----------------------------------------------------------------------
    #
    # Kept in the registry, not in the Router, so that on a shared backend what one Router
    # learned routes on every other. Reads are a local snapshot like the agents; writes are async.

    def subscribe_learned(self, listener: LearnedListener) -> None:
        """Call ``listener(phrase_key, route_or_None)`` whenever a learned route arrives or goes."""
        self._learned_listeners.append(listener)

    def learned(self) -> Mapping[str, LearnedRoute]:
        """Every learned route, by normalized phrase (a snapshot read: no I/O)."""
        return self._learned

    async def remember(self, phrase: str, task: str, source: str, *, limit: int) -> LearnedRoute:
        """Learn ``phrase`` -> ``task`` (a newer confirmation replaces an older one), keeping at
        most ``limit`` phrases: the oldest confirmations are forgotten first."""
        route = LearnedRoute(phrase, task, source, self._now())
        self._keep(route)
        for key in self._excess(limit):
            self._drop_learned(key)
        return route

    async def forget(self, phrase: str) -> bool:
        """Forget a learned phrase (any spelling that normalizes alike); False when unknown."""
        return self._drop_learned(normalize_phrase(phrase))

    def _now(self) -> float:
        """Epoch seconds of a confirmation (backends with a clock use theirs)."""
        return SYSTEM_CLOCK.time()

    def _keep(self, route: LearnedRoute) -> str:
        key = normalize_phrase(route.phrase)
        self._learned.pop(key, None)  # re-confirmed: it is the newest again
        self._learned[key] = route
        for listener in self._learned_listeners:
            listener(key, route)
        return key

    def _drop_learned(self, key: str) -> bool:
        if self._learned.pop(key, None) is None:
            return False
        for listener in self._learned_listeners:
            listener(key, None)
        return True

    # -- learned negatives ---------------------------------------------------------------------
    #
    # A capability that declined a phrase is not offered it again by meaning. Kept beside the
    # learned routes, and shared the same way.

    def negatives(self) -> Mapping[tuple[str, str], LearnedRoute]:
        """Every learned negative, by (normalized phrase, task) (a snapshot read: no I/O)."""
        return self._negatives

    async def remember_negative(self, phrase: str, task: str, source: str, *, limit: int) -> LearnedRoute:
        """Learn that ``task`` declines ``phrase``, keeping at most ``limit`` negatives."""
        route = LearnedRoute(phrase, task, source, self._now())
        self._keep_negative(route)
        for key in self._excess_negatives(limit):
            self._negatives.pop(key, None)
        return route

    async def forget_negative(self, phrase: str, task: str) -> bool:
        """Forget that ``task`` declines ``phrase``; False when it was not known."""
        return self._negatives.pop((normalize_phrase(phrase), task), None) is not None

    def _keep_negative(self, route: LearnedRoute) -> tuple[str, str]:
        key = (normalize_phrase(route.phrase), route.task)
        self._negatives.pop(key, None)
        self._negatives[key] = route
        return key

    def _excess_negatives(self, limit: int) -> list[tuple[str, str]]:
        over = len(self._negatives) - limit
        if over <= 0:
            return []
        return [key for key, _ in heapq.nsmallest(over, self._negatives.items(), key=lambda kv: kv[1].at)]

    def _excess(self, limit: int) -> list[str]:
        """The phrase keys beyond ``limit``, oldest confirmation first."""
        over = len(self._learned) - limit
        if over <= 0:
            return []
        return [key for key, _ in heapq.nsmallest(over, self._learned.items(), key=lambda kv: kv[1].at)]

    def degraded(self) -> str | None:
        """``None`` while writes can be made durable, else why not: routing goes on from the
        local snapshot, registrations fail fast. For /readyz and the metric."""
        return None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (sweeps, watches)."""

    def apply(self, policy: RegistryPolicy) -> None:  # noqa: B027 - optional hook
        """Take a reloaded registry policy (lease TTL, sweep); backends without one ignore it."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work and release connections."""

    def ready(self) -> str | None:
        """``None`` when the backend can serve, else the reason it cannot (for /readyz)."""
        return None

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

    def evict_offline(self, holder: str | None = None, *, keep: str | None = None) -> AgentEntry | None:
        """Drop an offline entry (of agent token ``holder``, when given) before its grace period
        is over, to make room for a live one (never ``keep``, the id being registered); the one
        dropped, or None. A registry that keeps no offline entries has none to drop."""
        return None

    @abc.abstractmethod
    def get(self, agent_id: str) -> AgentEntry | None:
        """The entry for ``agent_id`` from the local snapshot."""

    @abc.abstractmethod
    def agents(self) -> list[AgentEntry]:
        """Every entry, offline ones included until their grace period ends."""

    @abc.abstractmethod
    def tasks(self) -> Collection[str]:
        """Every task some entry declares."""

    @abc.abstractmethod
    def by_task(self, task: str) -> Collection[AgentEntry]:
        """The entries that declare ``task``, from the task index (no scan)."""
