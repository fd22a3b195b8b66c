"""A lean pooled HTTP/1.1 client for the one call on the hot path: POST an envelope, read the answer.

aiohttp's ``ClientSession.post`` took about 40 % of the Router's CPU per request (py-spy, c32):
request and response objects, header multidicts, a stream reader, payload wrappers and several
timers per call. This client does only what the Router's forwarding needs, on asyncio protocols
with httptools (the parser uvicorn already uses): one pre-encoded request head, one write, the
answer gathered whole in the protocol, one future per exchange and one timer per exchange.

Kept from the aiohttp path, on purpose and exactly:

- keep-alive connections pooled per (scheme, host, port), at most ``size`` open in all, at most
  ``per_agent`` to one (scheme, host, port) and at most ``connecting_per_agent`` being opened to
  one at once; past any of them a request waits, first come first served, until its attempt's
  ceiling (then :class:`PoolTimeout`): a burst of calls never becomes a burst of connects;
- the connect timeout (socket connect and TLS handshake), the read timeout (the gap between two
  reads of the answer, from the moment the request is written) and the attempt's hard ceiling;
- whole answers up to ``response_limit`` bytes, ``RESPONSE_TOO_LARGE`` past it, whether
  announced by Content-Length or found while reading (gzip/deflate answers counted on the wire
  and decoded); what an answer may be is :mod:`.answer`'s to say, bytes in and outcome out;
- the outbound URL guard at connect time: a literal address is checked, a name is checked and
  resolved, then every address the guard refuses is dropped;
- TLS (and mTLS) with the transport's one ``SSLContext``;
- URLs are parsed with yarl, aiohttp's own parser, so an endpoint aiohttp refused is refused.

Errors are mapped to the project's own (ConnectFailed, AttemptTimeout, BadAgentResponse) by the
caller, :class:`~reachmesh.transport.http.HttpTransport`; this module raises only those, the
standard library's ``OSError``/``ssl.SSLError``/``TimeoutError``, :mod:`.answer`'s errors and
the two classes below.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import select
import socket
import ssl
from typing import cast

import yarl

from reachmesh.exceptions import AgentRejected, OutboundRefused
from reachmesh.outbox import Outbox, outbox
from reachmesh.transport import dial
from reachmesh.transport.answer import (
    DEFAULT_HEAD,
    Answer,
    AnswerReader,
    BrokenBody,
    Disconnected,
    HeadLimits,
)
from reachmesh.transport.base import POOL_WAIT_S
from reachmesh.transport.dial import interleave
from reachmesh.transport.urlguard import UrlGuard

# An idle pooled connection older than this is closed instead of reused. It is under the 5 s
# that uvicorn and Node keep an idle connection by default: an agent that closes its end just as
# the Router writes a request on it leaves the request's outcome unknown, and a non-idempotent
# one is then never sent again (the caller gets NO_AVAILABLE_HANDLER). A closed connection seen
# before the write is only a reconnect; the race is at the agent's own timeout.
IDLE_S = 4.0
# Resolved names are kept this long (aiohttp's ttl_dns_cache of the session it replaces).
DNS_TTL_S = 60.0
# After a connect timed out to an agent that holds connections of ours, no new connect to it for
# this long: its accept queue is full (it is busy, not broken), so requests wait for the
# connections it has (about the kernel's first SYN retransmit, 1 s).
HOLD_OFF_S = 1.0
# A connect to an agent that serves connections of ours may take this long rather than the
# connect timeout: it is busy, not broken, and its accept queue is full only until it catches
# up. Linux sends a dropped SYN again after 1 s and again 2 s later; a connect timeout of 1 s
# cut each such connect just before its second SYN, and the hold-off after it stalled every
# request to the agent for a second (a 2,000-call burst reached its agent over 8 s, not 1.5).
BUSY_CONNECT_S = 3.5
# A connect timeout the event loop got to this much later than it was due says the loop itself
# was stalled (a healthy one is a millisecond late at most): the connect is tried again.
LATE_S = 0.05
# Below this size the request body is copied behind its head and written in one call.
_JOIN_LIMIT = 64 * 1024


# One header line, formatted in C (``map`` over the names and values): no Python frame per header.
_HEADER_LINE = "{}: {}\r\n".format


class ConnectTimeout(Exception):
    """No connection (or no TLS handshake) within the connect timeout; ``late_s``: how long after
    the timeout the Router's event loop got to it."""

    def __init__(self, late_s: float = 0.0) -> None:
        super().__init__(f"no connection within the connect timeout (noticed {late_s * 1000:.0f} ms late)")
        self.late_s = late_s


