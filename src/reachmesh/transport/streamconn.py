"""A streamed answer (protocol §14) read on one of the lean pool's connections.

The stream takes a pooled connection (:meth:`.pool.Pool.lease`: the same caps, the same line,
the URL guard and TLS of a plain call) and runs its own protocol on the connection's transport
for as long as the agent talks. The answer's head is read by the pool's
:class:`~.answer.AnswerReader` (its bounds, interim answers and errors); the body's bytes are
kept as they arrive and fed to the event-stream parser only when the relay asks for the next
piece, so a slow caller slows the read: past ``HIGH_WATER`` bytes not asked for yet while the
relay is busy writing, reading from the agent pauses (its writes then stop in its own socket),
and a read takes no more than keeps the stream within ``READ_BUFFER`` (512 KiB) bytes, or
``WAITED_READ`` (2 MiB) while the relay waits for them (they go out to the caller at once): a stream
holds at most that and one open line (the parser's bound).

The loop reads the stream into one buffer shared by every stream of the pool
(:func:`read_buffer`) and each read is parsed before the next can start, its body's bytes
copied out once by the HTTP parser: the loop's own reads would copy every byte one more time.

Each wait for bytes is bounded by the idle time between reads and by the deadline. A stream
read to its end on a connection the agent keeps alive goes back to the pool; any other is
closed at once: a stream nobody wants is never drained.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from reachmesh.exceptions import AgentRejected, AttemptError, AttemptTimeout, BadAgentResponse, ConnectFailed
from reachmesh.sse import RawEvent, RawSseParser, SseError
from reachmesh.transport import pool as lean
from reachmesh.transport.answer import AnswerReader, BrokenBody, Disconnected, HeadLimits, HeadTooLarge
from reachmesh.transport.pieces import Final, Piece, StreamBounds

# Body bytes read from the agent and not yet asked for, past which reading pauses while the relay
# is busy writing (see LeanAgentStream._keep). A few of an
# agent's writes: enough to keep the relay busy while the next read is under way, little per
# stream beside 500 others.
HIGH_WATER = 256 * 1024
# An event stream's body is bounded by its parser (the stream's total), not by the plain limit.
_UNBOUNDED = 1 << 62
EVENT_STREAM = b"text/event-stream"
# The most bytes one read takes from the agent's socket, and the most a stream holds (reads
# are cut to what keeps it within this). Reads this large took a third less of the Router's CPU
# per MiB than the loop's own 256 KiB ones (fewer wakeups, parser calls and writes per MiB).
READ_BUFFER = 512 * 1024
# The most one read takes, and the stream holds, while the relay waits for the agent's bytes: the
# relay is not behind (its last write to the caller went out), and what the read brings goes to
# the caller in this turn of the loop. Each read costs a pause and a resume of reading (the read
# loop would otherwise go on reading), a write to the caller and the wakeups of both ends, about
# as much of the Router's CPU as the bytes of a 1 MiB read: reads of up to 1 MiB took 12-15 %
# less of it per MiB than reads of 512 KiB, and reads of up to 2 MiB 8-12 % less again (most of
# it kernel time). The relay, busy with a caller that is behind, still reads at most READ_BUFFER.
WAITED_READ = 2048 * 1024
_MIN_READ = 64 * 1024
# What the parser reads between two turns of the loop: PARSE_STEPS lines (or whole events, or
# runs of idle lines), the rest waiting for the next turn. A whole read of empty events
# (``data:\n\n``, a microsecond a byte) held the loop, and every other request of the Router,
# half a second per read; this holds it a few milliseconds. The cost is per line, not per byte:
# a read of kilobyte chunks (a few hundred events) is still parsed in one turn.
PARSE_STEPS = 4096


def read_buffer(pool: lean.Pool) -> memoryview:
    """The buffer the pool's streams read into. One read is parsed (and what is kept, copied
    out) before the loop starts the next, and a pool serves one loop (one thread), so its
    streams can share it: 500 streams share one buffer."""
    buffer = pool.read_buffer
    if buffer is None:
        buffer = pool.read_buffer = memoryview(bytearray(WAITED_READ))
    return buffer


class _StreamReader(AnswerReader):
    """The pool's answer reader, which also keeps the answer's Content-Type and hands its body
    over as it arrives (:meth:`take`) instead of gathering it."""

    __slots__ = ("content_type", "events")

    def __init__(self, head: HeadLimits, plain_limit: int) -> None:
        super().__init__(head)
        self.content_type = b""
        self.events = False  # a 200 text/event-stream answer
        self.start(plain_limit)

    @property
    def encoding(self) -> bytes | None:
        return self._encoding

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status >= 200:
            kind = self.content_type.partition(b";")[0].strip().lower()
            self.events = status == 200 and kind == EVENT_STREAM
            if self.events:
                self.limit = _UNBOUNDED
        else:
            self.content_type = b""  # an interim answer's
        super().on_headers_complete()

    def feed_body(self, data: memoryview) -> bool:
        """:meth:`feed` for bytes read after the final head, as a view of the read buffer (the
        HTTP parser copies the body out of it); True once the answer is whole."""
        if self.complete:
            self.trailing = True
            return True
        self._parse(data)
        if self._headers > self._max_headers:  # trailer lines, bounded per read (see feed)
            raise HeadTooLarge(f"the answer has over {self._max_headers} header lines")
        return self.complete

    def take(self) -> list[bytes]:
        """The body's bytes read since the last take."""
        chunks = self._chunks
        if chunks:
            self._chunks = []
        return chunks


