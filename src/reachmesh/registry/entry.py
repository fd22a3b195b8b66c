"""What the registry holds: an agent's entry, a learned route, and the rules that compare them.

Plain data and pure functions, shared by the snapshot and both backends.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from reachmesh.clock import iso_utc
from reachmesh.exceptions import LeaseMismatch
from reachmesh.protocol import AgentProfile, AgentStatusValue, Capability
from reachmesh.redaction import fingerprint
from reachmesh.schema import PayloadValidator


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
    """A phrase confirmed for a task (by a caller's successful explicit retry, or by an operator),
    or, as a learned negative, a phrase one agent declined.

    Who it reaches is part of it (docs/security.md, the trust table): a caller's confirmation
    routes for that caller alone (``owner``) or waits for an operator (``pending``); a negative
    keeps the phrase off the one registration that declined it (``agent`` and ``lease``), until
    it ``expires``. ``by`` is the token whose request made it: quotas count per token.
    """

    phrase: str  # as it was confirmed; routes match it normalized (normalize_phrase)
    task: str
    source: str  # "caller", "operator" or "decline"
    at: float  # epoch seconds of the (latest) confirmation
    owner: str | None = None  # a learned route: the only caller it routes for; None: every caller
    pending: bool = False  # a learned route held until an operator confirms it: routes nobody
    agent: str | None = None  # a negative: the agent that declined
    lease: str = "-"  # a negative: that agent's lease fingerprint; a new registration starts afresh
    by: str = "-"  # the token whose request made it (the caller's key; "operator" for the admin)
    expires: float | None = None  # epoch seconds after which it no longer applies; None: never

    @property
    def key(self) -> str:
        """Where the snapshot keeps a learned route: its phrase, and its owner when it has one."""
        phrase = normalize_phrase(self.phrase)
        # A normalized phrase holds no newline, so the owner's part cannot be forged by a phrase.
        return phrase if self.owner is None else f"{self.owner}\n{phrase}"

    @property
    def negative_key(self) -> tuple[str, str, str]:
        return (normalize_phrase(self.phrase), self.task, self.agent or "")

    def live(self, now: float) -> bool:
        return self.expires is None or now < self.expires

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "phrase": self.phrase,
            "task": self.task,
            "source": self.source,
            "at": self.at,
        }
        optional = {
            "owner": self.owner,
            "pending": self.pending or None,
            "agent": self.agent,
            "lease": None if self.lease == "-" else self.lease,
            "by": None if self.by == "-" else self.by,
            "expires": self.expires,
        }
        data.update({k: v for k, v in optional.items() if v is not None})
        return data

    @classmethod
    def from_json(cls, record: dict[str, object]) -> LearnedRoute:
        """Raises KeyError, TypeError or ValueError when ``record`` is not one."""
        expires = record.get("expires")
        owner, agent = record.get("owner"), record.get("agent")
        return cls(
            str(record["phrase"]),
            str(record["task"]),
            str(record["source"]),
            float(record["at"]),  # type: ignore[arg-type]
            owner=None if owner is None else str(owner),
            pending=record.get("pending") is True,
            agent=None if agent is None else str(agent),
            lease=str(record.get("lease") or "-"),
            by=str(record.get("by") or "-"),
            expires=None if expires is None else float(expires),  # type: ignore[arg-type]
        )


def learned_key(phrase: str, owner: str | None) -> str:
    """The snapshot key of ``phrase`` learned for ``owner`` (None: for every caller)."""
    return LearnedRoute(phrase, "", "", 0.0, owner=owner).key


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


def require_lease(entry: AgentEntry, lease_id: str) -> None:
    """Raise ``LeaseMismatch`` (403) unless ``lease_id`` is the entry's lease."""
    if not holds_lease(entry, lease_id):
        raise LeaseMismatch(f"leaseId does not match the lease agent {entry.id!r} holds")


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
