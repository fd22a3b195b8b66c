"""The events of an agent's streamed answer as the pieces of protocol §14.

A streaming agent answers ``text/event-stream``: ``chunk`` events, each one JSON value, then one
``done`` event whose data is an agent answer as in §6. An agent that answers plain JSON instead
is one :class:`Final` piece with ``plain`` set. The connection side (bounds on the stream's
bytes, its idle time and deadline, backpressure) is :mod:`.streamconn`'s; this module says what
each event is, and reads a whole event stream for a caller that asked for no stream.

Errors are the project's own: a broken or cut stream is :class:`BadAgentResponse` or
:class:`ConnectFailed`, an idle agent or the deadline :class:`AttemptTimeout`, the agent's own
error in its ``done`` the :class:`AgentRejected` family, exactly as for a plain answer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import pydantic_core

from reachmesh import jsoncodec
from reachmesh.exceptions import BadAgentResponse
from reachmesh.sse import RawEvent, RawSseParser, SseError, SseEvent, SseLimits
from reachmesh.transport.base import classify_answer
from reachmesh.transport.pieces import AgentStream, Chunk, Final, Piece, PlainStream, StreamBounds

if TYPE_CHECKING:
    from reachmesh.transport.a2a import StreamReading

EVENT_STREAM = "text/event-stream"


def checked_json(data: str) -> bytes:
    """:func:`checked_raw` of an event's decoded data."""
    return checked_raw(data.encode())


def checked_raw(raw: bytes, lines: int = 2) -> bytes:
    """An event's data as one line of JSON, passed on as the agent wrote it when it is valid.

    A large chunk is read first by pydantic-core's JSON reader (jiter: 6 us for 64 KiB of
    text, against orjson's 25-45 us, which made the check about a third of the Router's time
    on a large stream); it accepts exactly what orjson or the exact reader would, except a
    number past a double's range, which it reads as infinity: a value of a few nodes is looked
    over for one, and anything else (or anything jiter refuses) is left to the old way. That
    is orjson, UTF-8 included, then, for what orjson refuses (an integer past 64 bits, say),
    the exact reader, whose text is re-encoded. A data field of several lines is JSON with line
    breaks between tokens (a raw line break is never valid inside a JSON string), so a space
    stands for each; ``lines`` is 1 for a data field known to be one line (no look for breaks).
    """
    if len(raw) < _QUICK_FROM or not _quick_check(raw):
        return _checked_slowly(raw, lines)
    return raw if lines == 1 or b"\n" not in raw else raw.replace(b"\n", b" ")


