"""The Router's policy file: load, validate, explain.

Mechanism lives in code, policy lives here. The file is YAML, given by ``--config`` or
``REACH_CONFIG``; every key has a default, so an empty file (or none) is a working Router.
Unknown keys are an error here (unlike on the wire): a typo in a policy must not pass silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_reach.exceptions import ConfigError
from agent_reach.protocol import Strategy, error_details

Positive = Annotated[float, Field(gt=0)]
PositiveMs = Annotated[int, Field(gt=0, le=3_600_000)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerPolicy(_Section):
    """Limits of the HTTP surface."""

    body_limit_bytes: Annotated[int, Field(gt=0, le=64 * 1024 * 1024)] = 1024 * 1024


class RegistryPolicy(_Section):
    """Leases and their sweep."""

    lease_ttl_seconds: Positive = 60
    # A registration that has not renewed for this long turns `suspect`; default: half the TTL.
    suspect_after_seconds: Positive | None = None
    sweep_interval_seconds: Positive = 1.0
    # How long an `offline` agent stays visible in /admin/agents before it is dropped.
    offline_grace_seconds: Annotated[float, Field(ge=0)] = 300

    @model_validator(mode="after")
    def _suspect_before_expiry(self) -> RegistryPolicy:
        if self.suspect_after_seconds is not None and self.suspect_after_seconds >= self.lease_ttl_seconds:
            raise ValueError("suspect_after_seconds must be shorter than lease_ttl_seconds")
        return self

    @property
    def suspect_after(self) -> float:
        return self.suspect_after_seconds or self.lease_ttl_seconds / 2


class TimeoutOverride(_Section):
    """Per-task timeout overrides; an absent key keeps the default."""

    connect_ms: PositiveMs | None = None
    read_ms: PositiveMs | None = None
    overall_ms: PositiveMs | None = None


class TimeoutPolicy(_Section):
    """The layered timeouts: connect, read (per attempt) and the overall budget."""

    connect_ms: PositiveMs = 1000
    read_ms: PositiveMs = 3000
    # The overall budget when the caller gives none: default connect + read + retry allowance.
    overall_ms: PositiveMs | None = None
    per_task: dict[str, TimeoutOverride] = {}


class RetryPolicy(_Section):
    """How many more attempts a request may make after its first."""

    # Retries per request, failovers included; caps the caller's `retryCount`.
    max_per_request: Annotated[int, Field(ge=0, le=10)] = 2
    # Retries on the same agent after a network error, before failing over.
    same_agent: Annotated[int, Field(ge=0, le=5)] = 1
    # Base backoff before a same-agent retry; the actual wait is jittered in [0.5x, 1.5x].
    backoff_ms: Annotated[int, Field(ge=0, le=10_000)] = 25
    # Time the default overall budget sets aside for retries.
    allowance_ms: Annotated[int, Field(ge=0, le=600_000)] = 1000


class RoutingPolicy(_Section):
    """How candidates are chosen and ranked."""

    default_strategy: Strategy = Strategy.EXACT_MATCH
    # Whether a caller's `preferences.strategy` is honoured.
    allow_caller_strategy: bool = True


class LoggingPolicy(_Section):
    """Router log output."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class RouterConfig(_Section):
    """The whole policy file."""

    server: ServerPolicy = ServerPolicy()
    registry: RegistryPolicy = RegistryPolicy()
    timeouts: TimeoutPolicy = TimeoutPolicy()
    retries: RetryPolicy = RetryPolicy()
    routing: RoutingPolicy = RoutingPolicy()
    logging: LoggingPolicy = LoggingPolicy()

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "config") -> RouterConfig:
        """Validate a parsed mapping; raises :class:`ConfigError` naming each bad field."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            lines = "; ".join(f"{d['field']}: {d['message']}" for d in details)
            raise ConfigError(f"{source}: {lines}", details=details) from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> RouterConfig:
        """Read the policy from ``path``, else ``REACH_CONFIG``, else the defaults."""
        chosen = path if path is not None else os.environ.get("REACH_CONFIG") or None
        if chosen is None:
            return cls()
        return cls.from_mapping(read_yaml(chosen), source=str(chosen))


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML file, mapping I/O and syntax errors to :class:`ConfigError`."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{file}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
