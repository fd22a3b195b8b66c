"""The caller's side of a streamed answer (protocol §14): an event stream over raw ASGI.

:class:`EventSink` opens the ``text/event-stream`` response at the first chunk and writes each
chunk as one ``chunk`` event; a write waits while the caller's connection is backed up, which is
what slows the Router's read from the agent. :func:`serve_stream` runs the request beside a
watch on the caller's connection: when the caller goes away, the request is cancelled, which
closes the connection to the agent at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from reachmesh.dispatch.attempts import CALLER_GONE
from reachmesh.dispatch.results import Reply
from reachmesh.lifecycle import unless_first
from reachmesh.server.asgi import Receive, Scope, Send, send_json
from reachmesh.server.h1 import RawStream, raw_stream
from reachmesh.sse import accepts_event_stream, encode_event

_HEAD = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # Proxies that buffer (nginx) would hold the chunks back and defeat the point.
    (b"x-accel-buffering", b"no"),
]


def wants_stream(accept: bytes | None) -> bool:
    """Whether the caller's Accept asks for an event stream (and not with a weight of 0)."""
    return accepts_event_stream(accept)


_RAW_HEAD = b"".join([b"%s: %s\r\n" % pair for pair in _HEAD])
_CHUNK = b"event: chunk\ndata: "
_DONE = b"event: done\ndata: "
_END = b"\n\n"


class EventSink:
    """Chunks and the final ReachResponse as server-sent events on one response: written
    straight to the connection when the Router's own protocol serves it (:class:`.h1.RawStream`,
    every chunk read so far in one write), else through ASGI ``send``."""

    def __init__(self, send: Send, raw: RawStream | None = None) -> None:
        self._send = send
        self._raw = raw
        self.opened = False

    async def _open(self) -> None:
        self.opened = True
        if self._raw is not None and self._raw.start(200, _RAW_HEAD):
            return
        self._raw = None
        await self._send({"type": "http.response.start", "status": 200, "headers": _HEAD})

    async def send_chunks(self, data: list[bytes]) -> None:
        if not self.opened:
            await self._open()
        pieces: list[bytes] = []
        for value in data:
            pieces += (_CHUNK, value, _END)
        if self._raw is not None:
            await self._raw.write(pieces)
            return
        await self._send({"type": "http.response.body", "body": b"".join(pieces), "more_body": True})

    async def done(self, body: bytes) -> None:
        if not self.opened:
            await self._open()
        if self._raw is not None:
            self._raw.end([_DONE, body, _END])
            return
        event = encode_event("done", body)
        await self._send({"type": "http.response.body", "body": event, "more_body": False})


async def _caller_gone(receive: Receive) -> None:
    """Returns when the caller's connection is gone (the body has been read before)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def serve_stream(
    send: Send,
    receive: Receive,
    run: Callable[[EventSink], Awaitable[Reply]],
    on_error: Callable[[], Reply],
    scope: Scope | None = None,
) -> None:
    """Serve one streamed request: ``run`` relays its chunks to the sink and returns its ending.

    The ending is the ``done`` event once the stream is open, or when the request succeeded
    without a chunk; an error before any chunk is a plain JSON ReachResponse with its HTTP
    status, exactly as for a caller that asked for no stream. ``on_error`` is the answer for a
    bug in ``run`` (an internal error, still one ReachResponse).
    """
    sink = EventSink(send, raw_stream(scope) if scope is not None else None)
    work = asyncio.ensure_future(run(sink))
    watch = asyncio.ensure_future(_caller_gone(receive))
    # The caller going away stops the request, saying why (the attempt it cuts is recorded so);
    # this task cancelled stops it too: nobody is left to answer.
    watch.add_done_callback(lambda done: None if done.cancelled() else work.cancel(CALLER_GONE))
    await unless_first(work, watch)
    if work.cancelled():
        return
    try:
        status, body = work.result()
    except Exception:  # noqa: BLE001 - a bug: on_error logs it, and the caller still gets one answer
        status, body = on_error()
    if sink.opened or status == 200:
        await sink.done(body)
    else:
        await send_json(send, status, body)
