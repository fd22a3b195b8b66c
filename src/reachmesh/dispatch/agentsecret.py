"""The shared secret the Router sends an agent, so an SDK agent can tell the Router from anyone
else who reaches its port (``outbound.agent_secret_env`` and ``outbound.agent_secret_envs``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from reachmesh.config import OutboundPolicy
from reachmesh.exceptions import ConfigError
from reachmesh.protocol import AGENT_SECRET_HEADER as HEADER

__all__ = ["HEADER", "AgentSecrets"]


@dataclass(frozen=True, slots=True)
class AgentSecrets:
    """The secret for each agent id: the first matching glob's, else the global one, else none."""

    default: str | None = None
    by_glob: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # never the secrets themselves
        return f"AgentSecrets(default={'set' if self.default else 'none'}, globs={len(self.by_glob)})"

    @classmethod
    def from_policy(cls, policy: OutboundPolicy, environ: Mapping[str, str] = os.environ) -> AgentSecrets:
        """Read the secrets from the environment variables the policy names; a named variable
        that is unset or empty is a ConfigError (the agents would answer every call 401)."""

        def read(name: str, key: str) -> str:
            value = environ.get(name, "").strip()
            if not value:
                raise ConfigError(f"{key} names the environment variable {name}, which is not set")
            return value

        default = (
            read(policy.agent_secret_env, "outbound.agent_secret_env") if policy.agent_secret_env else None
        )
        globs = tuple(
            (glob, read(name, f"outbound.agent_secret_envs[{glob!r}]"))
            for glob, name in policy.agent_secret_envs.items()
        )
        return cls(default, globs)

    def for_agent(self, agent_id: str) -> str | None:
        for glob, secret in self.by_glob:
            if fnmatchcase(agent_id, glob):
                return secret
        return self.default
