"""An agent's answer read as a stream of pieces (protocol §14), one piece per ``next()``.

A streaming agent answers ``text/event-stream``: ``chunk`` events, each one JSON value, then one
``done`` event whose data is an agent answer as in §6. An agent that answers plain JSON instead
is one :class:`Final` piece with ``plain`` set. Every read is bounded: the stream's bytes, line
and event sizes (:mod:`.sse`), the idle time between two reads and the request's deadline. The
answer is read as the caller consumes it, never gathered: the HTTP client's buffer is bounded,
so a slow caller slows the read from the agent.

Errors are the project's own: a broken or cut stream is :class:`BadAgentResponse` or
:class:`ConnectFailed`, an idle agent or the deadline :class:`AttemptTimeout`, the agent's own
error in its ``done`` the :class:`AgentRejected` family, exactly as for a plain answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from reachmesh import jsoncodec
from reachmesh.exceptions import AttemptTimeout, BadAgentResponse, ConnectFailed
from reachmesh.sse import SseError, SseEvent, SseLimits, SseParser
from reachmesh.transport.base import classify_answer, too_large
from reachmesh.transport.pieces import AgentStream, Chunk, Final, Piece, PlainStream, StreamBounds

EVENT_STREAM = "text/event-stream"


def checked_json(data: str) -> bytes:
    """An event's data as one line of JSON, passed on as the agent wrote it when it is valid.

    Checked with orjson first (microseconds for 64 KiB; the exact reader's scan for long
    integers took 3 ms); only what orjson refuses (an integer past 64 bits, say) goes through
    the exact reader, and is re-encoded. A data field of several lines is JSON with line
    breaks between tokens (a raw line break is never valid inside a JSON string), so a space
    stands for each.
    """
    raw = data.encode()
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return jsoncodec.dumps(jsoncodec.loads(raw))
        except jsoncodec.JSONDecodeError as exc:
            raise BadAgentResponse(f"a chunk event's data is not JSON ({exc.msg})") from exc
    return raw.replace(b"\n", b" ") if b"\n" in raw else raw


def piece_of(event: SseEvent) -> Piece | None:
    """The piece an event carries, None for an event the protocol does not name (ignored)."""
    if event.event == "chunk":
        return Chunk(checked_json(event.data))
    if event.event == "done":
        raw = event.data.encode()
        try:
            answer = jsoncodec.loads(raw)
        except jsoncodec.JSONDecodeError:
            answer = None
        result = classify_answer(200, raw)  # the agent's error in its done raises here, as in §6
        return Final(result, isinstance(answer, dict) and "result" in answer)
    return None


class HttpAgentStream:
    """The event stream of one aiohttp response."""

    plain = False

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        bounds: StreamBounds,
        read: Callable[[SseEvent], Piece | None] = piece_of,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """``read`` makes an event a piece (:func:`piece_of` for a Reach agent's events);
        ``on_close`` runs once when the stream closes (the pool slot it held is given back)."""
        self._response = response
        self._bounds = bounds
        self._read_event = read
        self._on_close = on_close
        self._parser = SseParser(bounds.sse)
        self._pending: deque[SseEvent] = deque()
        self._finished = False

    async def next(self) -> Piece:
        if self._finished:
            raise BadAgentResponse("the stream was read past its done event")
        while True:
            while not self._pending:
                data = await self._read()
                if not data:
                    try:
                        self._parser.eof()
                    except SseError as exc:
                        raise BadAgentResponse(f"event stream: {exc}") from exc
                    raise BadAgentResponse("the agent ended its event stream without a done event")
                try:
                    self._pending.extend(self._parser.feed(data))
                except SseError as exc:
                    raise BadAgentResponse(f"event stream: {exc}") from exc
            piece = self._read_event(self._pending.popleft())
            if piece is not None:
                if isinstance(piece, Final):
                    self._finished = True
                return piece

    async def _read(self) -> bytes:
        loop = asyncio.get_running_loop()
        due = min(loop.time() + self._bounds.idle_s, self._bounds.deadline)
        try:
            async with asyncio.timeout_at(due):
                return await self._response.content.readany()
        except TimeoutError as exc:
            idle_ms = self._bounds.idle_s * 1000
            waited = "the deadline" if due >= self._bounds.deadline else f"{idle_ms:.0f} ms"
            raise AttemptTimeout(f"no event from the agent within {waited}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectFailed(f"the event stream broke: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        if self._finished and self._response.content.at_eof():
            self._response.release()  # read to its end: the connection may carry another call
        else:
            # close(), not release(): the rest of a stream nobody wants is never read.
            self._response.close()


async def read_plain(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """A plain answer's whole body, at most ``limit`` bytes (RESPONSE_TOO_LARGE past it)."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise too_large(f"the agent's answer of {declared} bytes is over the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    while True:
        data = await response.content.readany()
        if not data:
            return b"".join(parts)
        size += len(data)
        if size > limit:
            raise too_large(f"the agent's answer is over the {limit}-byte limit")
        parts.append(data)


__all__ = [
    "EVENT_STREAM",
    "AgentStream",
    "Chunk",
    "Final",
    "HttpAgentStream",
    "Piece",
    "PlainStream",
    "StreamBounds",
    "gather",
    "looks_like_events",
    "piece_of",
    "read_plain",
]


# The first bytes an event stream may start with; no JSON text starts with any of them, so an
# answer read whole can be told apart without its Content-Type (the pool keeps none).
_SSE_STARTS = (b"event:", b"data:", b":", b"id:", b"retry:", b"\xef\xbb\xbf")


def looks_like_events(status: int, body: bytes) -> bool:
    """Whether a whole 200 answer is an event stream rather than JSON."""
    return status == 200 and body.lstrip(b" \t\r\n")[:6].startswith(_SSE_STARTS)


def gather(body: bytes) -> list[Any]:
    """A whole event stream read by a caller that asked for no stream: its chunks' values, in
    order, once its done said SUCCESS; the agent's error in its done raises as in §6."""
    size = len(body) + 1
    parser = SseParser(SseLimits(max_line=size, max_event=size, max_total=size))
    try:
        events = parser.feed(body)
    except SseError as exc:
        raise BadAgentResponse(f"event stream: {exc}") from exc
    values: list[Any] = []
    for event in events:
        piece = piece_of(event)
        if isinstance(piece, Chunk):
            values.append(piece.value)
        elif isinstance(piece, Final):
            return values
    raise BadAgentResponse("the agent ended its event stream without a done event")
