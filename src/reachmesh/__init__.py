"""Agent-Reach: the communication layer for multi-agent systems.

A Router keeps a leased registry of agents and forwards each ReachRequest to the agent that
should handle it; the SDK registers agents and calls through it.

The names in ``__all__`` are the public API, promised across releases: import them from
``reachmesh`` itself. Everything else is importable from its module but may move. The names are
loaded on first use, so ``import reachmesh`` (or an agent's ``from reachmesh import ReachAgent``)
does not pull in the Router's server stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from reachmesh.version import __version__

if TYPE_CHECKING:
    from reachmesh.config import RouterConfig
    from reachmesh.exceptions import (
        AccessDenied,
        AgentIdConflict,
        AgentNotFound,
        AttemptError,
        ClientError,
        ConfigError,
        ContextUnavailable,
        DeadlineExceeded,
        EmbeddingError,
        EmbeddingUnavailable,
        InvalidProfile,
        NoAvailableHandler,
        OutboundRefused,
        Overloaded,
        ReachError,
        RegistryError,
        RegistryFull,
        RegistryUnavailable,
        RequestError,
        RouterUnavailable,
        RoutingError,
    )
    from reachmesh.protocol import AgentProfile, Capability, ReachRequest, ReachResponse, Status
    from reachmesh.sdk import AgentConfig, ReachAgent, ReachClient, ReachContext, SyncReachClient
    from reachmesh.server.app import create_app

# Where each public name lives; read by __getattr__ on first use.
_PUBLIC: dict[str, str] = {
    # The agent SDK.
    "ReachAgent": "reachmesh.sdk",
    "ReachContext": "reachmesh.sdk",
    "ReachClient": "reachmesh.sdk",
    "SyncReachClient": "reachmesh.sdk",
    "AgentConfig": "reachmesh.sdk",
    # The Router as an ASGI app, and its policy.
    "create_app": "reachmesh.server.app",
    "RouterConfig": "reachmesh.config",
    # The wire models.
    "ReachRequest": "reachmesh.protocol",
    "ReachResponse": "reachmesh.protocol",
    "AgentProfile": "reachmesh.protocol",
    "Capability": "reachmesh.protocol",
    "Status": "reachmesh.protocol",
    # The error tree.
    **{
        name: "reachmesh.exceptions"
        for name in (
            "ReachError",
            "ConfigError",
            "RequestError",
            "Overloaded",
            "AccessDenied",
            "RegistryError",
            "InvalidProfile",
            "AgentIdConflict",
            "RegistryFull",
            "RegistryUnavailable",
            "AgentNotFound",
            "RoutingError",
            "NoAvailableHandler",
            "ContextUnavailable",
            "DeadlineExceeded",
            "AttemptError",
            "OutboundRefused",
            "ClientError",
            "RouterUnavailable",
            "EmbeddingError",
            "EmbeddingUnavailable",
        )
    },
}

__all__ = [
    "AccessDenied",
    "AgentConfig",
    "AgentIdConflict",
    "AgentNotFound",
    "AgentProfile",
    "AttemptError",
    "Capability",
    "ClientError",
    "ConfigError",
    "ContextUnavailable",
    "DeadlineExceeded",
    "EmbeddingError",
    "EmbeddingUnavailable",
    "InvalidProfile",
    "NoAvailableHandler",
    "OutboundRefused",
    "Overloaded",
    "ReachAgent",
    "ReachClient",
    "ReachContext",
    "ReachError",
    "ReachRequest",
    "ReachResponse",
    "RegistryError",
    "RegistryFull",
    "RegistryUnavailable",
    "RequestError",
    "RouterConfig",
    "RouterUnavailable",
    "RoutingError",
    "Status",
    "SyncReachClient",
    "__version__",
    "create_app",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'reachmesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
