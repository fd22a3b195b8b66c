"""The HTTP/1.1 protocol in front of the Router: httptools, with limits on a request's head.

uvicorn's httptools protocol reads headers of any size for as long as the client likes (50
unfinished 8 MB heads would hold 400 MB), so this subclass bounds the head of every request,
before the ASGI app sees it:

- at most ``max_header_bytes`` of request line and headers (431 above it), counted both as bytes
  arrive (a head that never ends) and, once the head is whole, from its request line and header
  lines (a whole head that arrives in one read: the byte count alone is reset when the head
  completes within a read);
- at most ``max_headers`` header lines (431), counted as the parser hands over each line, so the
  lines kept until the head is whole are bounded by their number and by the bytes read;
- the head complete within ``header_timeout_seconds`` of its first byte, or of the connection
  (408), so a connection that trickles bytes is closed;
- a chunked body's framing and trailer lines (what follows the head and is not body) at most
  ``max_header_bytes`` and ``body_limit_bytes`` together (431): httptools keeps an unfinished
  trailer line whole, so an endless one would grow the Router's memory without a bound.

The body has its own timeout in the app (:func:`reachmesh.server.asgi.read_body`), and idle
keep-alive connections close after uvicorn's ``timeout_keep_alive``.

It also sends each response head and its body in one write (:class:`_OneWrite`): uvicorn writes
them separately, which would be two system calls per response on the hot path. A ``/reach``
answer, whole when it is sent, skips uvicorn's two ``send`` messages altogether
(:func:`whole_answer`, offered to the app in the request's scope).

A ``POST /reach`` whose whole body arrives with its head takes a lane past uvicorn's cycle
altogether: the app's ``serve_whole`` gets the scope, headers and body, and :func:`_serve_lane`
writes the answer (see "the lane" below for what takes it and what does not).

It relies on uvicorn's private ``HttpToolsProtocol``; pyproject.toml pins uvicorn below its next
minor release, and tests/server/test_h1_uvicorn_contract.py names each part relied on.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from itertools import chain
from typing import Any

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from reachmesh.config import ServerPolicy
from reachmesh.outbox import outbox
from reachmesh.server.asgi import BODY_COMPLETE, JSON_HEAD, WHOLE_ANSWER, LaneAnswer, Scope, json_head

log = logging.getLogger("uvicorn.error")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _OneWrite:
    """The connection's transport as uvicorn's response cycle sees it: a write is held back
    until the next write on it, or until the end of the event loop's turn, whichever comes
    first, so a response head and its body leave in one ``write``. A lane answer may be held
    to the end of the turn too, with the turn's other writes (:mod:`reachmesh.outbox`).
    Nothing is reordered (a held write goes out before anything else written or closed) and
    nothing waits longer than the turn in which it was written."""

    __slots__ = ("_box", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._box = outbox(loop)

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._held = None
            self._transport.write(held + data)

    def hold(self, data: bytes) -> None:
        """Write ``data`` at the end of the loop's turn, with the turn's other held writes."""
        held = self._held
        if held is None:
            self._held = data
            self._box.hold(self, self._loop)
        else:
            self._held = held + data  # already due to leave this turn: once, in order

    def write_now(self, data: bytes) -> None:
        """Write ``data`` at once (nothing may be held: :meth:`flush` first)."""
        self._transport.write(data)

    def flush(self) -> None:
        """What is held leaves now, if anyone is left to read it (also the outbox's call at
        the end of the turn)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    write_held = flush

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, ...) is the transport's own.
        return getattr(self._transport, name)


def whole_answer(
    one_write: _OneWrite, cycle: RequestResponseCycle, status: int, head: bytes, body: bytes
) -> bool:
    """Write a whole response (``head``: its header lines, each ending in CR LF, without the
    status line, the server's default headers or the blank line) in one write, as uvicorn's
    ``http.response.start`` and ``http.response.body`` would, and end the cycle as they would.

    False, with nothing written, when uvicorn's own ``send`` must do it: it would wait for a
    paused transport, write an access-log line, or refuse a response already started.
    """
    if cycle.disconnected:
        return True  # uvicorn's send drops it too: nobody is left to read it
    if cycle.response_started or cycle.access_log or cycle.flow.write_paused:
        return False
    data = _start_response(cycle, status, head, body)  # the head block and the body in one format
    if one_write._box.inflight and cycle.keep_alive:
        # Other calls wait on agents: this answer leaves with the turn's other writes.
        one_write.hold(data)
    else:
        # A response still held by the one-write wrapper (a pipelined one) leaves first.
        if one_write._held is not None:
            one_write.flush()
        one_write.write_now(data)
    _end_response(one_write, cycle)
    return True


