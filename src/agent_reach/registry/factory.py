"""The registry a policy names: in memory (one Router), or etcd (several Routers, durable)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from agent_reach.clock import SYSTEM_CLOCK, Clock
from agent_reach.config import RegistryPolicy
from agent_reach.exceptions import ConfigError
from agent_reach.registry.base import Registry
from agent_reach.registry.memory import MemoryRegistry

_ENDPOINT = re.compile(r"^(?:https?://)?[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}/?$")


def etcd_endpoints(policy: RegistryPolicy, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The etcd members: ``registry.etcd.endpoints``, else ``REACH_ETCD_ENDPOINTS`` (comma-separated)."""
    endpoints = list(policy.etcd.endpoints) or [
        part.strip() for part in environ.get("REACH_ETCD_ENDPOINTS", "").split(",") if part.strip()
    ]
    bad = [e for e in endpoints if not _ENDPOINT.match(e)]
    if bad:
        raise ConfigError(
            f"etcd endpoints must be host:port or http://host:port, got {', '.join(map(repr, bad))} "
            "(registry.etcd.endpoints or REACH_ETCD_ENDPOINTS)"
        )
    return endpoints


def build_registry(
    policy: RegistryPolicy, *, clock: Clock = SYSTEM_CLOCK, environ: Mapping[str, str] = os.environ
) -> Registry:
    endpoints = etcd_endpoints(policy, environ)
    if policy.backend == "memory" or (policy.backend == "auto" and not endpoints):
        return MemoryRegistry(policy, clock=clock)
    if not endpoints:
        raise ConfigError(
            "registry.backend is etcd but no endpoints are given: set registry.etcd.endpoints "
            "or REACH_ETCD_ENDPOINTS (host:port[,host:port...])"
        )
    from agent_reach.registry.etcd import EtcdRegistry  # only an etcd Router loads the etcd client

    return EtcdRegistry(policy, endpoints=endpoints, clock=clock)
