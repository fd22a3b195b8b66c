"""How the SDK and the CLI trust an HTTPS Router: the system store, or ``REACH_CA_FILE``.

One place for the rule, so the lease keeper (httpx), both clients (aiohttp, httpx) and the CLI
trust the same certificates. Verification is never turned off.
"""

from __future__ import annotations

import os
import ssl
from typing import Literal

from reachmesh.exceptions import ConfigError


def router_verify(env: dict[str, str] | None = None) -> ssl.SSLContext | Literal[True]:
    """``True`` (each HTTP client's default store) or a context trusting ``REACH_CA_FILE``.

    Both httpx (``verify=``) and aiohttp (``ssl=``) take either. A bundle that cannot be read is a
    ConfigError naming the variable, raised when the client is made, not at its first call.
    """
    ca_file = (os.environ if env is None else env).get("REACH_CA_FILE")
    if not ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"REACH_CA_FILE: cannot load the CA bundle {ca_file!r}: {exc}") from exc


def server_context(cert_file: str, key_file: str, *, source: str) -> ssl.SSLContext:
    """A server-side context for an agent's HTTPS callback; ConfigError names ``source`` on failure."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{source}: cannot load {cert_file!r} with {key_file!r}: {exc}") from exc
    return context