def _start_response(cycle: RequestResponseCycle, status: int, head: bytes, body: bytes = b"") -> bytes:
    """Mark ``cycle``'s response started, as uvicorn's ``send`` would, and return its head block:
    the status line, the server's default headers, ``head``, ``connection: close`` when the
    connection ends with it, and the blank line; then ``body``, if given (one format, no copy)."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    default = cycle.default_headers
    known, lines = _default_lines
    if default is not known:
        lines = _default_block(default)
    close = b"" if cycle.keep_alive else b"connection: close\r\n"
    return b"%s%s%s%s\r\n%s" % (STATUS_LINE[status], lines, head, close, body)


def _default_block(default: list[tuple[bytes, bytes]]) -> bytes:
    """The server's default header lines, written out, and kept for as long as ``default`` is the
    server's list: uvicorn makes a new one once a second (the date)."""
    global _default_lines
    lines = b"".join([b"%s: %s\r\n" % pair for pair in default]) if default else b""
    _default_lines = (default, lines)
    return lines


# The server's default headers last written out (the list itself, held: never another's id).
_default_lines: tuple[Any, bytes] = (None, b"")


def _end_response(one_write: _OneWrite, cycle: RequestResponseCycle) -> None:
    """End ``cycle``'s response once its last bytes are written, as uvicorn's ``send`` would."""
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        one_write.close()
    cycle.on_response()


class RawStream:
    """A streamed (chunked) response written straight to the connection, for the SSE relay.

    Through uvicorn's ``send``, each body is joined with its chunk framing and then, by the
    one-write wrapper, with the next one: two copies of every chunk and a loop callback per
    write. Here each write is one ``writelines`` of the pieces given (no copy in Python), the
    head goes out with the first write, and a write waits, as ``send`` does, while the caller's
    side is backed up. The cycle is started and ended as uvicorn's ``send`` would.
    """

    __slots__ = ("_cycle", "_head", "_one_write")

    def __init__(self, one_write: _OneWrite, cycle: RequestResponseCycle) -> None:
        self._one_write = one_write
        self._cycle = cycle
        self._head = b""

    def start(self, status: int, head: bytes) -> bool:
        """Begin the response (``head``: its header lines, each ending in CR LF); False, with
        nothing done, when uvicorn's own ``send`` must do it (see :func:`whole_answer`)."""
        cycle = self._cycle
        if cycle.response_started or cycle.access_log or cycle.disconnected:
            return False
        cycle.chunked_encoding = True
        self._head = _start_response(cycle, status, head + b"transfer-encoding: chunked\r\n")
        return True

    async def write(self, pieces: list[bytes]) -> None:
        """Write one chunk of the body made of ``pieces``; waits while the caller is behind."""
        cycle = self._cycle
        if cycle.disconnected:
            return  # as uvicorn's send: nobody is left to read it
        size = sum(map(len, pieces))
        self._send([self._head, b"%x\r\n" % size, *pieces, b"\r\n"])
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()

    def end(self, pieces: list[bytes]) -> None:
        """Write the last chunk of the body made of ``pieces``, and end the response."""
        cycle = self._cycle
        if cycle.disconnected or cycle.response_complete:
            return
        size = sum(map(len, pieces))
        self._send([self._head, b"%x\r\n" % size, *pieces, b"\r\n0\r\n\r\n"])
        _end_response(self._one_write, cycle)

    def _send(self, pieces: list[bytes]) -> None:
        self._head = b""
        self._one_write.flush()  # anything held leaves first
        self._one_write.writelines(pieces)


def raw_stream(scope: Any) -> RawStream | None:
    """The :class:`RawStream` of a request this protocol serves, None for any other server."""
    whole = scope.get(WHOLE_ANSWER)
    if isinstance(whole, partial) and whole.func is whole_answer:
        return RawStream(*whole.args)
    return None


