"""The gate every HTTP request passes before it is served.

Today it admits everything. It is the one place where ROADMAP step 6 adds credentials (agent,
caller and admin tokens) and rate limits, without touching the endpoints: the app asks the guard
about each request, by the kind of action it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from agent_reach.exceptions import AccessDenied
from agent_reach.protocol import Status


class Action(StrEnum):
    """What a request wants to do; credentials will be checked per action."""

    REACH = "reach"  # POST /reach, GET /reach/{traceId}
    REGISTER = "register"  # POST /agents, lease renewals, deregistration
    ADMIN = "admin"  # /admin/*
    PUBLIC = "public"  # /healthz, /readyz, /openapi.json, /metrics


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


class Guard(Protocol):
    """Admits or refuses a request before any body is read."""

    def check(self, action: Action, scope: dict[str, Any]) -> Denial | None: ...


class OpenGuard:
    """Admits every request: the default until credentials are configured."""

    __slots__ = ()

    def check(self, action: Action, scope: dict[str, Any]) -> Denial | None:
        return None


def action_for(method: str, path: str) -> Action:
    """Classify a request by its method and path."""
    if path == "/reach" or path.startswith("/reach/"):
        return Action.REACH
    if path.startswith("/agents"):
        return Action.REGISTER
    if path.startswith("/admin"):
        return Action.ADMIN
    return Action.PUBLIC
