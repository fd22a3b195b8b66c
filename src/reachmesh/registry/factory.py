"""The registry a policy names: in memory (one Router), or etcd (several Routers, durable)."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping, Sequence

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import EtcdPolicy, RegistryPolicy
from reachmesh.exceptions import ConfigError
from reachmesh.registry.base import Registry
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.tls import verifying_context

_ENDPOINT = re.compile(r"^(?:https?://)?[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}/?$")


def etcd_endpoints(policy: RegistryPolicy, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The etcd members: ``registry.etcd.endpoints``, else ``REACH_ETCD_ENDPOINTS`` (comma-separated)."""
    endpoints = list(policy.etcd.endpoints) or [
        part.strip() for part in environ.get("REACH_ETCD_ENDPOINTS", "").split(",") if part.strip()
    ]
    bad = [e for e in endpoints if not _ENDPOINT.match(e)]
    if bad:
        raise ConfigError(
            "etcd endpoints must be host:port, http://host:port or https://host:port, got "
            f"{', '.join(map(repr, bad))} (registry.etcd.endpoints or REACH_ETCD_ENDPOINTS)"
        )
    return endpoints


def etcd_credentials(policy: EtcdPolicy, environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """``(user, password)`` for etcd's authentication, or None when the Router uses none.

    The user comes from ``registry.etcd.username``, else ``REACH_ETCD_USERNAME``; the password
    only from the environment variable ``registry.etcd.password_env`` names. One without the
    other is a ConfigError: a half-set login is a mistake, not a wish to go without one.
    """
    user = (policy.username or environ.get("REACH_ETCD_USERNAME", "")).strip() or None
    # Secrets mounted from files often end in a newline that is not part of the password.
    password = environ.get(policy.password_env, "").rstrip("\r\n") or None
    if user is None and password is None:
        return None
    if user is None:
        raise ConfigError(
            f"{policy.password_env} holds an etcd password but no user is named: "
            "set registry.etcd.username or REACH_ETCD_USERNAME"
        )
    if password is None:
        raise ConfigError(
            f"etcd user {user!r} has no password: set it in the environment variable "
            f"{policy.password_env} (registry.etcd.password_env)"
        )
    return user, password


def etcd_tls(policy: EtcdPolicy, endpoints: Sequence[str]) -> ssl.SSLContext | None:
    """The TLS context for ``https://`` members (always verified), or None when none is https.

    Built at start, so an unreadable file stops the Router with a ConfigError naming the key; TLS
    files set for members that are all plain http are refused, since the operator believes the
    connection is encrypted and it would not be.
    """
    tls_files = [key for key in ("ca_file", "client_cert_file") if getattr(policy, key) is not None]
    secure = [e.strip().lower().startswith("https://") for e in endpoints]
    if any(secure) and not all(secure):
        raise ConfigError(
            "etcd endpoints mix https:// with plain ones: calls to the plain ones would go "
            "unencrypted; write every member as https://host:port, or none"
        )
    if not any(secure):
        if tls_files:
            raise ConfigError(
                f"registry.etcd.{tls_files[0]} is set but no etcd endpoint is https://: "
                "write the endpoints as https://host:port to use TLS"
            )
        return None
    return verifying_context("registry.etcd", policy.ca_file, policy.client_cert_file, policy.client_key_file)


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
    from reachmesh.registry.etcd import EtcdRegistry  # only an etcd Router loads the etcd client

    return EtcdRegistry(
        policy,
        endpoints=endpoints,
        clock=clock,
        tls=etcd_tls(policy.etcd, endpoints),
        credentials=etcd_credentials(policy.etcd, environ),
    )