def joined_fields(pairs: list[tuple[bytes, bytes]], headers: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``headers`` (``pairs`` as a dict: of a repeated name, the last value) with a repeated
    ``Accept`` read as one field, its values joined with ", " (RFC 9110 §5.3): a caller that
    sends ``Accept: text/event-stream`` and ``Accept: application/json`` asks for both. Only a
    length compare when no name repeats, as on almost every request."""
    if len(headers) == len(pairs):
        return headers
    accepts = [value for name, value in pairs if name == b"accept"]
    if len(accepts) > 1:
        headers[b"accept"] = b", ".join(accepts)
    return headers


class _NoWaiter:
    """The body signal of a lane cycle: nobody waits for a body the lane already holds."""

    __slots__ = ()

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return True


_NO_WAITER = _NoWaiter()


class _LaneCycle:
    """The request/response cycle of a POST /reach served by the lane (:class:`GuardedHttpTools`):
    the parts of uvicorn's cycle that its protocol and :func:`whole_answer` read and write,
    without the ASGI ``receive`` and ``send`` it never uses. Constant parts are the class's."""

    access_log = False
    disconnected = False
    message_event = _NO_WAITER
    task: asyncio.Task[None] | None = None  # the task serving it (told when the caller leaves)
    response_complete = False
    response_started = False
    waiting_for_100_continue = False

    # Set per call by GuardedHttpTools.on_message_complete on an instance made by _bare_cycle: no
    # __init__, whose Python frame would run once per call for four stores.
    default_headers: list[tuple[bytes, bytes]]  # the server's, as the call began
    flow: FlowControl  # the connection's
    keep_alive: bool
    on_response: Callable[[], None]  # the protocol's on_response_complete


_bare_cycle = object.__new__


# The scope key under which the app names the task serving a call that uvicorn's cycle runs (the
# lane's cycle holds its own): the one to stop when the caller's connection closes.
CALL_TASK = "reach.call_task"

# What a lane request's scope says beyond what uvicorn's on_message_begin put there (the
# request line, as uvicorn's on_headers_complete would; the body is whole), in one update.
_LANE_SCOPE: dict[str, Any] = {
    "method": "POST",
    "path": "/reach",
    "raw_path": b"/reach",
    "query_string": b"",
    BODY_COMPLETE: True,
}

# "Internal Server Error", as uvicorn answers an application that raised.
_ERROR_500 = b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"


async def _serve_lane(
    serve: Callable[[Scope, dict[bytes, bytes], bytes], Awaitable[LaneAnswer]],
    one_write: _OneWrite,
    cycle: _LaneCycle,
    scope: Scope,
    headers: dict[bytes, bytes],
    body: bytes,
) -> None:
    """Answer one lane request: the app's answer in one write, after a paused transport
    drains, then what the app does after it; a bug in the app answers 500 and closes, as
    uvicorn does."""
    after = None
    try:
        # The request as three arguments, not a tuple made and unpacked per call.
        (status, answer, extra), after = await serve(scope, headers, body)
        head = JSON_HEAD % len(answer) if extra is None else json_head(answer, extra)
    except Exception:
        log.exception("Exception in ASGI application")
        cycle.keep_alive = False
        status, head, answer = 500, _ERROR_500, b"Internal Server Error"
    try:
        # whole_answer(), _start_response() and _end_response() written out for the lane's own
        # cycle, which no one else starts, never logs access and nobody waits on (no event).
        flow = cycle.flow
        while flow.write_paused and not cycle.disconnected:
            await flow.drain()
        if not cycle.disconnected:  # else nobody is left to read it, as uvicorn's send drops it
            cycle.response_started = True
            keep_alive = cycle.keep_alive
            default = cycle.default_headers
            known, lines = _default_lines
            if default is not known:
                lines = _default_block(default)
            close = b"" if keep_alive else b"connection: close\r\n"
            data = b"%s%s%s%s\r\n%s" % (STATUS_LINE[status], lines, head, close, answer)
            if keep_alive and one_write._box.inflight:
                one_write.hold(data)  # other calls wait on agents: it leaves with the turn's writes
            else:
                if one_write._held is not None:  # a held response leaves first
                    one_write.flush()
                one_write._transport.write(data)
            cycle.response_complete = True
            if not keep_alive:
                one_write.close()
            cycle.on_response()
    finally:
        if after is not None:
            after(one_write._loop)


class _LeanEvent(asyncio.Event):
    """An ``asyncio.Event`` whose waiters are a list. uvicorn makes two per connection (its
    write flow control's, and each request's body signal), each with a deque of 624 bytes,
    though one task at most ever waits on either: a burst holds one connection per call."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters = []  # type: ignore[assignment]


class GuardedHttpTools(HttpToolsProtocol):
    """httptools with a bounded request head; the limits are class attributes (:func:`bounded_protocol`)."""

    max_header_bytes = 64 * 1024
    max_headers = 100
    header_timeout_s = 10.0
    body_limit_bytes = 1024 * 1024

    # Slots: uvicorn's protocol keeps its own state in an instance dict, which these seven more
    # would grow to a larger table, 1.6 KB per connection (a burst holds one per call in flight).
    __slots__ = (
        "_cap_head_bytes",
        "_cap_headers",
        "_gone_app",
        "_head_bytes",
        "_head_timer",
        "_idle_since",
        "_lane",
        "_lane_app",
        "_one_write",
        "_read_bytes",
        "_reading_head",
        "_refused",
        "_tail",
        "_tail_cap",
        "_trusted",
    )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # The class's limits, read by on_header for every header line: a slot is read at once,
        # a class attribute through the instance is looked up past it (unspecialised in 3.11).
        self._cap_headers = self.max_headers
        self._cap_head_bytes = self.max_header_bytes
        self._head_bytes = 0
        self._read_bytes = 0
        # A message's bytes after its head that are not body: chunk framing and trailer lines.
        # httptools keeps an unfinished trailer line whole, so they are bounded too, as a
        # head and a body are together.
        self._tail = 0
        self._tail_cap = self.max_header_bytes + self.body_limit_bytes
        self._reading_head = True
        self._refused = False
        self._idle_since: float | None = None  # when the last response ended, while idle since
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.header_timeout_s, self._head_too_slow
        )
        self._one_write = _OneWrite(transport, self.loop)
        self._lane: tuple[dict[bytes, bytes], list[bytes]] | None = None
        self._find_lane()
        writable = _LeanEvent()
        if self.flow._is_writable_event.is_set():
            writable.set()
        self.flow._is_writable_event = writable

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and self._gone_app is not None:
            # The caller left mid-request: the app stops the call it runs for it (it would
            # otherwise go on, and fail over, for nobody). Once per connection, not per call.
            # The lane's cycle holds its task; uvicorn's has the scope the app named it in.
            task = getattr(cycle, "task", None) or getattr(cycle, "scope", {}).get(CALL_TASK)
            if task is not None:
                self._gone_app.callers_gone((task,))
        super().connection_lost(exc)
        self._idle_since = None
        if self.timeout_keep_alive_task is not None:  # a closed connection is held by no timer
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    # uvicorn's own writes and closes that bypass the response cycle's transport: an answer
    # still held for the end of the turn leaves before them.

    def send_400_response(self, msg: str) -> None:
        self._one_write.flush()
        super().send_400_response(msg)

    def shutdown(self) -> None:
        self._one_write.flush()
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self._one_write.flush()
        super().timeout_keep_alive_handler()

    def eof_received(self) -> None:
        # The caller's FIN: uvicorn's answer (None) has the transport close itself. uvloop reads
        # it between the turn that held an answer and the outbox's write at the end of it.
        self._one_write.flush()
        super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_head:
            self._head_bytes += len(data)
            super().data_received(data)
        else:
            self._read_bytes = len(data)  # a read a head may begin in (see on_headers_complete)
            # Counted whole: a message that begins in it starts its count afresh, and its body
            # is taken off (on_body).
            self._tail += len(data)
            super().data_received(data)
            if self._tail > self._tail_cap and not self._refused:
                self._refuse(431, f"the request's chunk framing and trailers are over {self._tail_cap} bytes")
                return
        if self._lane is not None:
            self._leave_lane()  # the body is still coming: uvicorn's cycle reads the rest
        if self._reading_head and not self._refused:
            # Still in the head after taking every byte so far: all of them were head bytes.
            if self._head_bytes > self.max_header_bytes:
                self._refuse_head_size()
            elif self._head_timer is None:
                # A head begun in this read and not finished in it (a timer still unarmed: an
                # earlier read would have armed it). Armed here, not as each head begins: most
                # heads end in the read that began them, and a timer made and cancelled per
                # request was work for nothing.
                self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._lane = None
        self._reading_head = True
        self._tail = 0
        # The head's timer is armed by data_received if the head outlasts this read.

    def on_header(self, name: bytes, value: bytes) -> None:
        # The lines so far are the headers kept (uvicorn empties the list per request): no
        # counter of its own to keep per line. Past the cap the request is refused, and each
        # further line is refused again (a no-op) rather than kept: the list stays bounded.
        headers = self.headers
        if len(headers) >= self._cap_headers:
            self._refuse(431, f"more than {self.max_headers} request headers")
            return
        # uvicorn's own on_header, written out: it runs for every header of every request. Its
        # 100-continue flag is set once the head is whole, from the list (_asgi_head), not
        # tested per line here: the lane takes no request with an Expect header. The head's
        # size is summed once it is whole (on_headers_complete): until then the lines kept are
        # bounded by their number and by the bytes read (data_received).
        headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        # The head lies within the read it began in and those counted since (_head_bytes): a
        # read that began with no head under way is the last one kept in _read_bytes, and one
        # that began within this head was counted. Only when those could be over the cap is the
        # head's own size summed.
        cap = self._cap_head_bytes
        if self._head_bytes + self._read_bytes > cap and self._head_size() > cap:
            self._refuse_head_size()
            return
        self._reading_head = False
        # A head that begins later in this read lies in bytes this one's count included: the
        # read's rest is carried to the next head's bound (a read that begins between heads
        # replaces it), so a head begun behind another within one read is not left uncounted.
        self._read_bytes += self._head_bytes
        self._head_bytes = 0
        if self._head_timer is not None:  # _disarm(): most heads end in the read that began them
            self._disarm()
        headers = self._lane_headers()
        if headers is not None:
            self._lane = (headers, [])  # served once the whole body is here (or left)
            return
        self._asgi_head()

    def _head_size(self) -> int:
        """The whole head's size: the request line ("METHOD URL HTTP/1.1\r\n"), each "Name:
        value\r\n" (lower-casing keeps a name's length), and the blank line."""
        lines = self.headers
        size = len(self.parser.get_method()) + len(self.url) + 14
        return size + sum(map(len, chain.from_iterable(lines))) + 4 * len(lines)

    def _asgi_head(self) -> None:
        """uvicorn's cycle for the request, with the one-write transport and the whole answer."""
        for name, value in self.headers:  # uvicorn's on_header's flag (see on_header)
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            cycle.transport = self._one_write  # type: ignore[assignment]
            if not cycle.message_event.is_set():  # nothing can have set it yet; never lose a set
                cycle.message_event = _LeanEvent()
            self.scope[WHOLE_ANSWER] = partial(whole_answer, self._one_write, cycle)  # type: ignore[literal-required]

    def on_body(self, body: bytes) -> None:
        if self._lane is not None:
            self._lane[1].append(body)
        elif not self._refused:
            self._tail -= len(body)
            super().on_body(body)

    def on_message_complete(self) -> None:
        lane = self._lane
        if lane is None:
            if not self._refused:
                # The app need not arm a body timer for a body that is already here.
                self.scope[BODY_COMPLETE] = True  # type: ignore[literal-required]
                super().on_message_complete()
            return
        # A lane request, whole: served here (a method of its own was a frame per call).
        headers, chunks = lane
        self._lane = None
        body = b"".join(chunks)  # a single chunk is returned as it is, not copied
        scope = self.scope
        scope.update(_LANE_SCOPE)  # type: ignore[typeddict-item]
        # The lane cycle's four parts (see _LaneCycle).
        cycle: _LaneCycle = _bare_cycle(_LaneCycle)
        cycle.default_headers = self.server_state.default_headers
        cycle.flow = self.flow
        cycle.keep_alive = self.parser.should_keep_alive()
        cycle.on_response = self.on_response_complete
        self.cycle = cycle  # type: ignore[assignment]
        serve = self._lane_app.serve_whole  # type: ignore[union-attr]
        run = _serve_lane(serve, self._one_write, cycle, scope, headers, body)  # type: ignore[arg-type]
        if self.config.reset_contextvars:
            task = self.loop.create_task(run, context=contextvars.Context())
        else:
            task = self.loop.create_task(run)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        cycle.task = task

    def on_response_complete(self) -> None:
        # uvicorn's own, written out but for its keep-alive timer: uvicorn makes one per response
        # and cancels it at the next request's first bytes (a timer made and cancelled per call,
        # about 2 us here); this keeps one per connection, which re-arms itself while requests
        # come (see _keep_alive_due). The idle connection still closes timeout_keep_alive
        # seconds after its last response.
        self.server_state.total_requests += 1
        # The next head starts counting at its first byte (on_message_begin); until then the
        # client may still be sending the rest of a body the app already refused. A head already
        # under way (pipelined behind this answer) keeps its count: its bound reads it.
        if not self._reading_head:
            self._head_bytes = 0
        if self.transport.is_closing():
            return
        flow = self.flow
        if flow.read_paused:  # resume_reading()'s own test: its call only when there is work
            flow.resume_reading()
        if self.pipeline:  # a pipelined request waited behind this one: it runs now
            self._idle_since = None
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls it as each read arrives: the connection is no longer idle. Its timer
        # stays, and finds that out when it fires.
        self._idle_since = None

    def _keep_alive_due(self) -> None:
        """The keep-alive timer: close the connection if it has been idle for the whole
        timeout, else wait for the rest of it (or, busy, for the next response to arm it)."""
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0.001:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
            return
        self.timeout_keep_alive_handler()

    # -- the lane: a POST /reach whose whole body arrives with its head -----------------------
    #
    # Most calls arrive in one read. Such a call is handed to the app's ``serve_whole`` with its
    # body, and its answer written whole: no ASGI cycle, ``receive``, ``send``, middleware or
    # dispatch on the path. Anything else (a stream, a body still coming, a pipelined request
    # behind one in flight, a proxy's forwarded headers) takes uvicorn's way, unchanged.

    def _find_lane(self) -> None:
        """The app with a lane, if it has one, behind uvicorn's proxy-headers middleware or not
        (a reference, not its bound methods: a connection waiting for its body stays small)."""
        app = self.app
        self._trusted = None
        if isinstance(app, ProxyHeadersMiddleware):
            self._trusted = app.trusted_hosts
            app = app.app
        # What rules the lane out for every request of the connection (a root path, an access
        # log, a concurrency limit: the server's settings) is read here once, not per request.
        lane = hasattr(app, "serve_whole") and not (
            self.root_path or self.access_log or self.limit_concurrency is not None
        )
        self._lane_app = app if lane else None
        self._gone_app = _gone_listener(self.app)

    def _lane_headers(self) -> dict[bytes, bytes] | None:
        """The request's headers when it may take the lane, else None."""
        app, cycle, parser = self._lane_app, self.cycle, self.parser
        if (
            app is None
            or self.url != b"/reach"
            or (cycle is not None and not cycle.response_complete)
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
        ):
            return None
        pairs = self.headers
        headers = dict(pairs)
        if len(headers) != len(pairs):  # a name repeated: Accept's fields are one list
            joined_fields(pairs, headers)
        # An Expect header (100-continue: uvicorn's way answers it), or an Accept the app says
        # asks for a stream (no Accept asks for none: the app is not asked).
        if b"expect" in headers or (b"accept" in headers and not app.takes_whole(headers)):
            return None
        # The headers first: two dict lookups, where the trusted-host test is a Python call.
        if (b"x-forwarded-for" in headers or b"x-forwarded-proto" in headers) and self._trusted is not None:
            client = self.client
            if client is not None and client[0] in self._trusted:
                return None  # the middleware would change the request's client: let it
        return headers

    def _leave_lane(self) -> None:
        """A lane request whose body did not come whole with its head: uvicorn's way after all."""
        assert self._lane is not None
        chunks = self._lane[1]
        self._lane = None
        if self._refused or self.transport.is_closing():
            return  # refused, or a parse error answered 400
        self._asgi_head()
        for chunk in chunks:
            super().on_body(chunk)

    def _refuse_head_size(self) -> None:
        self._refuse(431, f"request headers are over {self.max_header_bytes} bytes")

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._reading_head:
            self._refuse(408, f"request headers not complete within {self.header_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a short text and close: the app never sees the request."""
        self._refused = True
        self._disarm()
        self._one_write.flush()  # a response still held goes out first
        if self.transport.is_closing():
            return
        body = message.encode()
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
        head += b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        head += b"content-length: %d\r\n\r\n" % len(body)
        self.transport.write(head + body)
        self.transport.close()


def _gone_listener(app: Any) -> Any:
    """The app that is told when a connection closes mid-request (``callers_gone``), found
    behind the wrappers it may be served in (uvicorn's proxy headers, the A2A export)."""
    for _ in range(4):
        if app is None or hasattr(app, "callers_gone"):
            return app
        app = getattr(app, "app", None) or getattr(app, "router", None)
    return None


def bounded_protocol(policy: ServerPolicy) -> type[GuardedHttpTools]:
    """The protocol class with ``policy``'s limits."""
    attrs: dict[str, Any] = {
        "max_header_bytes": policy.max_header_bytes,
        "max_headers": policy.max_headers,
        "header_timeout_s": policy.header_timeout_seconds,
        "body_limit_bytes": policy.body_limit_bytes,
    }
    return type("ReachHttpProtocol", (GuardedHttpTools,), attrs)
