"""CORS for the pages ``server.allowed_origins`` admits, and for no one else.

The browser gate (:mod:`.origin`) says which requests come from a page on another origin that
the policy admits (:class:`~.origin.CrossOrigin`); only those get the headers here. A browser
lets such a page send JSON (or an ``Authorization``) only after a preflight ``OPTIONS`` is
answered for its origin, and hands the page an answer only when it names the page's origin:

- the preflight is answered ``204`` with the methods the path serves and the request headers a
  caller may send (:func:`preflight_headers`), before the guard: a browser sends no credentials
  on a preflight;
- every answer to an admitted request, errors and streams included, names the origin and the
  headers the page may read (:data:`_ANSWER`).

The origin is echoed, never ``*``: the answer may depend on the caller's ``Authorization``.
``Vary: Origin`` keeps a cache from handing one page's answer to another. Requests with no
``Origin`` (programs) and the Router's own page (same origin) get none of this.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.routing import BaseRoute, Route

from reachmesh.server.asgi import Send

# The request headers a page may send: the JSON body's type, a bearer token, and the trace and
# request headers the Router reads (protocol §5, §4, the additions).
ALLOW_HEADERS = b"content-type, authorization, traceparent, x-reach-trace-id, x-reach-hops, x-reach-lease"
# The answer headers a page may read beyond the ones every page may (Content-Type and such):
# when to come back (429, 503, a throttled registration) and how to authenticate (401).
EXPOSE_HEADERS = b"retry-after, www-authenticate"
# How long a browser may keep a preflight's answer (Chromium keeps one at most 2 hours).
MAX_AGE_SECONDS = 600

_VARY = (b"vary", b"origin")


def answer_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    """The headers of an answer to an admitted page on ``origin``."""
    return [
        (b"access-control-allow-origin", origin),
        _VARY,
        (b"access-control-expose-headers", EXPOSE_HEADERS),
    ]


def preflight_headers(origin: bytes, methods: Iterable[str]) -> list[tuple[bytes, bytes]]:
    """The headers of the ``204`` answer to a preflight from ``origin`` for a path serving
    ``methods``."""
    return [
        (b"access-control-allow-origin", origin),
        _VARY,
        (b"access-control-allow-methods", ", ".join(methods).encode("latin-1")),
        (b"access-control-allow-headers", ALLOW_HEADERS),
        (b"access-control-max-age", str(MAX_AGE_SECONDS).encode()),
    ]


def is_preflight(scope: dict[str, Any]) -> bool:
    """An ``OPTIONS`` asking ``Access-Control-Request-Method``: a browser's preflight. Another
    ``OPTIONS`` is an ordinary request (``405`` with ``Allow``)."""
    return scope["method"] == "OPTIONS" and any(
        name == b"access-control-request-method" for name, _ in scope["headers"]
    )


def methods_of(routes: Iterable[BaseRoute], path: str) -> list[str]:
    """The methods the routes serve at ``path`` (``HEAD`` left out: a page never needs it
    allowed), in a fixed order; none for a path nothing serves."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods.update(route.methods)
    methods.discard("HEAD")
    return sorted(methods)


def with_answer_headers(send: Send, origin: bytes) -> Send:
    """``send``, adding :func:`answer_headers` to the answer's head (a whole answer or a stream)."""
    extra = answer_headers(origin)

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


__all__ = [
    "ALLOW_HEADERS",
    "EXPOSE_HEADERS",
    "MAX_AGE_SECONDS",
    "answer_headers",
    "is_preflight",
    "methods_of",
    "preflight_headers",
    "with_answer_headers",
]