class PoolTimeout(Exception):
    """No connection of the pool came free before the attempt's ceiling; nothing was sent."""


class StaleConnection(Disconnected):
    """A kept-alive connection closed with no byte of an answer after the request was written:
    the agent may have read the request, so it is not sent again here (the caller decides)."""


class BadUrl(Exception):
    """An endpoint the client cannot use (it would not be a valid request target)."""


class BadHeader(ValueError):
    """A request header value that would split the request (a CR or LF in it); nothing is sent."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the request header {name!r} holds a line break")
        self.name = name


class ReadTimeout(TimeoutError):
    """The read timeout fired (the head not within it of the request, or a gap between two
    reads of the body): a plain ``TimeoutError`` is the attempt's ceiling."""


class _Target:
    """What is needed to reach one endpoint URL, parsed once and cached."""

    __slots__ = ("host", "key", "port", "request_line", "server_hostname", "tls")

    def __init__(self, url: str) -> None:
        try:
            parsed = yarl.URL(url)
            host = parsed.raw_host
            port = parsed.port
        except (ValueError, TypeError) as exc:
            raise BadUrl(type(exc).__name__) from exc
        if parsed.scheme not in ("http", "https") or not host or port is None:
            raise BadUrl("not an http(s) URL with a host")
        self.tls = parsed.scheme == "https"
        self.host = host
        self.port = port
        self.key = (parsed.scheme, host, port)
        self.server_hostname = parsed.host if self.tls else None
        # Host as aiohttp sends it: the port only when it is not the scheme's default.
        authority = parsed.host_port_subcomponent
        target = parsed.raw_path_qs or "/"
        self.request_line = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n".encode()


