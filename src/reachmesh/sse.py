"""Reading a server-sent event stream from bytes: no sockets, no clock, every bound testable alone.

:class:`SseParser` is fed the body of a ``text/event-stream`` answer as it arrives and hands back
the whole events found so far. It enforces every bound on what a streaming agent sends, as the
bytes arrive, so an agent can never make the Router hold more than one event's worth of text:

- one line (a field, or a line still without its end) at most ``max_line`` bytes;
- one event (its data lines together) at most ``max_event`` bytes;
- the whole stream at most ``max_total`` bytes.

A broken bound, bytes that are not UTF-8, or a stream that ends inside an event raise
:class:`SseError`; what that means for the request (a failover, or a stream ended with an error)
is for the caller of the parser to say. Lines end with CRLF, LF or CR, as the SSE format allows;
a CR at the end of one read waits for the next to see whether an LF follows. Comments (``:``),
``id`` and ``retry`` are read and dropped: the Router has no use for them. The format itself
(field names, one optional space after the colon, data lines joined with LF) is the WHATWG
HTML standard's.
"""

from __future__ import annotations

from typing import NamedTuple


class SseError(Exception):
    """The event stream broke one of its bounds or the format."""


class SseLimits(NamedTuple):
    """Bounds on one event stream: a line's bytes, an event's data bytes, the stream's bytes."""

    max_line: int = 1024 * 1024
    max_event: int = 1024 * 1024
    max_total: int = 256 * 1024 * 1024


DEFAULT_LIMITS = SseLimits()


class SseEvent(NamedTuple):
    """One whole event: its type (``message`` when it named none) and its data."""

    event: str
    data: str


class SseParser:
    """The events of one stream, fed its bytes in reads of any size."""

    def __init__(self, limits: SseLimits = DEFAULT_LIMITS) -> None:
        self._max_line, self._max_event, self._max_total = limits
        self.total = 0  # bytes fed so far
        self._partial = bytearray()  # the line still open at the end of the last read
        self._cr = False  # the last read ended with a CR: an LF at the start of the next is its pair
        self._first = True  # a BOM is allowed before the first line only
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self._open = False  # a field of an event not dispatched yet has been read

    def feed(self, data: bytes) -> list[SseEvent]:
        """The events completed by ``data``; raises SseError at the first broken bound."""
        self.total += len(data)
        if self.total > self._max_total:
            raise SseError(f"the event stream is over its {self._max_total}-byte limit")
        if not data:
            return []
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = False
        events: list[SseEvent] = []
        start = 0
        while start < len(data):
            cut = _line_end(data, start)
            if cut < 0:
                self._hold(data[start:])
                break
            line = data[start:cut]
            if self._partial:
                line = bytes(self._partial) + line
                self._partial.clear()
            start = self._after_line_end(data, cut)
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _hold(self, tail: bytes) -> None:
        """Keep the line still open at the end of a read, within the line bound."""
        self._partial += tail
        if len(self._partial) > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")

    def _after_line_end(self, data: bytes, cut: int) -> int:
        """Where the next line starts: a CR's LF belongs to it, even when it comes in the next read."""
        if data[cut] == 13:
            if cut + 1 == len(data):
                self._cr = True
            elif data[cut + 1] == 10:
                return cut + 2
        return cut + 1

    def eof(self) -> None:
        """The stream ended; raises SseError if it ended inside an event or a line."""
        if self._partial or self._open:
            raise SseError("the event stream ended inside an event")

    def _line(self, raw: bytes) -> SseEvent | None:
        if len(raw) > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SseError(f"the event stream is not UTF-8 ({exc.reason})") from exc
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None  # a comment: agents send them to keep a quiet stream alive
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data_bytes += len(raw) - len(name) + 1  # the value and the LF that joins it
            if self._data_bytes > self._max_event:
                raise SseError(f"an event is over {self._max_event} bytes")
            self._data.append(value)
            self._open = True
        elif name == "event":
            self._event = value
            self._open = True
        # id, retry and unknown fields are ignored, as the format says
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event or "message"
        self._data, self._event, self._data_bytes, self._open = [], "", 0, False
        if not data:
            return None  # an event without data is not dispatched
        return SseEvent(event, "\n".join(data))


def _line_end(data: bytes, start: int) -> int:
    """The index of the first CR or LF at or after ``start``, or -1."""
    lf = data.find(b"\n", start)
    cr = data.find(b"\r", start, lf if lf >= 0 else len(data))
    return cr if cr >= 0 else lf


def encode_event(event: str, data: bytes) -> bytes:
    """One event on the wire; ``data`` is one line (JSON from the Router's encoder is)."""
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


__all__ = ["DEFAULT_LIMITS", "SseError", "SseEvent", "SseLimits", "SseParser", "encode_event"]
