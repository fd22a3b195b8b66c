"""Reading a server-sent event stream from bytes: no sockets, no clock, every bound testable alone.

:class:`RawSseParser` is fed the body of a ``text/event-stream`` answer as it arrives and hands
back the whole events found so far, their data as sent; :class:`SseParser` is the same reader
with each event decoded. It enforces every bound on what a streaming agent sends, as the
bytes arrive, so an agent can never make the Router hold more than one event's worth of text:

- one line (a field, or a line still without its end) at most ``max_line`` bytes;
- one event (its data lines together) at most ``max_event`` bytes;
- the whole stream at most ``max_total`` bytes, each line counted ``line_charge`` bytes more
  than it has (see :data:`LINE_CHARGE`).

A broken bound, a stream that ends inside an event, or (for :class:`SseParser`) an event whose
type or data is not UTF-8 raise :class:`SseError`; what that means for the request (a failover,
or a stream ended with an error) is for the caller of the parser to say. Lines end with CRLF,
LF or CR, as the SSE format allows; a CR at the end of one read waits for the next to see
whether an LF follows. Comments (``:``), ``id`` and ``retry`` are read and dropped: the Router
has no use for them. The format itself (field names, one optional space after the colon, data
lines joined with LF) is the WHATWG HTML standard's.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple, NoReturn


class SseError(Exception):
    """The event stream broke one of its bounds or the format. ``events`` are the whole events
    the read that broke it held before the fault (:meth:`RawSseParser.feed`'s): the agent sent
    them as they should be, and whether they reach the caller must not depend on where the
    reads of the stream happened to fall."""

    def __init__(self, message: str, events: list[RawEvent] | None = None) -> None:
        super().__init__(message)
        self.events: list[RawEvent] = events or []


# What each line of a stream costs against its total beside its own bytes. The reader's cost is
# per line (about a microsecond for a line read on its own), its bytes almost free: a hostile
# agent sending empty events (``data:`` and a blank line, 7 bytes) cost the Router about 0.4 us
# of CPU a byte, so the 256 MiB bound let one stream take about 100 s of CPU with nothing
# relayed. Counted 64 bytes more a line, the same stream reaches the bound 19 times sooner;
# a 64 KiB chunk counts 0.3 % more, a token of an LLM's stream (three short lines) about 200
# bytes.
LINE_CHARGE = 64


class SseLimits(NamedTuple):
    """Bounds on one event stream: a line's bytes, an event's data bytes, the stream's bytes
    (each line counted ``line_charge`` bytes more than it has)."""

    max_line: int = 1024 * 1024
    max_event: int = 1024 * 1024
    max_total: int = 256 * 1024 * 1024
    line_charge: int = LINE_CHARGE


DEFAULT_LIMITS = SseLimits()


class SseEvent(NamedTuple):
    """One whole event: its type (``message`` when it named none) and its data."""

    event: str
    data: str


class RawEvent(NamedTuple):
    """One whole event as sent: its type (``b"message"`` when it named none) and its data lines
    joined with LF, not decoded; ``lines`` says how many (a data of one line has no LF, which
    spares the relay a look for one in every chunk)."""

    event: bytes
    data: bytes
    lines: int = 1


_BOM = b"\xef\xbb\xbf"


class RawSseParser:
    """The events of one stream, fed its bytes in reads of any size, not decoded: the Router's
    relay reads events by the megabyte and passes each chunk's data on as the agent wrote it
    (its JSON check is a UTF-8 check too). A field is sliced out of the read its line ended in,
    once; a field nobody reads (a comment, ``id``, ``retry``) is skipped unread: only the bounds
    see it."""

    def __init__(self, limits: SseLimits = DEFAULT_LIMITS) -> None:
        self._max_line, self._max_event, self._max_total, self._line_charge = limits
        # What the stream has cost against its total: its bytes read, and line_charge a line.
        self.total = 0
        # Where the read under way started: the total up to its index i is
        # self.total + i - self._origin (see _charge).
        self._origin = 0
        # The line still open at the end of the last read, as the pieces it came in (a read's
        # bytes are not changed once fed, so a piece is a view of its read, not a copy), and
        # its bytes: joined once, when its end comes.
        self._held: list[bytes | bytearray | memoryview] = []
        self._held_size = 0
        self._cr = False
        self._first = True
        self._event = b""
        # The event's data so far: its one line as sliced, then, from a second line on, all
        # of them joined in one buffer. A list of the lines held about ten times the data of
        # an event of many short lines (an object and a pointer per line): 11 MiB for 1 MiB.
        self._data: bytes | bytearray = b""
        self._lines = 0
        self._data_bytes = 0
        self._open = False

    def feed(self, data: bytes) -> list[RawEvent]:
        """The events completed by ``data``; raises SseError at the first broken bound, with the
        events whole before it (bytes past the stream's total are not read)."""
        room = self._max_total - self.total
        events: list[RawEvent] = []
        try:
            if len(data) > room:
                self._read(data[: max(room, 0)], events)
                raise SseError(f"the event stream is over its {self._max_total}-byte limit")
            self._read(data, events)
        except SseError as exc:
            exc.events = events
            raise
        return events

    def feed_some(self, data: bytes, start: int, steps: int) -> tuple[list[RawEvent], int, int]:
        """:meth:`feed` for ``data[start:]``, stopping after ``steps`` steps (a line, a whole
        event or a run of idle lines each): its events, where it stopped (``len(data)`` once
        all is read) and the steps left. A reader that must not hold its loop for long reads a
        budget of steps at a time: the cost of a read is per line, not per byte."""
        if len(data) - start > self._max_total - self.total:
            return self.feed(data[start:]), len(data), 0  # over the stream's bound: this raises
        events: list[RawEvent] = []
        self._origin = start  # _read's work, in line: this is called for each part of a read
        try:
            stop, left = self._read_lines(data, events, start, steps)
            self.total += stop - start
            if self.total > self._max_total:
                raise SseError(f"the event stream is over its {self._max_total}-byte limit")
        except SseError as exc:
            exc.events = events
            raise
        return events, stop, left

    def _read(self, data: bytes, events: list[RawEvent], start: int = 0, steps: int = -1) -> tuple[int, int]:
        """Read ``data`` from ``start``, appending to ``events`` each event it completes, for at
        most ``steps`` steps (-1: no limit); where it stopped and the steps left (the bytes
        read to there added to the total)."""
        self._origin = start
        stop, steps = self._read_lines(data, events, start, steps)
        self.total += stop - start
        if self.total > self._max_total:  # bytes after the last line's charge (an LF, a line begun)
            raise SseError(f"the event stream is over its {self._max_total}-byte limit")
        return stop, steps

    def _read_lines(self, data: bytes, events: list[RawEvent], start: int, steps: int) -> tuple[int, int]:
        size = len(data)
        if self._cr and start < size:
            self._cr = False
            if data[start] == 10:
                start += 1  # the LF of a CR LF split between two reads
        while start < size and steps:
            steps -= 1
            if not (self._held or self._first):
                ahead = self._at_once(data, start, events)
                if ahead > start:
                    start = ahead
                    continue
            cut = _line_end(data, start)
            if cut < 0:
                self._hold(data, start)
                start = size
                break
            if self._held:
                event = self._held_line(memoryview(data)[start:cut], cut + 1)
            else:
                event = self._line(data, start, cut, cut + 1)
            start = self._after_line_end(data, cut)
            if event is not None:
                events.append(event)
        return start, steps

    def _at_once(self, data: bytes, start: int, events: list[RawEvent]) -> int:
        """Past what can be read at ``start`` without going line by line (a line starts there):
        a whole event in the form agents write, or a run of idle lines; ``start`` if neither."""
        if not self._open:
            # Between events: an event in the form agents write is read whole.
            whole = self._whole_event(data, start)
            if whole is not None:
                events.append(whole[0])
                return whole[1]
        first = data[start]
        # A data line is never idle, nor, within an event, its end or a new event line.
        if first == 100 or (self._open and first in _OPEN_BUSY):
            return start
        return self._skip_idle(data, start)

    def _skip_idle(self, data: bytes, start: int) -> int:
        """Past the run of lines at ``start`` that change nothing, in one scan: comments, ``id``,
        ``retry`` and unknown fields, and, between events, blank lines and events with no data.
        Read one by one, an agent sending ``:`` or empty lines as fast as it could cost the
        Router a core for its whole stream, with nothing relayed; the same bounds hold (a line
        over ``max_line`` is not skipped, and the line reader refuses it)."""
        skip = _idle_run(self._max_line, self._open).match(data, start)
        if skip is None:
            return start
        end = skip.end()
        # Each line of the run counts (a CR LF is one line end), as read one by one.
        lines = data.count(b"\n", start, end)
        if data.find(b"\r", start, end) >= 0:
            lines += data.count(b"\r", start, end) - data.count(b"\r\n", start, end)
        self._charge(lines, end)
        if end == len(data) and data[end - 1] == 13:
            self._cr = True  # a CR ends the run: an LF at the start of the next read is its own
        return end

    def _whole_event(self, data: bytes, start: int) -> tuple[RawEvent, int] | None:
        """The event at ``start`` and where the next begins, when it is exactly ``event: NAME``,
        ``data: VALUE`` and a blank line, each ended by LF (how streaming agents write): read
        with a few scans instead of line by line, the same event and the same bounds as
        :meth:`_line` would give. None, with nothing read, for any other shape, and for an
        event not whole in ``data`` (the line reader takes it from there)."""
        if not data.startswith(b"event: ", start):
            return None
        name_end = data.find(b"\n", start + 7)
        if name_end < 0 or not data.startswith(b"data: ", name_end + 1):
            return None
        value = name_end + 7
        value_end = data.find(b"\n", value)
        if value_end < 0 or not data.startswith(b"\n", value_end + 1):
            return None
        if data.find(b"\r", start, value_end) >= 0:
            return None
        total = self.total + 3 * self._line_charge  # its three lines
        if (
            name_end - start > self._max_line
            or value_end - name_end - 1 > self._max_line
            or value_end - value + 3 > self._max_event  # the data line's count in _line
            or total + value_end + 2 - self._origin > self._max_total
        ):
            self._refuse_whole(start, name_end, value_end)
        self.total = total
        return RawEvent(data[start + 7 : name_end] or b"message", data[value:value_end]), value_end + 2

    def _refuse_whole(self, start: int, name_end: int, value_end: int) -> NoReturn:
        """The error of a whole event over a bound: the checks of its three lines in the line
        reader's order, so that the same bound is named however the reads fell."""
        if name_end - start > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")
        self._charge(1, name_end + 1)
        if value_end - name_end - 1 > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")
        self._charge(1, value_end + 1)
        if value_end - name_end - 4 > self._max_event:  # the data line's count in _line
            raise SseError(f"an event is over {self._max_event} bytes")
        self._charge(1, value_end + 2)
        raise SseError(f"the event stream is over its {self._max_total}-byte limit")  # (unreached)

    def _charge(self, lines: int, end: int) -> None:
        """Count ``lines`` lines read, the last ending before index ``end`` of the read under
        way; raises SseError when the stream's total up to there is over its bound."""
        total = self.total = self.total + lines * self._line_charge
        if total + end - self._origin > self._max_total:
            raise SseError(f"the event stream is over its {self._max_total}-byte limit")

    def _after_line_end(self, data: bytes, cut: int) -> int:
        """Where the next line starts: a CR's LF belongs to it, even when it comes in the next read."""
        if data[cut] == 13:
            if cut + 1 == len(data):
                self._cr = True
            elif data[cut + 1] == 10:
                return cut + 2
        return cut + 1

    def _hold(self, data: bytes, start: int) -> None:
        """Keep the line still open at the end of a read (``data[start:]``), within the line
        bound: a view of the read when it is a large piece and most of the read, else copied
        onto the last piece held. A view of a read whose line is its smaller part would keep
        the whole read for a few bytes; a piece a read would cost an object and a pointer a
        read to a line that trickles in (50 times its size in reads of a byte); a read that is
        not bytes may be reused by its owner."""
        size = len(data) - start
        self._held_size += size
        if self._held_size > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")
        held = self._held
        last = held[-1] if held else None
        if size >= _VIEW_FROM and 2 * size >= len(data) and type(data) is bytes:
            held.append(memoryview(data)[start:] if start else data)
        elif isinstance(last, bytearray):
            last += memoryview(data)[start:]  # in place: the piece in the list grows
        else:
            held.append(bytearray(memoryview(data)[start:]))

    def _held_line(self, end: memoryview, after: int) -> RawEvent | None:
        """The line held across reads, ended by ``end``: joined once, as the event's data when
        it is a data line (a large chunk cut by a read takes one copy, as a whole one does),
        else read as any line; ``after`` as for :meth:`_line`."""
        held = self._held
        size = self._held_size + len(end)
        held.append(end)
        first = held[0]
        data_line = not self._first and len(first) >= 6 and first[:6] == b"data: "
        if data_line and size <= self._max_line:
            held[0] = memoryview(first)[6:]
        line = b"".join(held)
        held.clear()
        self._held_size = 0
        if not (data_line and size <= self._max_line):
            return self._line(line, 0, size, after)
        # What _line does for a data line, its value already apart from its name.
        self._charge(1, after)
        self._data_line(line, 0, len(line), size - 3)
        return None

    def eof(self) -> None:
        """The stream ended; raises SseError if it ended inside an event or a line."""
        if self._held or self._open:
            raise SseError("the event stream ended inside an event")

    def _line(self, buf: bytes | bytearray, start: int, end: int, after: int) -> RawEvent | None:
        """The line ``buf[start:end]`` (without its end), read in place (``buf`` a bytearray for
        a line held across reads); ``after``: the read's index past its end's first byte."""
        if end - start > self._max_line:
            raise SseError(f"an event stream line is over {self._max_line} bytes")
        self._charge(1, after)
        if self._first:
            self._first = False
            if buf.startswith(_BOM, start, end):
                start += 3
        if start == end:
            return self._dispatch()
        if buf[start] == 58:  # ":", a comment
            return None
        colon = buf.find(b":", start, end)
        name_end = end if colon < 0 else colon
        value = name_end + 1 if colon >= 0 else end
        if value < end and buf[value] == 32:
            value += 1
        name_size = name_end - start
        if name_size == 4 and buf.startswith(b"data", start):
            self._data_line(buf, value, end, end - name_end + 1)
        elif name_size == 5 and buf.startswith(b"event", start):
            self._event = _field(buf, value, end)
            self._open = True
        return None

    def _dispatch(self) -> RawEvent | None:
        data, lines, event = self._data, self._lines, self._event or b"message"
        self._data, self._lines, self._event, self._data_bytes, self._open = b"", 0, b"", 0, False
        if not lines:
            return None
        if lines == 1:
            return RawEvent(event, bytes(data))
        return RawEvent(event, bytes(data), lines)

    def _data_line(self, buf: bytes | bytearray, start: int, end: int, counted: int) -> None:
        """A data line whose value is ``buf[start:end]``, ``counted`` bytes of the event's bound
        (as SseParser counts them: the value, its name's colon and its LF)."""
        self._data_bytes += counted
        if self._data_bytes > self._max_event:
            raise SseError(f"an event is over {self._max_event} bytes")
        self._add_data(buf, start, end)
        self._open = True

    def _add_data(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """Add the data line ``buf[start:end]`` to the event's data (joined with LF)."""
        self._lines += 1
        if self._lines == 1:
            self._data = _field(buf, start, end)
            return
        data = self._data
        if isinstance(data, bytes):
            data = self._data = bytearray(data)
        data += b"\n"
        with memoryview(buf) as view:
            data += view[start:end]


class SseParser:
    """The events of one stream, fed its bytes in reads of any size, decoded: a
    :class:`RawSseParser` whose events' type and data must be UTF-8."""

    def __init__(self, limits: SseLimits = DEFAULT_LIMITS) -> None:
        self._raw = RawSseParser(limits)

    @property
    def total(self) -> int:
        """What the stream has counted against its total so far: its bytes, and
        ``line_charge`` for each line."""
        return self._raw.total

    def feed(self, data: bytes) -> list[SseEvent]:
        """The events completed by ``data``; raises SseError at the first broken bound."""
        try:
            return [SseEvent(event.decode(), body.decode()) for event, body, _ in self._raw.feed(data)]
        except UnicodeDecodeError as exc:
            raise SseError(f"the event stream is not UTF-8 ({exc.reason})") from exc

    def eof(self) -> None:
        """The stream ended; raises SseError if it ended inside an event or a line."""
        self._raw.eof()


@functools.lru_cache(maxsize=16)
def _idle_run(max_line: int, open_event: bool) -> re.Pattern[bytes]:
    """A run of lines that change nothing, each at most ``max_line`` bytes and ended (CR, LF or
    CR LF). Within an event, a blank line ends it, so only the ignored fields are a run there."""
    end = rb"(?:\r\n|\n|\r(?!\n))"  # a CR LF is one end, never a CR and then a blank line
    fits = rb"(?=[^\r\n]{0,%d}[\r\n])" % max_line
    # A field nobody reads: a comment, or any name but data and event (a line of its own name
    # with no colon included).
    # (Its name first: a data line, however long, is passed over at its first bytes.)
    ignored = rb"(?!(?:data|event)[:\r\n])" + fits + rb"[^\r\n]+" + end
    # A comment first, the most common of them, checked for its length without a lookahead.
    comment = rb":[^\r\n]{0,%d}" % (max_line - 1)
    if open_event:
        return re.compile(rb"(?:" + comment + end + rb"|" + ignored + rb")+")
    # An event line then a blank line with no data between: an event with nothing in it.
    empty_event = fits + rb"event(?::[^\r\n]*)?" + end + rb"(?:" + ignored + rb")*" + end
    # Blank lines between events change nothing either, in any mix of ends.
    return re.compile(rb"(?:" + comment + rb"[\r\n]+|[\r\n]+|" + ignored + rb"|" + empty_event + rb")+")


_OPEN_BUSY = frozenset(b"e\r\n")
# The smallest piece of a line held across reads kept as a view of its read (see _hold).
_VIEW_FROM = 16 * 1024


def _field(buf: bytes | bytearray, start: int, end: int) -> bytes:
    """``buf[start:end]`` as bytes, copied once."""
    if isinstance(buf, bytes):
        return buf[start:end]
    with memoryview(buf) as view:
        return bytes(view[start:end])


def _line_end(data: bytes | bytearray, start: int) -> int:
    """The index of the first CR or LF at or after ``start``, or -1."""
    lf = data.find(b"\n", start)
    cr = data.find(b"\r", start, lf if lf >= 0 else len(data))
    return cr if cr >= 0 else lf


def accepts_event_stream(accept: bytes | str | None) -> bool:
    """Whether an ``Accept`` header asks for an event stream: it names ``text/event-stream`` with
    a weight above 0. A caller that writes ``text/event-stream;q=0`` refuses one (RFC 9110
    §12.4.2); a wildcard alone asks for the plain answer, as it always has. A weight that is not
    a number is read as 1: the caller named the type, and that is what it meant."""
    if accept is None:
        return False
    lowered = (accept.encode("latin-1", "replace") if isinstance(accept, str) else accept).lower()
    if _EVENT_STREAM not in lowered:
        return False
    for item in lowered.split(b","):
        media, _, params = item.partition(b";")
        if media.strip() == _EVENT_STREAM and _weight(params) > 0:
            return True
    return False


_EVENT_STREAM = b"text/event-stream"


def _weight(params: bytes) -> float:
    for param in params.split(b";"):
        name, _, value = param.partition(b"=")
        if name.strip() == b"q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 1.0
            return weight if weight == weight else 1.0  # NaN is not a weight
    return 1.0


def encode_event(event: str, data: bytes) -> bytes:
    """One event on the wire; ``data`` is one line (JSON from the Router's encoder is)."""
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


__all__ = [
    "DEFAULT_LIMITS",
    "LINE_CHARGE",
    "RawEvent",
    "RawSseParser",
    "SseError",
    "SseEvent",
    "SseLimits",
    "SseParser",
    "accepts_event_stream",
    "encode_event",
]
