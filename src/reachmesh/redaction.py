"""Keeping secrets and caller text harmless in logs.

- :func:`fingerprint` stands in for a lease id or a token: the same secret always gives the same
  short tag, so lines can be matched up, but the tag cannot be used in the secret's place.
- :func:`loggable_url` drops a URL's credentials, query and fragment, where tokens hide.
- :func:`loggable` escapes control characters, so no caller text can start a forged log line.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit, urlunsplit


def fingerprint(secret: str | None) -> str:
    """``fp:`` and the first 8 hex digits of the secret's SHA-256 (``-`` for none)."""
    if not secret:
        return "-"
    return "fp:" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def loggable(text: object, limit: int = 512) -> str:
    """``text`` with control characters escaped (``\\n`` stays two characters) and cut to ``limit``."""
    raw = str(text)
    if raw.isprintable() and len(raw) <= limit:
        return raw
    escaped = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in raw)
    return escaped if len(escaped) <= limit else escaped[:limit] + "…"


def loggable_url(url: str) -> str:
    """The URL without user info, query or fragment, and with control characters escaped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        cleaned = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "(unparseable URL)"
    return loggable(cleaned)
