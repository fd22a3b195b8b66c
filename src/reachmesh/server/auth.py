"""The gate every HTTP request passes before it is served: credentials and roles.

Each request is classified by the kind of action it is (:func:`action_for`) and checked against
the bearer token it carries, before its body is read:

- **caller**: ``POST /reach``, and ``GET /reach/{traceId}`` for its own async requests;
- **agent**: the registry API for the agent ids its token allows (and the tasks it may serve,
  checked at registration), and calling other agents;
- **admin**: everything, ``/admin/*`` and reload included, and ``/metrics`` unless the policy
  makes it public.

``/healthz``, ``/readyz``, ``/openapi.json`` and the admin page's files (``/admin/ui``) stay
open. Auth is off until a token is configured
(``auth.tokens`` in the policy, stored as SHA-256 digests, or ``REACH_ADMIN_TOKEN``,
``REACH_AGENT_TOKEN``, ``REACH_CALLER_TOKEN``, each a comma-separated list). Tokens are compared
as digests in constant time and never logged; a fingerprint stands in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from itertools import repeat
from typing import Any, Protocol

from reachmesh.config import AuthPolicy, TokenSpec
from reachmesh.dispatch.dispatcher import EVERY_TASK, Grants
from reachmesh.exceptions import AccessDenied, ConfigError
from reachmesh.protocol import Status
from reachmesh.redaction import fingerprint

# The admin page itself holds no data (its calls for data carry the admin token), so it and its
# two files load without one: a person must see the page to be able to type the token into it.
UI_PATH = "/admin/ui"
ENV_TOKENS = {"admin": "REACH_ADMIN_TOKEN", "agent": "REACH_AGENT_TOKEN", "caller": "REACH_CALLER_TOKEN"}
PRINCIPAL = "reach.principal"  # where the scope carries the authenticated principal


class Action(StrEnum):
    """What a request wants to do; credentials are checked per action."""

    REACH = "reach"  # POST /reach, GET /reach/{traceId}
    REGISTER = "register"  # POST /agents, lease renewals, deregistration
    ADMIN = "admin"  # /admin/*
    METRICS = "metrics"  # /metrics
    PUBLIC = "public"  # /healthz, /readyz, /openapi.json


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a role, and for an agent what it may register and serve."""

    role: str
    label: str  # the token's name, or its fingerprint: safe to log and to show
    key: str = "-"  # the token's fingerprint: owns the async requests it started
    agent_ids: tuple[str, ...] = ("*",)
    tasks: tuple[str, ...] = ("*",)
    # The highest routing_weight this token's agents may declare; None: routing.max_weight.
    max_weight: float | None = None
    # The tasks its requests may reach by meaning or by a learned route (exact names: any).
    reach_tasks: tuple[str, ...] = ("*",)
    # What its /reach calls may do beyond calling: made once here, not per call.
    grants: Grants = field(default=EVERY_TASK, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.serves or self.reach_tasks != EVERY_TASK.reach_tasks:
            object.__setattr__(self, "grants", Grants(self.serves, self.reach_tasks))

    def may_register(self, agent_id: str) -> bool:
        return self.role == "admin" or any(fnmatchcase(agent_id, glob) for glob in self.agent_ids)

    def may_serve(self, task: str) -> bool:
        return self.role == "admin" or any(fnmatchcase(task, glob) for glob in self.tasks)

    @property
    def serves(self) -> tuple[str, ...]:
        """The task globs this principal's agents serve: an agent token's, else none."""
        return self.tasks if self.role == "agent" else ()


ANONYMOUS = Principal("anonymous", "-")
OPEN = Principal("admin", "auth-off")  # what every request is while auth is off


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request is refused: an HTTP status, a ReachResponse status and a message."""

    http_status: int
    status: Status
    message: str
    retry_after_s: int | None = None

    def error(self) -> AccessDenied:
        """The error the caller's ReachResponse carries."""
        return AccessDenied(self.status, self.message, self.http_status)

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.http_status == 401:
            return [(b"www-authenticate", b'Bearer realm="agent-reach"')]
        return []


class Guard(Protocol):
    """Admits or refuses a request before any body is read."""

    def check(self, action: Action, scope: dict[str, Any]) -> Denial | None: ...


class OpenGuard:
    """Admits every request: auth is off."""

    __slots__ = ()

    def check(self, action: Action, scope: dict[str, Any]) -> Denial | None:
        scope[PRINCIPAL] = OPEN
        return None


_REACH_ROLES = frozenset({"caller", "agent", "admin"})
_ROLES: dict[Action, frozenset[str]] = {
    Action.REACH: _REACH_ROLES,
    Action.REGISTER: frozenset({"agent", "admin"}),
    Action.ADMIN: frozenset({"admin"}),
    Action.METRICS: frozenset({"admin"}),
}


class TokenGuard:
    """Bearer tokens and roles."""

    def __init__(self, principals: Mapping[bytes, Principal], *, metrics_public: bool = False) -> None:
        self._digests = tuple(principals)  # the same order: a digest's principal at its index
        self._principals = tuple(principals.values())
        self.metrics_public = metrics_public

    @classmethod
    def from_policy(cls, policy: AuthPolicy, env: Mapping[str, str]) -> TokenGuard | None:
        """The guard for ``policy`` and the environment; None when no token is configured."""
        principals: dict[bytes, Principal] = {}
        for spec in policy.tokens:
            principals[bytes.fromhex(spec.sha256)] = _principal(spec)
        for role, name in ENV_TOKENS.items():
            for token in (t.strip() for t in env.get(name, "").split(",")):
                if token:
                    digest = hashlib.sha256(token.encode()).digest()
                    principals[digest] = Principal(role, fingerprint(token), fingerprint(token))
        if not principals:
            return None
        _one_owner_per_fingerprint(principals.values())
        return cls(principals, metrics_public=policy.metrics_public)

    def check(self, action: Action, scope: dict[str, Any]) -> Denial | None:
        if action is Action.PUBLIC or (action is Action.METRICS and self.metrics_public):
            scope[PRINCIPAL] = ANONYMOUS
            return None
        principal = self._principal(scope)
        if principal is None:
            return Denial(
                401, Status.UNAUTHORIZED, "a valid bearer token is required (Authorization: Bearer …)"
            )
        scope[PRINCIPAL] = principal
        # A /reach call's roles without hashing the enum (Enum.__hash__ is Python code).
        if principal.role not in (_REACH_ROLES if action is Action.REACH else _ROLES[action]):
            return Denial(
                403, Status.FORBIDDEN, f"the {principal.role} token {principal.label} may not {action}"
            )
        return None

    def _principal(self, scope: dict[str, Any]) -> Principal | None:
        raw = None
        for name, value in scope["headers"]:  # the first Authorization line, as before
            if name == b"authorization":
                raw = value
                break
        if raw is None or raw[:7].lower() != b"bearer ":
            return None
        digest = hashlib.sha256(raw[7:].strip()).digest()
        # Every digest is compared, in constant time (list() runs map to the end: no early exit),
        # so how long this takes says nothing; map over the C function runs no Python per token.
        matches = list(map(hmac.compare_digest, self._digests, repeat(digest)))
        return self._principals[matches.index(True)] if True in matches else None


def _one_owner_per_fingerprint(principals: Iterable[Principal]) -> None:
    """Refuse two tokens that share a fingerprint (32 bits of the digest): a principal's key
    owns its async results (in etcd too), its share of them, its learned routes; two tokens of
    one key are one owner. A tenant who hands the operator a token's digest can grind one whose
    fingerprint is another tenant's, which is shown in logs and stored in etcd."""
    seen: dict[str, Principal] = {}
    for principal in principals:
        other = seen.setdefault(principal.key, principal)
        if other is not principal:
            raise ConfigError(
                f"auth.tokens: two tokens share the fingerprint {principal.key} ({other.label}, "
                f"{principal.label}): each would own the other's async results and learned routes; "
                "issue another token for one of them"
            )


def _principal(spec: TokenSpec) -> Principal:
    key = f"fp:{spec.sha256[:8]}"
    return Principal(
        spec.role,
        spec.name or key,
        key,
        tuple(spec.agent_ids),
        tuple(spec.tasks),
        spec.max_weight,
        tuple(spec.reach_tasks),
    )


def action_for(method: str, path: str) -> Action:
    """Classify a request by its method and path."""
    if path == "/reach" or path.startswith("/reach/"):
        return Action.REACH
    if path.startswith("/agents"):
        return Action.REGISTER
    if path == UI_PATH or path.startswith(UI_PATH + "/"):
        return Action.PUBLIC
    if path.startswith("/admin"):
        return Action.ADMIN
    if path == "/metrics":
        return Action.METRICS
    return Action.PUBLIC


def principal_of(scope: Mapping[str, Any]) -> Principal:
    """The principal the guard admitted this request as."""
    found = scope.get(PRINCIPAL)
    return found if isinstance(found, Principal) else OPEN
