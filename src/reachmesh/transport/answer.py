"""Reading one agent answer from bytes: no sockets, no clock, so every rule is testable alone.

:class:`AnswerReader` is fed the bytes of a connection as they arrive and says when one whole
answer has been read. It enforces every bound on what an agent sends back, as the bytes arrive:

- the head (interim ``1xx`` heads included): total bytes, header lines per message, the length
  of one line; an endless header is refused once it passes the bound, never parsed whole;
- interim answers (``100 Continue``, ``103 Early Hints``) are read and skipped, never taken for
  the answer; ``101 Switching Protocols`` is an error (the Router asked for no upgrade);
- the body: its bytes on the wire (compressed or not) and, for gzip/deflate, its inflated size,
  both at most ``limit``; inflated piece by piece, so a compression bomb never sits in memory;
- a body that ends early (a reset or a close before its length, its last chunk, or the end of its
  compressed stream) is broken, never taken as whole.

Whether the connection may carry another exchange is decided here too (:attr:`reusable`): only
when the answer ended cleanly, keep-alive was promised, and nothing followed it.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import httptools

from reachmesh.exceptions import AgentRejected
from reachmesh.transport.base import too_large

# The answer headers read, by lower-case name.
_READ = {b"content-length": 0, b"transfer-encoding": 1, b"content-encoding": 2, b"retry-after": 3}
# The inflated output asked of zlib per step: small enough that a bomb is caught early.
_INFLATE_STEP = 256 * 1024


class BrokenBody(Exception):
    """The answer's body was cut off, malformed, or not decodable."""


class Disconnected(Exception):
    """The agent closed the connection before a complete answer head arrived."""


class HeadTooLarge(BrokenBody):
    """The answer's head is over one of its bounds (bytes, header lines, line length)."""


class HeadLimits(NamedTuple):
    """Bounds on an answer's head: all heads' bytes, header lines per head, one line's bytes."""

    max_bytes: int = 32 * 1024
    max_headers: int = 100
    max_line: int = 8190


DEFAULT_HEAD = HeadLimits()


class Answer(NamedTuple):
    """One whole answer: its status, its (decoded) body and its ``Retry-After`` value, if any."""

    status: int
    body: bytes
    retry_after: bytes | None


_new_tuple = tuple.__new__


