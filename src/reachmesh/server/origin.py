"""The gate against web pages: what a browser sends for a page on another site is refused.

With auth off (the default) every request is admitted, and a browser will send a request to any
address a page names: a ``fetch`` with ``mode: "no-cors"`` registered an agent with a Router on
loopback. Three checks close that, before the guard and before any body is read:

- **Origin**: a browser names the page's origin on every cross-site request and on every
  ``POST``; a request whose ``Origin`` is not the Router's own (the ``Host`` it was sent to) nor in
  ``server.allowed_origins`` is refused. Programs (the SDK, curl, the bridges) send no ``Origin``.
  A listed one is told apart (:class:`CrossOrigin`): the Router's paths serve it with CORS
  headers (:mod:`.cors`), which the Router's own page and programs never get.
- **Host**: on a connection to a loopback address, the ``Host`` header must be a loopback name
  (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``[::1]``) or in ``server.allowed_hosts``. A page
  whose name was made to resolve to 127.0.0.1 (DNS rebinding) is same-origin to the browser, but
  sends its own name as the Host.
- **Content-Type**: JSON endpoints require a JSON media type (:func:`~.asgi.check_json_content_type`);
  a page can send a body without a preflight only as form data, text or with no type at all.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from reachmesh.config import ServerPolicy
from reachmesh.protocol import Status
from reachmesh.server.auth import Denial

_DEFAULT_PORTS = {"http": "80", "https": "443"}

# Said by `reach router` at start, and by a reload into the state, when every page may drive a
# Router with auth off. Loopback is no shelter here: the browser on this host makes the requests.
OPEN_TO_EVERY_PAGE = (
    'server.allowed_origins admits every origin ("*") with auth off: any web page a browser on '
    "this host opens can register, call and administer the Router, and read its answers. List the "
    "pages' origins instead, or set REACH_ADMIN_TOKEN (and agent and caller tokens)."
)


def open_to_every_page(policy: ServerPolicy, auth_on: bool) -> bool:
    """Whether ``policy`` admits every page's origin while no credentials are asked for."""
    return not auth_on and "*" in policy.allowed_origins


# How much of a refused header the refusal quotes.
_QUOTE = 80


def host_name(authority: str) -> str:
    """The host of ``host[:port]`` (brackets kept off an IPv6 literal), lower-cased."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        return authority[1:end] if end > 0 else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def is_loopback_name(name: str) -> bool:
    """``localhost``, a ``.localhost`` name (browsers resolve those to loopback themselves), or
    a loopback address."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _loopback_address(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class CrossOrigin:
    """The gate's verdict on a request from a page on another origin that
    ``server.allowed_origins`` admits: served, with the CORS headers (:mod:`.cors`) that let the
    browser hand the page its answer."""

    __slots__ = ("origin",)

    def __init__(self, origin: bytes) -> None:
        self.origin = origin  # as the browser sent it: echoed in Access-Control-Allow-Origin


