"""``reach_config.yaml``: an agent's profile plus where it finds the Router and what it binds.

```yaml
agent:            # the profile of PROTOCOL.md §1, sent to the Router as is
  id: price-query-agent
  network: {endpoint: http://127.0.0.1:7301/reach}
  capabilities: [...]
router:           # optional
  url: http://127.0.0.1:7200         # or several Routers of one service, comma-separated
  registration_timeout_seconds: 5   # per attempt; a retry after a lost reply keeps the lease
server:           # optional: where the SDK listens; default 127.0.0.1 and the endpoint's port
  host: 127.0.0.1
  port: 7301
  tls_cert_file: agent.crt   # optional, with tls_key_file: serve the callback over HTTPS
  tls_key_file: agent.key    # (the endpoint must then be https://)
  shared_secret_env: REACH_AGENT_SECRET   # optional: answer only calls that carry this secret
  repeat_cache_bytes: 16777216  # optional: answers kept for repeated requests, in all (16 MiB)
```

The environment wins over the file: ``REACH_SELF_ID`` (agent.id), ``REACH_ROUTER_URL``
(router.url), ``REACH_CALLBACK_URL`` (agent.network.endpoint) and, an addition to the
protocol, ``REACH_HEALTH_PORT`` (agent.health_check.port). ``REACH_CA_FILE`` is the CA bundle an
HTTPS Router's certificate is checked against (see :mod:`reachmesh.sdk.tls`).

An agent answers whoever reaches its port. With a shared secret (in the environment variable
``server.shared_secret_env`` names, ``REACH_AGENT_SECRET`` unless it names another), it answers a
call to its callback only when the call carries that secret in ``X-Reach-Agent-Secret``, which
the Router sends when its ``outbound.agent_secret_env`` names the same secret; others get 401.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from reachmesh.exceptions import ConfigError
from reachmesh.protocol import AgentProfile, Capability, HealthCheck, Network, error_details
from reachmesh.sdk.capacity import REPEAT_CACHE_BYTES
from reachmesh.sdk.lease import DEFAULT_REGISTRATION_TIMEOUT_S
from reachmesh.sdk.routers import split_router_urls
from reachmesh.yamlfile import read_yaml

log = logging.getLogger("reachmesh.sdk")

DEFAULT_ROUTER_URL = "http://127.0.0.1:7200"
_KNOWN_TOP = {"agent", "router", "server"}


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """A validated agent configuration."""

    profile: AgentProfile
    router_url: str = DEFAULT_ROUTER_URL
    host: str = "127.0.0.1"
    port: int = 0
    registration_timeout_seconds: float = DEFAULT_REGISTRATION_TIMEOUT_S
    # HTTPS for the callback: the certificate chain and key (PEM), both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # The secret a call must carry in X-Reach-Agent-Secret; None: every call is answered.
    shared_secret: str | None = field(default=None, repr=False)
    # The bytes of answers kept, in all, for requests the Router sends again (sdk/capacity.py).
    repeat_cache_bytes: int = REPEAT_CACHE_BYTES

    @property
    def router_urls(self) -> list[str]:
        """The Routers of ``router_url``: one, or several comma-separated."""
        return router_url.split(",") if (router_url := self.router_url) else []

    @property
    def callback_path(self) -> str:
        return urlsplit(self.profile.network.endpoint).path or "/"

    @property
    def health_port(self) -> int | None:
        return self.profile.health_check.port

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, env: dict[str, str] | None = None) -> AgentConfig:
        """Read, override from the environment, and validate ``path``; raises ConfigError."""
        return cls.from_mapping(read_yaml(path), source=str(path), env=env)

    @classmethod
    def from_mapping(
        cls, data: Any, *, source: str = "reach_config.yaml", env: dict[str, str] | None = None
    ) -> AgentConfig:
        env = dict(os.environ) if env is None else env
        agent = _agent_section(data, source)
        _apply_env(agent, env)
        try:
            profile = AgentProfile.model_validate(agent)
        except ValidationError as exc:
            details = error_details(exc, prefix="agent")
            lines = "; ".join(f"{d['field']}: {d['message']}" for d in details)
            raise ConfigError(f"{source}: {lines}", details=details) from exc

        router = data.get("router") or {}
        server = data.get("server") or {}
        if not isinstance(router, dict) or not isinstance(server, dict):
            raise ConfigError(f"{source}: router: and server: must be mappings")
        router_url = env.get("REACH_ROUTER_URL") or router.get("url") or DEFAULT_ROUTER_URL
        if not isinstance(router_url, list):  # a YAML list is one URL an item
            router_url = str(router_url)
        try:
            router_urls = split_router_urls(router_url, what="router.url")
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}") from exc
        endpoint = urlsplit(profile.network.endpoint)
        port = server.get("port", endpoint.port or (443 if endpoint.scheme == "https" else 80))
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"{source}: server.port must be a port number, got {port!r}")
        host = server.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"{source}: server.host must be a host name or address")
        timeout = router.get("registration_timeout_seconds", DEFAULT_REGISTRATION_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
            raise ConfigError(
                f"{source}: router.registration_timeout_seconds must be a number of seconds "
                f"from 0 to 300, got {timeout!r}"
            )
        cert_file, key_file = _server_tls(server, profile, source)
        secret = _shared_secret(server, env, source)
        cache_bytes = server.get("repeat_cache_bytes", REPEAT_CACHE_BYTES)
        if not valid_cache_bytes(cache_bytes):
            raise ConfigError(
                f"{source}: server.repeat_cache_bytes must be a whole number of bytes from 0 to "
                f"{MAX_REPEAT_CACHE_BYTES}, got {cache_bytes!r}"
            )
        return cls(
            profile=profile,
            router_url=",".join(router_urls),
            host=host,
            port=port,
            registration_timeout_seconds=float(timeout),
            tls_cert_file=cert_file,
            tls_key_file=key_file,
            shared_secret=secret,
            repeat_cache_bytes=cache_bytes,
        )


# The largest repeat cache an agent may ask for (1 GiB): a typo of a few zeros is refused.
MAX_REPEAT_CACHE_BYTES = 1 << 30


def valid_cache_bytes(value: Any) -> bool:
    """Whether ``value`` is a repeat cache size (server.repeat_cache_bytes): 0 keeps nothing."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPEAT_CACHE_BYTES