class _Conn(asyncio.Protocol):
    """One keep-alive connection: the socket side of the exchanges an :class:`AnswerReader` reads."""

    # One per call in flight in a burst: slots, not an instance dict, keep it small.
    __slots__ = (
        "_box",
        "_hard",
        "_head_due",
        "_held",
        "_last_read",
        "_loop",
        "_poller",
        "_pool",
        "_read_s",
        "_timer",
        "_timer_at",
        "_waiter",
        "closed",
        "exchanges",
        "idle_since",
        "key",
        "reader",
        "transport",
    )

    def __init__(
        self, pool: Pool, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop, head: HeadLimits
    ) -> None:
        self._pool = pool
        self.key = key
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reader = AnswerReader(head)
        self.exchanges = 0  # exchanges begun on this connection
        self._waiter: asyncio.Future[Answer] | None = None
        self._poller: select.poll | None = None  # for alive(), made at its first use
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when _timer fires
        self._last_read = 0.0
        self._head_due = 0.0
        self._read_s = 0.0
        self._hard = 0.0
        self._box: Outbox = outbox(loop)
        self._held: bytes | None = None  # a request written at the end of the loop's pass

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its interface.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes while idle: the agent broke the protocol; the connection cannot be reused.
            self._close()
            return
        self._last_read = self._loop.time()
        try:
            whole = self.reader.feed(data)
        except (BrokenBody, AgentRejected) as exc:
            self._fail(exc)
            return
        if whole:
            self._finish()

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)
        self._stop_timer()
        self.closed = True
        self._pool.forget(self)

    def _ended(self, exc: Exception | None) -> None:
        if self._waiter is None or self._waiter.done():
            return
        if self._held is not None:
            # The request was still held for the end of the turn: it never left, so it is a
            # connection that failed before sending (another agent may take it), not a stale one.
            self._held = None
            cut = ConnectionResetError(f"the agent closed the connection before the request left ({exc})")
            self._fail(cut)
            return
        if isinstance(exc, ssl.SSLError) and not self.reader.got_bytes and self.exchanges == 1:
            # On a connection's first exchange, a TLS error before any answer byte is the end of
            # its handshake (TLS 1.3 servers refuse a client certificate only after the client's
            # side is done). A reused connection had finished its handshake long ago: there the
            # error is a broken connection, as a reset would be.
            self._fail(exc)
            return
        why = exc or "connection closed"
        try:
            self.reader.eof(clean=exc is None)
        except Disconnected as cut:
            self._fail(Disconnected(f"{cut} ({why})"))
            return
        except BrokenBody as cut:
            self._fail(type(cut)(f"{cut} ({why})"))
            return
        except AgentRejected as cut:
            self._fail(cut)
            return
        self.closed = True  # a close-delimited answer: whole, and the connection is done
        self._finish()

    # -- one exchange -----------------------------------------------------------------------

    def exchange(
        self, data: bytes, body: bytes, limit: int, read_s: float, hard: float, now: float | None = None
    ) -> asyncio.Future[Answer]:
        """Write the request; the future of its whole answer (or the first error). Not a
        coroutine of its own (one fewer per attempt): the caller awaits the future, and when
        its wait ends before the answer (cancelled), the connection is done (see post).
        ``now``: the loop's time, when the caller has just read it."""
        loop = self._loop
        waiter: asyncio.Future[Answer] = loop.create_future()
        self._waiter = waiter
        self.exchanges += 1
        self.reader.start(limit)
        self._read_s = read_s
        self._hard = hard
        transport = self.transport
        assert transport is not None
        box = self._box
        # (A bytes object joined with an empty one is the same object, not a copy.)
        if len(body) >= _JOIN_LIMIT:
            transport.write(data)
            transport.write(body)
        elif box.inflight:
            # Other exchanges are under way: this request leaves with the pass's other writes.
            self._held = data + body
            box.hold(self, loop)
        else:
            transport.write(data + body)
        box.inflight += 1  # until post's wait ends
        if now is None:
            now = loop.time()
        self._last_read = now
        # The whole head within read_s of the request: an agent dripping header bytes cannot
        # hold the attempt open by re-arming the read timeout with each byte.
        head_due = self._head_due = now + read_s if now + read_s < hard else hard
        # A timer left by an earlier exchange that fires no later serves this one too (it re-arms
        # itself up to the real deadline): no timer made and cancelled per exchange.
        timer = self._timer
        if timer is None or self._timer_at > head_due:
            if timer is not None:
                timer.cancel()
            self._arm(head_due)
        return waiter

    def write_held(self) -> None:
        """Write the request held for the end of the pass (the outbox's call), unless the
        connection closed meanwhile: then it never left, and the exchange has failed."""
        data = self._held
        self._held = None
        transport = self.transport
        if data is not None and transport is not None and not transport.is_closing():
            transport.write(data)

    def _arm(self, due: float) -> None:
        self._timer = self._loop.call_at(due, self._on_timer)
        self._timer_at = due

    def _on_timer(self) -> None:
        # One timer per connection: re-armed lazily from the last read rather than reset on each,
        # and kept from one exchange to the next.
        self._timer = None
        if self._waiter is None:
            return  # idle since: the timer of an exchange that ended, its last firing
        # The head has one deadline; the body's is re-armed from each read.
        due = min(self._last_read + self._read_s, self._hard) if self.reader.head_done else self._head_due
        if self._loop.time() + 0.0005 < due:
            self._arm(due)
            return
        # Which deadline this was decides what the caller is told: the read timeout, or the
        # attempt's ceiling when it came first.
        self._fail(TimeoutError() if due >= self._hard else ReadTimeout())

    def _finish(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        reader = self.reader
        # reader.reusable, without the property's call (complete: what calls this was told so).
        reusable = not self.closed and reader.keep_alive and not reader.trailing
        answer = reader.answer()
        if reusable:
            self._waiter = None  # its timer stays, for the next exchange (see exchange)
            waiter.set_result(answer)
            # Pool.release(self), written out: once per exchange. With nobody waiting, for this
            # connection or (the pool full) for any, there is no one to wake.
            pool = self._pool
            self.idle_since = self._loop.time()
            idle = pool._idle.get(self.key)
            if idle is None:
                pool._idle[self.key] = [self]
            else:
                idle.append(self)
            if pool._waiting:
                pool.wake_for(self.key)
        else:
            self._reset()
            waiter.set_result(answer)
            self._close()

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self._reset()
        self._close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _reset(self) -> None:
        self._waiter = None
        self._stop_timer()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def alive(self) -> bool:
        """Whether an idle connection may carry a request: open, and nothing waiting to be read.

        An agent may close a kept-alive connection just after answering; its FIN (or stray bytes)
        can sit in the socket before the loop has run ``eof_received``. A readable idle socket is
        a dead one, as httpcore judges it too.
        """
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        poller = self._poller
        try:
            if poller is None:
                sock = self.transport.get_extra_info("socket")
                if sock is None:
                    return True
                # One poll object per connection, registered once: only poll(0) runs per reuse.
                poller = self._poller = select.poll()
                poller.register(sock.fileno(), select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def abort(self, why: str) -> None:
        """Close the connection from this side; an exchange under way fails. (Once this side
        closes, the loop reports an orderly end: a close-delimited body would pass for whole.)"""
        self._fail(BrokenBody(why) if self.reader.head_done else Disconnected(why))

    def _close(self) -> None:
        self._stop_timer()  # a closed connection is held by no timer
        self._held = None  # a request still held never leaves
        if not self.closed:
            self.closed = True
            self._pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class Pool:
    """Keep-alive connections per (scheme, host, port), at most ``size`` open in all."""

    def __init__(
        self,
        *,
        size: int,
        per_agent: int | None = None,
        connecting_per_agent: int = 32,
        response_limit: int,
        guard: UrlGuard,
        tls: ssl.SSLContext,
        user_agent: str,
        head: HeadLimits = DEFAULT_HEAD,
    ) -> None:
        self._size = size
        self._per_agent = per_agent or size
        self._connecting_cap = connecting_per_agent
        self._limit = response_limit
        self._head = head
        self._guard = guard
        self._ssl = tls
        self._ua = f"User-Agent: {user_agent}\r\nAccept: */*\r\n".encode()
        self._user_agent = user_agent.encode()
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._all: set[_Conn] = set()
        self._opening = 0
        self._open_to: dict[tuple[str, str, int], int] = {}  # connections in _all, per target
        self._connecting: dict[tuple[str, str, int], int] = {}  # being opened, per target
        self._hold_off: dict[tuple[str, str, int], float] = {}  # no new connect before, per target
        # Callers waiting for a connection to each target, first come first served.
        self._waiting: dict[tuple[str, str, int], collections.deque[asyncio.Future[None]]] = {}
        # Waiters woken for a target that have not run yet: what woke them is theirs, so a
        # newcomer queues behind them (first come first served) instead of taking it first.
        self._claims: dict[tuple[str, str, int], int] = {}
        self._targets: dict[str, _Target] = {}
        self._names: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._times = dial.ConnectTimes()
        self.resends = 0  # connects begun again after no answer (dropped SYNs)
        self._loop: asyncio.AbstractEventLoop | None = None
        # The buffer the loop reads a stream's bytes into (see streamconn.read_buffer): one per
        # pool, as a pool serves one loop, whose reads never overlap.
        self.read_buffer: memoryview | None = None

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], connect_s: float, read_s: float, total_s: float
    ) -> Answer:
        """POST ``body`` to ``url``: the status and the whole answer, within the limits."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()  # once: the loop's clock, read again below within the same call
        hard = now + total_s
        target = self._targets.get(url) or _target(self._targets, url)  # a known one without a call
        # Built in a function of its own: its pieces are gone before the (maybe long) wait.
        data = _request_head(target, self._ua, headers, len(body))
        # An idle connection (nobody waiting first) without _acquire's coroutine: keep-alive's case.
        # _queue_ahead(key) and _reuse(key, now) written out (the last idle one is alive).
        key, conn = target.key, None
        if not (self._waiting or self._claims) or not (self._waiting.get(key) or self._claims.get(key)):
            idle = self._idle.get(key)
            if idle:
                conn = idle.pop()
                if now - conn.idle_since >= IDLE_S or not conn.alive():
                    conn._close()
                    conn = self._reuse(key, now)
        if conn is None:
            conn = await self._acquire(target, connect_s, hard)
            now = loop.time()  # after the wait: the exchange's deadlines start from here
        reused = conn.idle_since > 0.0
        waiter = conn.exchange(data, body, self._limit, read_s, hard, now)
        try:
            try:
                return await waiter
            finally:
                conn._box.inflight -= 1
                if conn._waiter is waiter:
                    # Cancelled mid-exchange: the answer may still come, so the connection is done.
                    conn._reset()
                    conn._close()
        except Disconnected as exc:
            if reused and not conn.reader.got_bytes:
                # Closed after the request was written: the agent may have read it (and be running
                # it), so it is never silently sent again; the caller knows if it may be.
                raise StaleConnection(f"a kept-alive connection closed after the request ({exc})") from exc
            raise

    async def lease(
        self, url: str, headers: dict[str, str], length: int, connect_s: float, total_s: float
    ) -> tuple[_Conn, bytes]:
        """A connection to ``url`` for a streamed answer (:mod:`.streamconn`), taken under the
        same caps and in the same line as :meth:`post`, and the request's head for it (with no
        Accept of its own: ``headers`` names it). The stream runs its own protocol on the
        connection's transport; it gives the connection back with :meth:`release` once its
        answer was read whole and may be followed by another, and closes it otherwise."""
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        target = _target(self._targets, url)
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        if lines.count("\r") != len(headers) or lines.count("\n") != len(headers):
            raise BadHeader(next(n for n, v in headers.items() if "\r" in n + v or "\n" in n + v))
        head = b"%sUser-Agent: %s\r\n%sContent-Length: %d\r\n\r\n" % (
            target.request_line,
            self._user_agent,
            lines.encode(),
            length,
        )
        return await self._acquire(target, connect_s, loop.time() + total_s), head

    def _reuse(self, key: tuple[str, str, int], now: float) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_S and conn.alive():
                return conn
            conn._close()
        return None

    async def _acquire(self, target: _Target, connect_s: float, hard: float) -> _Conn:
        """An idle connection to ``target``, or a new one once the caps allow; FIFO waits."""
        loop = self._loop
        assert loop is not None
        key = target.key
        woken = False
        while True:
            if woken or not self._queue_ahead(key):  # a newcomer queues behind earlier waiters
                conn = self._reuse(key, loop.time())
                if conn is not None:
                    self._pass_on(key)
                    return conn
                if self._may_open(key):
                    try:
                        return await self._connect(target, connect_s, hard)
                    except ConnectTimeout as exc:
                        self._timed_out(key, exc)
                        woken = False
                        continue
                if self._target_room(key) and self._evict_one():
                    continue  # the pool was full of idle connections elsewhere: one made room
            await self._wait(key, hard, front=woken)
            woken = True

    def _queue_ahead(self, key: tuple[str, str, int]) -> bool:
        """Whether callers wait (or were woken and have not run) for ``key``: a newcomer is last."""
        return bool(self._waiting.get(key) or self._claims.get(key))

    def _pass_on(self, key: tuple[str, str, int]) -> None:
        """Once a caller took its connection (or connect slot): wake the next waiter if there is
        room for it too, since newcomers queue behind the woken ones."""
        if self._waiting.get(key) and (self._idle.get(key) or self._may_open(key)):
            self._wake(key)

    def _timed_out(self, key: tuple[str, str, int], exc: ConnectTimeout) -> None:
        """After a connect timed out: raise it, or return to try again or wait for a connection."""
        if exc.late_s >= LATE_S:
            # The loop noticed the timeout late: it was busy (a burst arriving), and polls for
            # I/O only after running due timers, so a connect the kernel had made may have been
            # cut unseen. That is the Router's own lag, not the agent's: connect again.
            return
        if not self._open_to.get(key):
            raise exc
        # It serves connections of ours, yet took no new one in time: busy, not broken. Wait for
        # one of its connections instead of failing.
        if key not in self._hold_off:
            assert self._loop is not None
            self._hold_off[key] = self._loop.time() + HOLD_OFF_S
            # Its connections may stay busy for long: the end of the hold-off must wake the
            # waiters by itself.
            self._loop.call_later(HOLD_OFF_S, self._wake_many, key)

    def _target_room(self, key: tuple[str, str, int]) -> bool:
        opened = self._open_to.get(key, 0) + self._connecting.get(key, 0)
        hold_off = self._hold_off.get(key)
        if hold_off is not None and opened:
            if self._loop is not None and self._loop.time() < hold_off:
                return False
            del self._hold_off[key]
        return opened < self._per_agent and self._connecting.get(key, 0) < self._connecting_cap

    def _may_open(self, key: tuple[str, str, int]) -> bool:
        return self._target_room(key) and len(self._all) + self._opening < self._size

    async def _wait(self, key: tuple[str, str, int], hard: float, *, front: bool) -> None:
        """Wait for a wake-up on ``key`` (a connection released, closed or made), until ``hard``."""
        loop = self._loop
        assert loop is not None
        room: asyncio.Future[None] = loop.create_future()
        queue = self._waiting.setdefault(key, collections.deque())
        if front:
            queue.appendleft(room)  # woken once already: it keeps its place
        else:
            queue.append(room)
        woke = False
        began = loop.time()
        try:
            async with asyncio.timeout_at(hard):
                await room
            woke = True
        except TimeoutError as exc:
            raise PoolTimeout(f"no connection to {key[1]}:{key[2]} came free in time") from exc
        finally:
            POOL_WAIT_S.set(POOL_WAIT_S.get() + loop.time() - began)
            if room.done() and not room.cancelled():
                self._unclaim(key)  # it runs now: newcomers need not wait for it any more
            if not woke:
                if room.done() and not room.cancelled():
                    # Woken just as it gave up (its timeout, or a cancellation): the wake-up is
                    # passed on, or the next waiter would sleep on a free connection.
                    self._wake(key)
                else:
                    room.cancel()
                    with contextlib.suppress(ValueError):
                        queue.remove(room)  # a newcomer must not queue behind a gone waiter
            if not queue and self._waiting.get(key) is queue:
                del self._waiting[key]

    async def _connect(self, target: _Target, connect_s: float, hard: float) -> _Conn:
        loop = self._loop
        assert loop is not None
        key = target.key
        busy = key in self._open_to
        connect_due = loop.time() + (max(connect_s, BUSY_CONNECT_S) if busy else connect_s)
        self._opening += 1
        self._connecting[key] = self._connecting.get(key, 0) + 1
        self._pass_on(key)
        try:
            async with asyncio.timeout_at(min(connect_due, hard)):
                return await self._open(target)
        except TimeoutError as exc:
            if connect_due < hard:
                raise ConnectTimeout(loop.time() - connect_due) from exc
            if busy:
                # Nothing was sent, and the agent serves connections of ours: the wait is the pool's.
                raise PoolTimeout(f"no connection to {key[1]}:{key[2]} was made in time (busy)") from exc
            raise  # the attempt's ceiling came first, not the connect timeout
        finally:
            self._opening -= 1
            left = self._connecting[key] - 1
            if left:
                self._connecting[key] = left
            else:
                del self._connecting[key]
            self._wake(key)  # a connect slot is free (and a failed one frees a connection's)

    async def _open(self, target: _Target) -> _Conn:
        addresses = await self._resolve(target.host, target.port)
        if len(addresses) == 1:
            return await self._dial(target, addresses[0])
        dial_one = lambda address: self._dial(target, address)  # noqa: E731
        assert self._loop is not None
        return await dial.race(self._loop, interleave(addresses), dial_one, _Conn._close)

    async def _dial(self, target: _Target, address: str) -> _Conn:
        loop = self._loop
        assert loop is not None
        while True:  # a connect unanswered for long is begun again (a dropped SYN: see .dial)
            began = loop.time()
            sock = await dial.connect(loop, address, target.port, self._times.resend_after(target.key))
            if sock is not None:
                break
            self.resends += 1
        self._times.learn(target.key, loop.time() - began, loop.time())
        transport, conn = await loop.create_connection(  # it owns sock from here, failed or not
            lambda: _Conn(self, target.key, loop, self._head),
            sock=sock,
            ssl=self._ssl if target.tls else None,
            server_hostname=target.server_hostname,
        )
        # uvloop may call connection_made after create_connection returns: take it from here.
        conn.transport = transport
        self._all.add(conn)
        self._open_to[target.key] = self._open_to.get(target.key, 0) + 1
        return conn

    async def _resolve(self, host: str, port: int) -> list[str]:
        """The addresses to try for ``host``, every one passed by the URL guard.

        Literal addresses and names are checked here too, not only at registration: with a
        shared registry, a profile can reach a Router's snapshot without passing its API.
        """
        bare = host[1:-1] if host.startswith("[") else host
        try:
            literal = ipaddress.ip_address(bare.split("%", 1)[0])
        except ValueError:
            try:
                self._guard.check_name(host)
            except OutboundRefused as exc:
                raise OSError(f"{host}: {exc.message}") from exc
        else:
            refusal = self._guard.refusal(literal)
            if refusal is not None:
                raise OSError(f"{host} {refusal}")
            return [bare]
        loop = self._loop
        assert loop is not None
        now = loop.time()
        cached = self._names.get((host, port))
        if cached is not None and cached[0] > now:
            found = cached[1]
        else:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
            if len(self._names) >= 4096:
                self._names.clear()
            self._names[(host, port)] = (now + DNS_TTL_S, found)
        return self._guard.allowed(host, found, str)

    def release(self, conn: _Conn) -> None:
        """Put a connection whose answer was read whole back in the pool."""
        conn.idle_since = self._loop.time() if self._loop is not None else 1.0
        self._idle.setdefault(conn.key, []).append(conn)
        self.wake_for(conn.key)

    def wake_for(self, key: tuple[str, str, int]) -> None:
        """A connection to ``key`` is idle again: wake its next waiter (only if one waits)."""
        if not (key in self._waiting and self._wake(key)) and len(self._all) + self._opening >= self._size:
            self._wake_any()  # the pool is full: a waiter elsewhere may close this idle one

    def forget(self, conn: _Conn) -> None:
        """A connection closed: it is no longer pooled, and its slot is free."""
        if conn in self._all:
            self._all.discard(conn)
            key = conn.key
            left = self._open_to.get(key, 1) - 1
            if left > 0:
                self._open_to[key] = left
            else:
                self._open_to.pop(key, None)
            idle = self._idle.get(key)
            if idle and conn in idle:
                idle.remove(conn)
            if not self._wake(key):
                self._wake_any()  # a slot of the global cap is free: someone elsewhere may use it

    def _wake(self, key: tuple[str, str, int]) -> bool:
        """Wake the first live waiter for ``key``; False when there was none."""
        queue = self._waiting.get(key)
        while queue:
            room = queue.popleft()
            if not room.done():
                room.set_result(None)
                self._claims[key] = self._claims.get(key, 0) + 1
                if not queue:
                    del self._waiting[key]
                return True
        if queue is not None:
            del self._waiting[key]
        return False

    def _unclaim(self, key: tuple[str, str, int]) -> None:
        left = self._claims.get(key, 0) - 1
        if left > 0:
            self._claims[key] = left
        else:
            self._claims.pop(key, None)

    def _wake_many(self, key: tuple[str, str, int]) -> None:
        """Wake as many waiters for ``key`` as may open a connection at once."""
        for _ in range(self._connecting_cap):
            if not self._wake(key):
                return

    def _wake_any(self) -> None:
        for key in list(self._waiting):
            if self._target_room(key) and self._wake(key):
                return

    def _evict_one(self) -> bool:
        """Close the longest-idle connection (to any target); False when none is idle."""
        oldest: _Conn | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        oldest._close()
        return True

    def close(self) -> None:
        """Close every connection, idle or busy (a busy one's caller gets an error, never the
        part of its answer read so far)."""
        for conn in list(self._all):
            conn.abort("the Router closed its connections (shutting down)")
        self._all.clear()
        self._idle.clear()
        self._open_to.clear()
        self._hold_off.clear()
        self._claims.clear()
        self._names.clear()
        self._times.forget()
        for queue in self._waiting.values():
            for room in queue:
                if not room.done():
                    room.set_result(None)
        self._waiting.clear()


def _target(targets: dict[str, _Target], url: str) -> _Target:
    """The parsed ``url``, kept in ``targets``."""
    target = targets.get(url)
    if target is None:
        target = _Target(url)
        if len(targets) >= 4096:
            # Endpoints come from the registry; this bounds the cache if they churn.
            targets.clear()
        targets[url] = target
    return target


def _request_head(target: _Target, agent_lines: bytes, headers: dict[str, str], length: int) -> bytes:
    """The request's head, whole (``agent_lines``: the pool's own User-Agent and Accept lines);
    BadHeader for a name or value with a line break in it."""
    # The header lines in one join and one encode; each line ends in the one CR LF added
    # here, so any other line break (or another separator splitlines() knows) makes one line
    # more, found in C instead of by two tests per header; the loop then names a CR or LF.
    lines = "".join(map(_HEADER_LINE, headers.keys(), headers.values()))
    if len(lines.splitlines()) != len(headers):
        for name, value in headers.items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
                raise BadHeader(name)
    return b"%s%s%sContent-Length: %d\r\n\r\n" % (target.request_line, agent_lines, lines.encode(), length)


__all__ = [
    "BadHeader",
    "BadUrl",
    "ConnectTimeout",
    "Pool",
    "PoolTimeout",
    "ReadTimeout",
    "StaleConnection",
    "interleave",
]