class AnswerReader:
    """The answers read from one connection, one exchange at a time (``start`` each)."""

    # One per pooled connection, and a burst holds one connection per call in flight.
    __slots__ = (
        "_chunked",
        "_chunks",
        "_decoder",
        "_encoding",
        "_head_bytes",
        "_headers",
        "_inflated",
        "_length",
        "_line",
        "_line_room",
        "_max_bytes",
        "_max_headers",
        "_max_line",
        "_parser",
        "_wire",
        "complete",
        "got_bytes",
        "head_done",
        "keep_alive",
        "limit",
        "retry_after",
        "started",
        "status",
        "trailing",
    )

    def __init__(self, head: HeadLimits) -> None:
        # Plain ints, not the tuple's fields: on_header reads them for every header line.
        self._max_bytes, self._max_headers, self._max_line = head
        self._line_room = self._max_line - 2  # a header line's name and value, without ": "
        self._parser = httptools.HttpResponseParser(self)
        self.limit = 0
        self.started = False  # an exchange is under way
        self.got_bytes = False  # any byte of this exchange's answer arrived
        self.head_done = False  # the final (non-1xx) head is complete
        self.complete = False
        self.keep_alive = False
        self.trailing = False  # bytes followed the answer: the connection is not reusable
        self._reset_message()
        self._head_bytes = 0
        self._line = 0
        self._chunks: list[bytes] = []
        self._wire = 0
        self._inflated = 0
        self._decoder: zlib._Decompress | None = None

    def _reset_message(self) -> None:
        self.status = 0
        self._headers = 0
        self._length: int | None = None
        self._chunked = False
        self._encoding: bytes | None = None
        self.retry_after: bytes | None = None

    def start(self, limit: int) -> None:
        """A new exchange: its answer may be at most ``limit`` bytes (on the wire and decoded)."""
        self.limit = limit
        self.started = True
        self.got_bytes = self.head_done = self.complete = self.trailing = self._chunked = False
        # _reset_message(), written out: once per exchange.
        self.status = self._headers = self._head_bytes = self._line = self._wire = 0
        if self._encoding is not None:  # only a compressed body sets the decoder's state
            self._decoder = None
            self._inflated = 0
        self._length = self._encoding = self.retry_after = None
        self._chunks = []

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry another exchange after this whole answer."""
        return self.complete and self.keep_alive and not self.trailing

    # -- feeding -----------------------------------------------------------------------------

    def feed(self, data: bytes) -> bool:
        """Parse bytes of the answer; True once it is whole. Raises on any broken bound."""
        if self.complete:
            self.trailing = True
            return True
        self.got_bytes = True
        if not self.head_done:
            room = self._max_bytes - self._head_bytes
            part = data if len(data) <= room else data[:room]
            self._head_bytes += len(part)
            # _parse(part), written out: head and body almost always come in this one read.
            try:
                self._parser.feed_data(part)
            except httptools.HttpParserError as exc:
                self._parse_error(exc)
            if not self.head_done and not self._head_read(part):  # a head done needs no call
                return False
            if part is data:
                return self.complete  # the whole read was parsed: no empty slice and test
            data = data[len(part) :]
        if data:
            self._parse(data)  # bytes after a whole answer only mark it ``trailing``
            if self._headers > self._max_headers:  # trailer lines (see on_message_complete)
                raise HeadTooLarge(f"the answer has over {self._max_headers} header lines")
        return self.complete

    def _head_read(self, part: bytes) -> bool:
        """Whether the final head is in; raises once the head, still open, is past a bound.

        A line that ended within ``part`` was measured by on_header; the line still open at its
        end is measured here, across reads, so an endless line is cut at the bound."""
        if self.head_done:
            return True
        newline = part.rfind(b"\n")
        self._line = self._line + len(part) if newline < 0 else len(part) - newline - 1
        if self._line > self._max_line:
            raise HeadTooLarge(f"an answer header line is over {self._max_line} bytes")
        if self._head_bytes >= self._max_bytes:
            raise HeadTooLarge(f"the answer's head is over {self._max_bytes} bytes")
        return False

    def eof(self, clean: bool) -> bool:
        """The connection ended (``clean``: an orderly close, not a reset); True if the answer is
        whole, else it raises what the cut amounts to."""
        if self.complete:
            return True
        if not self.head_done:
            raise Disconnected("the agent closed the connection before its answer's head")
        if clean and self._length is None and not self._chunked:
            # A close-delimited body ends where an orderly close does; a reset cuts it off.
            self._end_body()
            self.complete = True
            return True
        raise BrokenBody("the answer's body was cut off")

    def answer(self) -> Answer:
        """The whole answer read (after ``feed`` or ``eof`` said True); ends the exchange."""
        body = b"".join(self._chunks)  # a single chunk is returned as it is, not copied
        self._chunks = []
        self.started = False
        # tuple.__new__, not Answer(...): the NamedTuple's __new__ is a Python frame per answer.
        return _new_tuple(Answer, (self.status, body, self.retry_after))

    def _parse(self, data: bytes | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._parse_error(exc)

    def _parse_error(self, exc: httptools.HttpParserError) -> None:
        """What a parser error in ``feed_data`` amounts to (raised, unless the answer stands)."""
        if self.complete:
            self.trailing = True  # bytes after a whole answer: it stands, the connection goes
            return
        cause = exc.__context__
        if isinstance(exc, httptools.HttpParserCallbackError) and isinstance(
            cause, BrokenBody | AgentRejected
        ):
            raise cause from None
        if isinstance(exc, httptools.HttpParserUpgrade):
            raise BrokenBody("the agent switched protocols (HTTP 101)") from exc
        raise BrokenBody(f"malformed answer: {exc}") from exc

    # -- httptools callbacks (a raise stops the parser; _parse re-raises it) -----------------

    def on_message_begin(self) -> None:
        if self.complete:
            # Anything behind the whole answer (one byte of a status line is enough) would leave
            # the parser mid-message for the next exchange: never read it, never reuse the
            # connection. The raise stops the parser here; _parse keeps the answer.
            raise BrokenBody("bytes after the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        # Counted here, bounded once the head is whole (on_headers_complete): nothing is kept
        # per line, and the head's bytes bound how many lines come before then. Trailer lines
        # (after a chunked body) are bounded per read and at the answer's end.
        self._headers += 1
        if len(name) + len(value) > self._line_room:
            raise HeadTooLarge(f"an answer header line is over {self._max_line} bytes")
        kind = _READ.get(name.lower())
        if kind is None:
            return  # the headers the Router does not read: one lookup each
        if kind == 0:
            if value.isdigit():
                self._length = int(value)
        elif kind == 1:
            self._chunked = b"chunked" in value.lower()
        elif kind == 2:
            self._encoding = value.strip().lower()
        else:
            self.retry_after = value[:64]

    def on_headers_complete(self) -> None:
        if self._headers > self._max_headers:
            raise HeadTooLarge(f"the answer has over {self._max_headers} header lines")
        status = self._parser.get_status_code()
        if status == 101:
            raise BrokenBody("the agent switched protocols (HTTP 101)")
        self.status = status
        if status < 200:
            return  # an interim answer: its end (on_message_complete) starts the next head
        self.head_done = True
        # Asked here: once the message is complete, llhttp has reset and always says False.
        self.keep_alive = self._parser.should_keep_alive()
        if self._length is not None and self._length > self.limit:
            raise too_large(f"the agent's answer of {self._length} bytes is over the {self.limit}-byte limit")

    def on_body(self, body: bytes) -> None:
        self._wire += len(body)
        if self._wire > self.limit:
            raise too_large(f"the agent's answer is over the {self.limit}-byte limit")
        if self._encoding in (b"gzip", b"deflate"):
            self._inflate(body)
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        if not self.head_done:
            self._reset_message()  # the interim answer is skipped whole
            return
        # A chunked body's trailer lines come after the head, past its byte bound, and count
        # toward the header lines': checked here and after each read of the body (feed), not
        # per line, so an agent cannot send them without end.
        if self._headers > self._max_headers:
            raise HeadTooLarge(f"the answer has over {self._max_headers} header lines")
        if self._encoding is not None:  # only a compressed body has an end of its own to check
            self._end_body()
        self.complete = True

    # -- compressed bodies -------------------------------------------------------------------

    def _inflate(self, data: bytes) -> None:
        decoder = self._decoder
        if decoder is None:
            if self._encoding == b"gzip":
                decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                # "deflate" is zlib-wrapped by the standard, raw in practice: accept both.
                decoder = zlib.decompressobj(zlib.MAX_WBITS if data[:1] == b"\x78" else -zlib.MAX_WBITS)
            self._decoder = decoder
        try:
            while data and not decoder.eof:
                room = self.limit - self._inflated
                out = decoder.decompress(data, min(room + 1, _INFLATE_STEP))
                self._inflated += len(out)
                if self._inflated > self.limit:
                    raise too_large(f"the agent's answer is over the {self.limit}-byte limit (decoded)")
                self._chunks.append(out)
                data = decoder.unconsumed_tail
        except zlib.error as exc:
            raise BrokenBody(f"the answer's {self._encoding_name} body: {exc}") from exc

    @property
    def _encoding_name(self) -> str:
        return (self._encoding or b"").decode("latin-1")

    def _end_body(self) -> None:
        compressed = self._encoding in (b"gzip", b"deflate") and self._wire
        if compressed and (self._decoder is None or not self._decoder.eof):
            raise BrokenBody(f"the answer's {self._encoding_name} body: the stream is cut off")


__all__ = [
    "DEFAULT_HEAD",
    "Answer",
    "AnswerReader",
    "BrokenBody",
    "Disconnected",
    "HeadLimits",
    "HeadTooLarge",
]