def _agent_section(data: Any, source: str) -> dict[str, Any]:
    """A copy of the file's ``agent:`` mapping, once the file's keys are checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with an `agent:` key")
    unknown = sorted(str(key) for key in set(data) - _KNOWN_TOP)
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {', '.join(unknown)}{_near(unknown[0], _KNOWN_TOP)}; "
            f"expected {', '.join(sorted(_KNOWN_TOP))}"
        )
    agent = copy.deepcopy(data.get("agent"))
    if not isinstance(agent, dict):
        raise ConfigError(f"{source}: agent: is required and must be a mapping (the profile)")
    for path in _unknown_keys(data, source):
        log.warning("[reach-client] %s: %s is not a key of reach_config.yaml; ignored", source, path)
    return agent


def _server_tls(server: dict[str, Any], profile: AgentProfile, source: str) -> tuple[str | None, str | None]:
    """``server.tls_cert_file`` and ``server.tls_key_file``: both or neither, and only for https."""
    cert_file, key_file = server.get("tls_cert_file"), server.get("tls_key_file")
    if cert_file is None and key_file is None:
        return None, None
    if not isinstance(cert_file, str) or not isinstance(key_file, str) or not cert_file or not key_file:
        raise ConfigError(f"{source}: server.tls_cert_file and server.tls_key_file go together (two paths)")
    if urlsplit(profile.network.endpoint).scheme != "https":
        # The Router would speak cleartext to a TLS port: every call would fail, so say it now.
        raise ConfigError(
            f"{source}: server.tls_cert_file is set, so agent.network.endpoint must be https://"
        )
    if profile.health_check.port is not None:
        # The Router probes the health port with the endpoint's scheme, and the small health
        # server there speaks plain HTTP only.
        raise ConfigError(f"{source}: a separate health_check.port is plain HTTP; drop it to serve HTTPS")
    return cert_file, key_file


DEFAULT_SECRET_ENV = "REACH_AGENT_SECRET"


def _shared_secret(server: dict[str, Any], env: dict[str, str], source: str) -> str | None:
    """The secret from ``server.shared_secret_env``'s variable (default REACH_AGENT_SECRET).

    A variable the file names explicitly must be set: the agent would otherwise answer anyone
    while its author believes it checks the Router."""
    named = server.get("shared_secret_env")
    if named is not None and (not isinstance(named, str) or not named.isidentifier()):
        raise ConfigError(f"{source}: server.shared_secret_env must name an environment variable")
    secret = env.get(named or DEFAULT_SECRET_ENV, "").strip()
    if named is not None and not secret:
        raise ConfigError(f"{source}: server.shared_secret_env names {named}, which is not set")
    return secret or None


_SECTIONS: dict[str, set[str]] = {
    "router": {"url", "registration_timeout_seconds"},
    "server": {"host", "port", "tls_cert_file", "tls_key_file", "shared_secret_env", "repeat_cache_bytes"},
}


def _keys(model: type[BaseModel]) -> set[str]:
    return {name for name, info in model.model_fields.items()} | {
        info.alias for info in model.model_fields.values() if info.alias
    }


def _near(key: str, known: Iterable[str]) -> str:
    near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f"; did you mean {near[0]!r}?" if near else ""


def _unknown_keys(data: dict[str, Any], source: str) -> list[str]:
    """The paths of keys no part of the file knows. One spelt like a known key (``exmaples``,
    ``health_chek``) is refused with a did-you-mean: silently ignored, it would drop what the
    author meant. Others are returned, to be warned about: a profile may carry keys of its own.
    """
    found: list[str] = []

    def check(mapping: Any, known: set[str], path: str) -> None:
        if not isinstance(mapping, dict):
            return
        for key in mapping:
            if isinstance(key, str) and key in known:
                continue
            hint = _near(str(key), known)
            if hint:
                raise ConfigError(f"{source}: {path}.{key} is not a known key{hint}")
            found.append(f"{path}.{key}")

    agent = data["agent"]
    check(agent, _keys(AgentProfile), "agent")
    check(agent.get("network"), _keys(Network), "agent.network")
    check(agent.get("health_check"), _keys(HealthCheck), "agent.health_check")
    capabilities = agent.get("capabilities")
    for index, capability in enumerate(capabilities if isinstance(capabilities, list) else []):
        check(capability, _keys(Capability), f"agent.capabilities.{index}")
    for name, known in _SECTIONS.items():
        check(data.get(name), known, name)
    return found


def find_config(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``REACH_AGENT_CONFIG``, else ``./reach_config.yaml``."""
    chosen = path or os.environ.get("REACH_AGENT_CONFIG") or "reach_config.yaml"
    return Path(chosen)


def _apply_env(agent: dict[str, Any], env: dict[str, str]) -> None:
    """Override the profile from REACH_SELF_ID, REACH_HEALTH_PORT and REACH_CALLBACK_URL."""
    if env.get("REACH_SELF_ID"):
        agent["id"] = env["REACH_SELF_ID"]
    if env.get("REACH_HEALTH_PORT"):
        found_check = agent.get("health_check")
        check: dict[str, Any] = found_check if isinstance(found_check, dict) else {}
        raw = env["REACH_HEALTH_PORT"]
        if not (raw.isascii() and raw.isdigit()):
            raise ConfigError(f"REACH_HEALTH_PORT must be a port number, got {raw!r}")
        agent["health_check"] = {**check, "port": int(raw)}
    if env.get("REACH_CALLBACK_URL"):
        found = agent.get("network")
        network: dict[str, Any] = found if isinstance(found, dict) else {}
        agent["network"] = {**network, "endpoint": env["REACH_CALLBACK_URL"]}