def head_error(exc: BaseException) -> BaseException:
    """The project's error for a failure up to the answer's head (nothing relayed yet)."""
    if isinstance(exc, HeadTooLarge):
        return BadAgentResponse(f"answer head refused: {exc}")
    if isinstance(exc, BrokenBody):
        return BadAgentResponse(f"broken response body: {exc}")
    if isinstance(exc, Disconnected | OSError):
        # The stream's request is sent once per attempt: a cut before any answer is a
        # connection failure the attempt loop may retry on the same agent.
        return ConnectFailed(f"ServerDisconnected: {exc}")
    return exc


def body_error(exc: BaseException) -> BaseException:
    """The project's error for a failure of the stream's body."""
    if isinstance(exc, AgentRejected):
        return exc
    return ConnectFailed(f"the event stream broke: {type(exc).__name__}: {exc}")


class LeanAgentStream(asyncio.BufferedProtocol):
    """One agent's streamed answer on a pooled connection: the (buffered) protocol of its
    transport while the stream runs, and the :class:`~.pieces.AgentStream` the relay reads."""

    plain = False

    def __init__(
        self,
        pool: lean.Pool,
        conn: lean._Conn,
        bounds: StreamBounds,
        read: Callable[[RawEvent], Piece | None],
        head: HeadLimits,
    ) -> None:
        self._pool = pool
        self._conn = conn
        transport = conn.transport
        assert transport is not None
        self._transport = transport
        self._bounds = bounds
        self._read_event = read
        self._loop = asyncio.get_running_loop()
        self._buffer = read_buffer(pool)
        self.reader = _StreamReader(head, bounds.plain_limit)
        self._parser = RawSseParser(bounds.sse)
        self._body: list[bytes] = []  # read, not yet fed to the parser
        self._offset = 0  # how much of _body[0] was fed already (a budget ended inside it)
        self._buffered = 0
        self._paused = False
        self._pending: deque[RawEvent] = deque()
        self._complete = False  # the body ended as HTTP says it ends
        self._error: BaseException | None = None  # the connection's failure, raised in turn
        self._later: AttemptError | None = None  # an error found by ready(), for next()
        self._malformed: BadAgentResponse | None = None  # the parser's fault, after its events
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False  # the done event was handed out
        self._lost = False
        self._released = False

    # -- asyncio.BufferedProtocol -------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        # A read takes at most what keeps the stream within READ_BUFFER bytes held (WAITED_READ
        # while the relay waits for them), and reading pauses past HIGH_WATER while the relay is
        # busy: a stream holds at most READ_BUFFER bytes while its caller is behind.
        held = WAITED_READ if self._waiter is not None else READ_BUFFER
        return self._buffer[: max(held - self._buffered, _MIN_READ)]

    def buffer_updated(self, nbytes: int) -> None:
        read = self._buffer[:nbytes]
        if not self.reader.head_done:
            self.data_received(bytes(read))  # the head's bounds read its lines from bytes
            return
        # The HTTP parser copies the body's bytes out of the shared buffer; nothing keeps a view.
        try:
            self._complete = self.reader.feed_body(read)
        except (BrokenBody, AgentRejected) as exc:
            self._fail(exc)  # after the events read before the fault in this read, kept below
        self._keep()

    def data_received(self, data: bytes) -> None:
        try:
            self._complete = self.reader.feed(data)
        except (BrokenBody, AgentRejected) as exc:
            self._fail(exc)  # after the events read before the fault in this read, kept below
        self._keep()

    def _keep(self) -> None:
        """Keep the body's bytes just read for the relay; pause reading when it is behind."""
        body = self.reader.take()
        if body:
            self._body += body
            buffered = self._buffered = self._buffered + sum(map(len, body))
            # Reading pauses past HIGH_WATER while the relay is busy elsewhere (a caller that is
            # behind): a relay waiting for these bytes takes them in this turn of the loop, and
            # pausing for it (two epoll changes per read) would cost without holding anything
            # back, unless the next read would be too small to be worth it. A plain answer is
            # read whole within its own limit: nothing would resume a pause for it.
            if (
                buffered > HIGH_WATER
                and not self._paused
                and self.reader.events
                and (self._waiter is None or buffered > WAITED_READ - _MIN_READ)
            ):
                self._paused = True
                self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)
        self._lost = True
        self._conn.connection_lost(exc)  # the pool forgets the connection: its room is free

    def _ended(self, exc: Exception | None) -> None:
        if not self._complete and self._error is None:
            try:
                self._complete = self.reader.eof(clean=exc is None)
            except (Disconnected, BrokenBody) as cut:
                self._fail(cut if exc is None else type(cut)(f"{cut} ({exc})"))
                return
            except AgentRejected as cut:
                self._fail(cut)
                return
            self._body += self.reader.take()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, due: float) -> None:
        """Until something happens on the connection, or ``due``."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiter = waiter
        timer = self._loop.call_at(due, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    # -- the exchange ---------------------------------------------------------------------------

    async def open(self, request: bytes, body: bytes, due: float) -> None:
        """Write the request and wait for the answer's head until ``due``; raises the
        project's errors (the head's bounds, a cut, the timeout)."""
        transport = self._transport
        transport.set_protocol(self)
        self._conn.exchanges += 1  # a TLS error on its next exchange is a broken connection, not a handshake
        if transport.is_closing():  # closed by the agent since the pool handed it over
            self._lost = True
            raise ConnectFailed("ServerDisconnected: the kept-alive connection closed before the request")
        transport.write(request + body if len(body) < 65536 else request)
        if len(body) >= 65536:
            transport.write(body)
        reader = self.reader
        while not reader.head_done:
            if self._error is not None:
                raise head_error(self._error) from self._error
            if self._lost:
                raise ConnectFailed("ServerDisconnected: the connection closed before the answer's head")
            if self._loop.time() >= due:
                raise TimeoutError
            await self._wait(due)

    async def whole(self) -> bytes:
        """The rest of a plain (not event-stream) answer, within its limit and the deadline."""
        while not self._complete:
            if self._error is not None:
                raise body_error(self._error) from self._error
            if self._loop.time() >= self._bounds.deadline:
                raise AttemptTimeout("the agent's answer did not arrive within the deadline")
            await self._wait(self._bounds.deadline)
        body, self._body = self._body, []
        return body[0] if len(body) == 1 else b"".join(body)

    async def next(self) -> Piece:
        if self._later is not None:
            later, self._later = self._later, None
            raise later
        if self._finished:
            raise BadAgentResponse("the stream was read past its done event")
        while True:
            while not self._pending:
                await self._more()
            piece = self._piece(self._pending.popleft())
            if piece is not None:
                return piece
            if not self._pending and self._body:
                await asyncio.sleep(0)  # PARSE_STEPS of events nobody reads: the loop runs first

    def ready(self) -> list[Piece]:
        """The pieces already read, up to and with the done event, without waiting; an error
        found on the way is raised by the next :meth:`next`, after these."""
        pieces: list[Piece] = []
        sliced = False  # one parse a call: the loop runs before the next (see PARSE_STEPS)
        try:
            while self._later is None and not self._finished:
                if not self._pending:
                    if sliced or not self._parse():
                        break
                    sliced = True
                pending, read = self._pending, self._read_event
                while pending and not self._finished:
                    piece = read(pending.popleft())  # _piece's work, in line: once per event
                    if piece is not None:
                        if isinstance(piece, Final):
                            self._finished = True
                        pieces.append(piece)
        except AttemptError as exc:
            self._later = exc
        return pieces

    def _piece(self, event: RawEvent) -> Piece | None:
        piece = self._read_event(event)
        if isinstance(piece, Final):
            self._finished = True
        return piece

    async def _more(self) -> None:
        """Feed the parser what was read; else raise the stream's end or failure, or wait."""
        if self._parse():
            return
        if self._malformed is not None:
            raise self._malformed
        if self._error is not None:
            raise body_error(self._error) from self._error
        if self._complete or self._lost:
            try:
                self._parser.eof()
            except SseError as exc:
                raise BadAgentResponse(f"event stream: {exc}") from exc
            raise BadAgentResponse("the agent ended its event stream without a done event")
        bounds = self._bounds
        due = min(self._loop.time() + bounds.idle_s, bounds.deadline)
        await self._wait(due)
        if not self._body and self._error is None and not self._complete and self._loop.time() >= due:
            waited = "the deadline" if due >= bounds.deadline else f"{bounds.idle_s * 1000:.0f} ms"
            raise AttemptTimeout(f"no event from the agent within {waited}")

    def _parse(self) -> bool:
        """Feed the parser the bytes read so far, PARSE_STEPS steps of it at most (the rest
        waits for the next call); False when there were none."""
        body = self._body
        if not body or self._malformed is not None:
            return False
        parser, pending = self._parser, self._pending
        steps = PARSE_STEPS
        try:
            while body and steps:
                part = body[0]
                events, stop, steps = parser.feed_some(part, self._offset, steps)
                pending.extend(events)
                self._buffered -= stop - self._offset
                if stop < len(part):
                    self._offset = stop
                    break
                del body[0]
                self._offset = 0
        except SseError as exc:
            # The events whole before the fault are handed out first, as for a fault of the
            # HTTP body: a chunk (or the done) sent before it must not be lost or not depending
            # on whether the fault came in the same read. Nothing after it is read.
            pending.extend(exc.events)
            self._malformed = BadAgentResponse(f"event stream: {exc}")
            self._malformed.__cause__ = exc
        if self._paused and not self._lost and self._buffered <= HIGH_WATER:
            self._paused = False
            self._transport.resume_reading()
        return True

    async def aclose(self) -> None:
        """Give the connection back when the answer was read to its end and the agent keeps it
        alive; close it at once otherwise."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        whole = self._complete and self.reader.reusable and not self._lost and self._error is None
        if whole and not self._body and (self._finished or not self.reader.events):
            if self._paused:
                self._transport.resume_reading()
            self._transport.set_protocol(conn)
            self._pool.release(conn)
        else:
            conn.abort("the Router closed the stream")