class BrowserGate:
    """Refuses a foreign ``Origin``, and a non-loopback ``Host`` on a loopback connection."""

    __slots__ = ("_hosts", "_hosts_policy", "_loopback")

    def __init__(self) -> None:
        # Local addresses seen, and whether each is loopback: a server listens on a few at most.
        self._loopback: dict[str, bool] = {}
        # Host headers seen and whether each passes, for the policy they were judged under: the
        # check runs on every request, and parsing an address each time cost microseconds.
        self._hosts: dict[bytes, bool] = {}
        self._hosts_policy: list[str] | None = None

    def check(
        self, scope: dict[str, Any], policy: ServerPolicy, fields: dict[bytes, bytes] | None = None
    ) -> Denial | CrossOrigin | None:
        """The denial for this request, if any, or :class:`CrossOrigin` for a page on another
        origin that the policy admits (None: no ``Origin``, or the Router's own). ``fields``: its
        headers as a dict, when the caller has them so (the /reach lane), read by two lookups
        instead of a scan of the list (of a repeated name, the last value either way)."""
        if fields is not None:
            host = fields.get(b"host")
            origin = fields.get(b"origin")
        else:
            host, origin = _host_and_origin(scope["headers"])
        if host is not None:
            # _on_loopback and _host_ok, each answered from its table without a call once known
            # (a server's address is a str or None: the table's keys are its str()).
            server = scope.get("server")
            on_loopback = self._loopback.get(server[0]) if server else False
            if on_loopback is None:
                on_loopback = self._on_loopback(scope)
            if on_loopback:
                allowed = policy.allowed_hosts
                if allowed is not self._hosts_policy or (host_ok := self._hosts.get(host)) is None:
                    host_ok = self._host_ok(host, allowed)
                if not host_ok:
                    return _host_denial(host.decode("latin-1"))
        if origin is not None:
            return _origin_verdict(origin, host, policy.allowed_origins)
        return None

    def _host_ok(self, host: bytes, allowed: list[str]) -> bool:
        if allowed is not self._hosts_policy:  # a reload: judge every name again
            self._hosts, self._hosts_policy = {}, allowed
        known = self._hosts.get(host)
        if known is None:
            if len(self._hosts) >= 256:  # names a client made up: judged, not kept
                return _host_allowed(host.decode("latin-1"), allowed)
            known = self._hosts[host] = _host_allowed(host.decode("latin-1"), allowed)
        return known

    def _on_loopback(self, scope: dict[str, Any]) -> bool:
        server = scope.get("server")
        if not server:
            return False
        address = str(server[0])
        known = self._loopback.get(address)
        if known is None:
            if len(self._loopback) > 64:
                self._loopback.clear()
            known = self._loopback[address] = _loopback_address(address)
        return known


def _host_and_origin(headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    """The Host and Origin of a request's header list (of a repeated name, the last value)."""
    host = origin = None
    for name, value in headers:
        if name == b"host":
            host = value
        elif name == b"origin":
            origin = value
    return host, origin


def _host_allowed(host: str, allowed: list[str]) -> bool:
    name = host_name(host)
    return is_loopback_name(name) or "*" in allowed or name in allowed


def _host_denial(host: str) -> Denial:
    return Denial(
        403,
        Status.FORBIDDEN,
        f"Host {host[:_QUOTE]!r} is not a name of this Router, which listens on loopback "
        "(a page on another site may be reaching it through DNS rebinding); "
        "list the name in server.allowed_hosts to serve it",
    )


def _origin_verdict(sent: bytes, host: bytes | None, allowed: list[str]) -> Denial | CrossOrigin | None:
    origin = sent.decode("latin-1").strip()
    if origin == "null":
        # An opaque origin (a sandboxed frame, a file:// page, a data: URL): no site an operator
        # could list, so not one "*" admits either; echoed, it would admit every such page.
        return _NULL_ORIGIN
    if _same_origin(origin, host):
        return None  # the Router's own page: served as ever, without CORS headers
    if "*" in allowed or origin.lower() in allowed:
        return CrossOrigin(origin.encode("latin-1"))
    return _origin_denial(origin)


_NULL_ORIGIN = Denial(
    403,
    Status.FORBIDDEN,
    "requests from a page of opaque origin ('null': a sandboxed frame, a file:// page) are refused, "
    "whatever server.allowed_origins says: serve the page from an origin listed there",
)


def _origin_denial(origin: str) -> Denial:
    return Denial(
        403,
        Status.FORBIDDEN,
        f"requests from the page at {origin[:_QUOTE]!r} are refused: only the Router's own origin "
        "may call it from a browser (list another in server.allowed_origins)",
    )


def _same_origin(origin: str, host: bytes | None) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) names the Host the request was sent to."""
    if host is None:
        return False
    scheme, sep, authority = origin.lower().partition("://")
    if not sep or not authority or "/" in authority:
        return False
    sent = host.decode("latin-1").strip().lower()
    if authority == sent:
        return True
    default = _DEFAULT_PORTS.get(scheme)
    # A browser leaves the scheme's default port out of an Origin; a Host may spell it.
    return default is not None and sent == f"{authority}:{default}"


__all__ = ["BrowserGate", "CrossOrigin", "host_name", "is_loopback_name"]
