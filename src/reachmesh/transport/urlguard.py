"""The one guard of every URL the Router will call: agent endpoints, health checks, ``replyTo``.

The Router calls URLs that strangers give it, so each is checked where it is accepted
(registration, an async request) and again at connect time against the address a name resolves
to, so a DNS answer that changes later (rebinding) gets nowhere.

By default loopback and private ranges are allowed (the demo and a compose network need them);
refused are link-local addresses (169.254/16, fe80::/10, cloud metadata among them), the known
metadata addresses and names of the clouds, unspecified addresses (0.0.0.0, ::), multicast,
non-HTTP schemes, credentials in URLs and control characters. IPv4 in any spelling (decimal,
octal, hex, IPv4-mapped IPv6) is read as the address it is. An IPv6 address that carries an IPv4
one (IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96`` and the local-use ``64:ff9b:1::/48``,
6to4 ``2002::/16``, Teredo) is refused when the IPv4 address inside it is: a NAT64 gateway or a
6to4 relay would deliver the packet to that IPv4 address. The policy (``outbound``) can forbid
loopback or private ranges, or allow only listed networks and host names.
"""

from __future__ import annotations

import ipaddress
import socket
import unicodedata
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import TypeVar
from urllib.parse import urlsplit

from reachmesh.config import OutboundPolicy
from reachmesh.exceptions import OutboundRefused

T = TypeVar("T")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services that sit outside link-local (where most of them are).
_METADATA_ADDRESSES = {
    ipaddress.ip_address("fd00:ec2::254"),  # AWS, IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    ipaddress.ip_address("192.0.0.192"),  # Oracle Cloud (classic)
}
_METADATA_NAMES = (
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.*",
)


class UrlGuard:
    """Says whether the Router may call a URL, or an address a name resolved to."""

    def __init__(self, policy: OutboundPolicy | None = None) -> None:
        self.policy = policy or OutboundPolicy()

    def apply(self, policy: OutboundPolicy) -> None:
        """Check URLs against a reloaded policy from the next one on."""
        self.policy = policy

    def check_url(self, url: str) -> None:
        """Refuse (OutboundRefused, naming the rule) a URL the Router must not call."""
        if any(not ch.isprintable() or ch.isspace() for ch in url):
            raise OutboundRefused("control characters or spaces in the URL")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError as exc:
            raise OutboundRefused(f"not a URL ({exc})") from exc
        if parts.scheme not in ("http", "https"):
            raise OutboundRefused(f"scheme {parts.scheme or '(none)'!r}: only http and https are called")
        if parts.username is not None or parts.password is not None:
            raise OutboundRefused("credentials in the URL")
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise OutboundRefused("no host")
        address = literal_address(host)
        if address is None:
            self.check_name(host)
        else:
            self.check_address(address)

    def check_name(self, host: str) -> None:
        """Refuse a host name that is a metadata service, or outside an allow-list."""
        # Full-width and other compatibility forms name the same host once resolved.
        name = unicodedata.normalize("NFKC", host).lower().rstrip(".")
        if any(fnmatchcase(name, pattern) for pattern in _METADATA_NAMES):
            raise OutboundRefused(f"host {host!r} is a cloud metadata service")
        policy = self.policy
        if policy.allow and not any(_allows_name(rule, name) for rule in policy.allow):
            raise OutboundRefused(f"host {host!r} is not in outbound.allow")

    def check_address(self, address: Address) -> None:
        """Refuse an address the Router must not call."""
        reason = self.refusal(address)
        if reason is not None:
            raise OutboundRefused(reason)

    def allowed(self, host: str, found: Sequence[T], address_of: Callable[[T], str]) -> list[T]:
        """What ``host`` resolved to, less every address the guard refuses; an OSError (a network
        error to the client that resolved) naming the rule when nothing is left. Checked on
        every connection, so a name that resolves to a refused address, at once or after a
        rebinding, is never connected to."""
        kept = []
        reason = ""
        for item in found:
            refusal = self.refusal(ipaddress.ip_address(address_of(item).split("%", 1)[0]))
            if refusal is None:
                kept.append(item)
            else:
                reason = refusal
        if not kept:
            raise OSError(f"{host} resolves only to refused addresses ({reason})")
        return kept

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` is refused, or None when it may be called."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        reason = self._own_refusal(address)
        if reason is not None or isinstance(address, ipaddress.IPv4Address):
            return reason
        for form, inner in embedded_ipv4(address):
            reason = self._own_refusal(inner)
            if reason is not None:
                return f"{address} ({form} of {reason})"
        return None

    def _own_refusal(self, address: Address) -> str | None:
        policy = self.policy
        rules = (
            (address in _METADATA_ADDRESSES, "is a cloud metadata address"),
            (address.is_unspecified, "is the unspecified address"),
            (address.is_link_local, "is link-local (cloud metadata lives there)"),
            (address.is_multicast, "is multicast"),
            (
                address.is_loopback and not policy.allow_loopback,
                "is loopback, which outbound.allow_loopback forbids",
            ),
            (
                address.is_private and not address.is_loopback and not policy.allow_private,
                "is a private address, which outbound.allow_private forbids",
            ),
            (
                bool(policy.allow) and not any(_allows_address(rule, address) for rule in policy.allow),
                "is not in outbound.allow",
            ),
        )
        return next((f"{address} {why}" for refused, why in rules if refused), None)


_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
# RFC 6052: a prefix of 32 to 96 bits, the IPv4 address after it with bits 64-71 left out.
_NAT64_LOCAL_PREFIX_BYTES = (6, 7, 8, 12)


def _after_prefix(packed: bytes, prefix_bytes: int) -> ipaddress.IPv4Address:
    octets = [packed[i] for i in range(prefix_bytes, 16) if i != 8][:4]
    return ipaddress.IPv4Address(bytes(octets))


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """Each IPv4 address an IPv6 one carries, with the name of the form; empty for most."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    packed = address.packed
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # :: and ::1 are themselves
        found.append(("the IPv4-compatible form", _after_prefix(packed, 12)))
    if address in _NAT64:
        found.append(("the NAT64 form", _after_prefix(packed, 12)))
    if address in _NAT64_LOCAL:
        # The operator picks the prefix length; any reading that lands on a refused address
        # is reason enough.
        found.extend(
            ("a local NAT64 form", _after_prefix(packed, size)) for size in _NAT64_LOCAL_PREFIX_BYTES
        )
    if address.sixtofour is not None:
        found.append(("the 6to4 form", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found.extend([("the Teredo form", server), ("the Teredo form", client)])
    return found


def literal_address(host: str) -> Address | None:
    """The address a host part spells, in any IPv4 spelling (``2852039166``, ``0xa9.0376.1.1``)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host.replace(".", "").replace("x", "").replace("X", "").isalnum() and host[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _allows_address(rule: str, address: Address) -> bool:
    try:
        return address in ipaddress.ip_network(rule, strict=False)
    except ValueError:
        return False


def _allows_name(rule: str, name: str) -> bool:
    try:
        ipaddress.ip_network(rule, strict=False)
    except ValueError:
        return fnmatchcase(name, rule.lower())
    return False  # a network rule: the name is checked by its addresses at connect time
