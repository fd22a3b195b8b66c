"""Small raw-ASGI helpers shared by the hot path and the admin surface."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from reachmesh.exceptions import (
    BodyTimeout,
    LoopDetected,
    PayloadTooLarge,
    RequestError,
    UnsupportedMediaType,
)
from reachmesh.transport.base import HOPS, MAX_HOPS, hops_of

Scope = dict[str, Any]
Receive = Any
Send = Any

# A whole JSON answer: (status, body, extra headers or None).
Answer = tuple[int, bytes, list[tuple[bytes, bytes]] | None]
# The lane's (server/h1.py): the answer, and what to call once it is written (or None), given
# the event loop the lane runs on (asking asyncio for it costs a system call per ask).
LaneAnswer = tuple[Answer, Callable[[asyncio.AbstractEventLoop], None] | None]

JSON_HEADERS = [(b"content-type", b"application/json")]
# Set in a request's scope by the server once the whole body has been read.
BODY_COMPLETE = "reach.body_complete"
# Set in a request's scope by the Router's own HTTP/1.1 protocol (server/h1.py): writes a whole
# response in one go, ``(status, header lines, body) -> bool``; False: send it the ASGI way.
WHOLE_ANSWER = "reach.whole_answer"


class ClientGone(Exception):
    """The client disconnected before its body arrived; there is no one left to answer."""


def header_map(scope: Scope) -> dict[bytes, bytes]:
    """The request headers by lower-case name (the last one wins)."""
    return dict(scope["headers"])


def count_hops(headers: dict[bytes, bytes]) -> None:
    """Take the Routers a request came through (X-Reach-Hops) as this task's count, which its
    attempts send on plus one; past MAX_HOPS it is refused (LoopDetected): a Router forwards to
    itself, on /reach or on the A2A face."""
    hops = hops_of(headers.get(b"x-reach-hops"))
    if hops >= MAX_HOPS:
        raise LoopDetected(
            f"this request has come through {hops} Routers (X-Reach-Hops), the most is {MAX_HOPS}: "
            "an agent's endpoint is a Router's own /reach, so each call was forwarded back to it"
        )
    HOPS.set(hops)


def check_json_content_type(headers: dict[bytes, bytes]) -> None:
    """Refuse (415) a body that does not declare itself as JSON, before reading it.

    A missing Content-Type is refused too: a page on another site can send a body without a
    CORS preflight only untyped, as form data or as text, and with auth off that body would
    drive the Router. ``curl -d`` without ``-H`` sends form encoding: the refusal says what to add,
    and to a browser page (an ``Origin``, which the gate admitted before this) what to send from
    ``fetch`` instead, since curl is not what its author wrote.
    """
    ctype = headers.get(b"content-type")
    if ctype == b"application/json":
        return  # as almost every caller writes it: no split, strip or lower
    hint = _FETCH_HINT if b"origin" in headers else _CURL_HINT
    if ctype is None:
        raise UnsupportedMediaType(f"Content-Type: application/json is required ({hint})")
    media = ctype.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json")):
        return
    raise UnsupportedMediaType(
        f"Content-Type must be application/json, got {media.decode('latin-1')[:64]!r} ({hint})"
    )


_CURL_HINT = "with curl, add -H 'Content-Type: application/json'"
_FETCH_HINT = "from fetch, send headers: {'Content-Type': 'application/json'} with a JSON.stringify body"


def _check_declared_size(headers: dict[bytes, bytes], limit: int) -> None:
    """Refuse a body whose Content-Length is over ``limit`` before reading a byte of it."""
    declared = headers.get(b"content-length")
    if declared is None:
        return
    if not (declared.isascii() and declared.isdigit()):
        raise RequestError("Content-Length is not a number")
    size = int(declared)
    if size > limit:
        raise PayloadTooLarge(f"body of {size} bytes is over the {limit}-byte limit")


def check_whole_body(headers: dict[bytes, bytes], body: bytes, limit: int) -> None:
    """:func:`read_body`'s checks for a body the server has already read whole: the same
    refusals (413) for the same bodies."""
    _check_declared_size(headers, limit)
    if len(body) > limit:
        raise PayloadTooLarge(f"body is over the {limit}-byte limit")


def check_whole_request(headers: dict[bytes, bytes], body: bytes, limit: int) -> None:
    """:func:`check_json_content_type`, :func:`count_hops` and :func:`check_whole_body`, in that
    order, in one call (the /reach lane's, on every call): the common request (JSON as almost
    every caller writes it, no hops, a Content-Length under the limit) in one frame, anything
    else through the checks themselves, for the same refusals."""
    if headers.get(b"content-type") != b"application/json":
        check_json_content_type(headers)
    if b"x-reach-hops" in headers:
        count_hops(headers)
    else:
        HOPS.set(0)
    declared = headers.get(b"content-length")
    # bytes.isdigit() is True of ASCII digits only (_check_declared_size's isascii() is for str)
    if declared is not None and not (declared.isdigit() and int(declared) <= limit):
        _check_declared_size(headers, limit)
    if len(body) > limit:
        raise PayloadTooLarge(f"body is over the {limit}-byte limit")


async def read_body(
    receive: Receive, headers: dict[bytes, bytes], limit: int, timeout_s: float | None = None
) -> bytes:
    """The whole request body, refusing (413) anything over ``limit`` bytes before reading it,
    and (408) a body that takes longer than ``timeout_s`` to arrive: a stalled client must not
    hold a request slot for as long as it likes."""
    _check_declared_size(headers, limit)
    if timeout_s is None:
        return await _read_body(receive, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(receive, limit)
    except TimeoutError as exc:
        raise BodyTimeout(f"the request body did not arrive within {timeout_s:g} s") from exc


def body_timeout(scope: Scope, timeout_s: float) -> float | None:
    """The body timeout to arm, or None when the server has already read the whole body.

    :class:`~reachmesh.server.h1.GuardedHttpTools` marks a request whose body is in
    (``reach.body_complete``): most requests arrive in one read, and a timer for each of them is
    measurable on the hot path.
    """
    return None if scope.get(BODY_COMPLETE) else timeout_s


async def _read_body(receive: Receive, limit: int) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise PayloadTooLarge(f"body is over the {limit}-byte limit")
        return body
    chunks = [body]
    received = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise PayloadTooLarge(f"body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


JSON_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\n"


def json_head(body: bytes, extra: list[tuple[bytes, bytes]] | None) -> bytes:
    """The header lines of a JSON answer of ``body``, each ending in CR LF, in the order and
    case the ASGI way writes them."""
    head = JSON_HEAD % len(body)
    if extra:
        head += b"".join([b"%s: %s\r\n" % pair for pair in extra])
    return head


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
    scope: Scope | None = None,
) -> None:
    """Send a complete JSON response: written whole when the server offers it (``scope``), else
    as the two ASGI messages."""
    whole = scope.get(WHOLE_ANSWER) if scope is not None else None
    if whole is not None and whole(status, json_head(body, extra), body):
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_body(code: str, message: str, **extra: Any) -> bytes:
    """The error shape of the registry and admin endpoints: ``{"error": {...}}``."""
    error: dict[str, Any] = {"code": code, "message": message}
    error.update({k: v for k, v in extra.items() if v is not None})
    return orjson.dumps({"error": error})