def _checked_slowly(raw: bytes, lines: int) -> bytes:
    """:func:`checked_raw` for a text the quick reader did not take (small, or not its own)."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return jsoncodec.dumps(jsoncodec.loads(raw))
        except jsoncodec.JSONDecodeError as exc:
            raise BadAgentResponse(f"a chunk event's data is not JSON ({exc.msg})") from exc
    return raw if lines == 1 or b"\n" not in raw else raw.replace(b"\n", b" ")


# Below this many bytes orjson is as quick as jiter and needs no look for infinities.
_QUICK_FROM = 2048
# The most values of one chunk looked over for an infinity; past them, orjson decides.
_QUICK_NODES = 64
_INFINITIES = (math.inf, -math.inf)
# The values jiter reads that can never be an infinity.
_FINITE = frozenset({str, int, bool, type(None)})


def _quick_check(raw: bytes) -> bool:
    """Whether jiter reads ``raw`` as one JSON value of at most _QUICK_NODES values, none an
    infinity; False leaves the answer to orjson and the exact reader."""
    try:
        value = pydantic_core.from_json(raw, allow_inf_nan=False, cache_strings=False)
    except ValueError:
        return False
    kind = type(value)
    if kind in _FINITE:
        return True
    # A flat list of strings, integers, booleans and nulls (a common chunk) in one look.
    if kind is list and len(value) < _QUICK_NODES and _FINITE.issuperset(map(type, value)):
        return True
    return _finite(value)


def _finite(value: Any) -> bool:
    """Whether ``value`` has at most _QUICK_NODES values, none an infinity."""
    stack = [value]
    seen = 0
    while stack:
        seen += 1
        if seen > _QUICK_NODES:
            return False
        item = stack.pop()
        if isinstance(item, list):
            stack += item
        elif isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, float) and item in _INFINITIES:
            return False
    return True


def piece_of(event: SseEvent) -> Piece | None:
    """The piece an event carries, None for an event the protocol does not name (ignored)."""
    if event.event == "chunk":
        return Chunk(checked_json(event.data))
    if event.event == "done":
        return _final(event.data.encode())
    return None


def _final(raw: bytes) -> Final:
    """A done event's piece; the agent's error in its done raises here, as in §6."""
    try:
        answer = jsoncodec.loads(raw)
    except jsoncodec.JSONDecodeError:
        answer = None
    result = classify_answer(200, raw)
    return Final(result, isinstance(answer, dict) and "result" in answer)


def raw_piece(event: RawEvent) -> Piece | None:
    """:func:`piece_of` for an event read without decoding (the Router's relay)."""
    name, raw, lines = event
    if name == b"chunk":
        # checked_raw's work, in line for the common case: once per event of a large stream.
        if len(raw) < _QUICK_FROM or not _quick_check(raw):
            return Chunk(_checked_slowly(raw, lines))
        return Chunk(raw if lines == 1 or b"\n" not in raw else raw.replace(b"\n", b" "))
    if name == b"done":
        return _final(raw)
    return None


def a2a_piece(reading: StreamReading) -> Callable[[RawEvent], Piece | None]:
    """The pieces of an A2A agent's events, read as ``reading`` reads them."""

    def piece(event: RawEvent) -> Piece | None:
        try:
            decoded = SseEvent(event.event.decode(), event.data.decode())
        except UnicodeDecodeError as exc:
            raise BadAgentResponse(f"event stream: an event is not UTF-8 ({exc.reason})") from exc
        return reading.piece(decoded)

    return piece


__all__ = [
    "EVENT_STREAM",
    "AgentStream",
    "Chunk",
    "Final",
    "Piece",
    "PlainStream",
    "StreamBounds",
    "a2a_piece",
    "checked_raw",
    "gather",
    "looks_like_events",
    "piece_of",
    "raw_piece",
]


# The first bytes an event stream may start with; no JSON text starts with any of them, so an
# answer read whole can be told apart without its Content-Type (the pool keeps none).
_SSE_STARTS = (b"event:", b"data:", b":", b"id:", b"retry:", b"\xef\xbb\xbf")


def looks_like_events(status: int, body: bytes) -> bool:
    """Whether a whole 200 answer is an event stream rather than JSON."""
    return status == 200 and body.lstrip(b" \t\r\n")[:6].startswith(_SSE_STARTS)


# How much of a gathered stream is read between two turns of the event loop. Read in one go, an
# 8 MiB answer of empty lines or empty events (a microsecond a byte at worst) held the loop, and
# so every other request of the Router, for up to 15 s; a slice costs it a few milliseconds.
GATHER_SLICE = 16 * 1024


async def gather(body: bytes) -> list[Any]:
    """A whole event stream read by a caller that asked for no stream: its chunks' values, in
    order, once its done said SUCCESS; the agent's error in its done raises as in §6. Read a
    slice at a time, letting the loop run between slices."""
    size = len(body) + 1
    # The body was bounded as bytes (server.response_limit_bytes) before it got here: no bound
    # of the parser's is to end it, so its lines count no more than their bytes.
    parser = RawSseParser(SseLimits(max_line=size, max_event=size, max_total=size, line_charge=0))
    values: list[Any] = []
    for start in range(0, len(body), GATHER_SLICE):
        if start:
            await asyncio.sleep(0)
        fault: SseError | None = None
        try:
            events = parser.feed(body[start : start + GATHER_SLICE])
        except SseError as exc:
            # The events whole before the fault count, as the relay hands them out: whether a
            # done is read must not depend on where the slices fall.
            events, fault = exc.events, exc
        if _gathered(events, values):
            return values
        if fault is not None:
            raise BadAgentResponse(f"event stream: {fault}") from fault
    raise BadAgentResponse("the agent ended its event stream without a done event")


def _gathered(events: list[RawEvent], values: list[Any]) -> bool:
    """Add the chunks' values of ``events`` to ``values``; True at the done event."""
    for event in events:
        try:
            decoded = SseEvent(event.event.decode(), event.data.decode())
        except UnicodeDecodeError as exc:
            raise BadAgentResponse(f"event stream: the event stream is not UTF-8 ({exc.reason})") from exc
        piece = piece_of(decoded)
        if isinstance(piece, Chunk):
            values.append(piece.value)
        elif isinstance(piece, Final):
            return True
    return False
