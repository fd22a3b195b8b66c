"""The event-stream parser, bytes in and events out: no sockets, no loop, no clock."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable

import pytest

from reachmesh.sse import (
    LINE_CHARGE,
    RawEvent,
    RawSseParser,
    SseError,
    SseEvent,
    SseLimits,
    SseParser,
    encode_event,
)

STREAM = (
    b'event: chunk\ndata: "a"\n\nevent: chunk\ndata: {"b": 2}\n\nevent: done\ndata: {"status":"SUCCESS"}\n\n'
)
EXPECTED = [
    SseEvent("chunk", '"a"'),
    SseEvent("chunk", '{"b": 2}'),
    SseEvent("done", '{"status":"SUCCESS"}'),
]


def feed_in_pieces(parser: SseParser, data: bytes, sizes: list[int]) -> list[SseEvent]:
    out: list[SseEvent] = []
    at = 0
    for size in sizes:
        out.extend(parser.feed(data[at : at + size]))
        at += size
    out.extend(parser.feed(data[at:]))
    return out


def test_whole_stream_in_one_read() -> None:
    parser = SseParser()
    assert parser.feed(STREAM) == EXPECTED
    parser.eof()


def test_byte_by_byte_gives_the_same_events() -> None:
    parser = SseParser()
    assert feed_in_pieces(parser, STREAM, [1] * len(STREAM)) == EXPECTED
    parser.eof()


def test_random_splits_give_the_same_events() -> None:
    rng = random.Random(35)
    for _ in range(200):
        sizes = [rng.randint(0, 7) for _ in range(30)]
        assert feed_in_pieces(SseParser(), STREAM, sizes) == EXPECTED


@pytest.mark.parametrize("ending", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending(ending: bytes) -> None:
    data = STREAM.replace(b"\n", ending)
    assert feed_in_pieces(SseParser(), data, [1] * len(data)) == EXPECTED
    assert SseParser().feed(data) == EXPECTED


def test_crlf_split_across_reads_is_one_line_end() -> None:
    parser = SseParser()
    assert parser.feed(b"event: chunk\r") == []
    assert parser.feed(b"\ndata: 1\r") == []
    assert parser.feed(b"") == []  # an empty read does not end the pending CR's pair
    assert parser.feed(b"\n\r\n") == [SseEvent("chunk", "1")]


def test_data_lines_join_comments_and_other_fields_dropped() -> None:
    data = b": keep-alive\nid: 7\nretry: 10\nevent: chunk\ndata: [1,\ndata:2]\nfoo: bar\n\n"
    assert SseParser().feed(data) == [SseEvent("chunk", "[1,\n2]")]


def test_unnamed_event_is_message_and_bom_is_dropped() -> None:
    assert SseParser().feed(b"\xef\xbb\xbfdata: x\n\n") == [SseEvent("message", "x")]


def test_event_without_data_is_not_dispatched() -> None:
    assert SseParser().feed(b"event: chunk\n\n: only a comment\n\n") == []


def test_line_over_the_bound_is_refused_before_it_ends() -> None:
    parser = SseParser(SseLimits(max_line=64, max_event=1024, max_total=1 << 20))
    parser.feed(b"data: " + b"x" * 50)
    with pytest.raises(SseError, match="line is over 64 bytes"):
        parser.feed(b"x" * 20)  # still no line end: refused as it grows


def test_whole_line_over_the_bound_in_one_read() -> None:
    parser = SseParser(SseLimits(max_line=64, max_event=1024, max_total=1 << 20))
    with pytest.raises(SseError, match="line is over"):
        parser.feed(b"data: " + b"x" * 100 + b"\n\n")


def test_event_over_the_bound_across_many_short_lines() -> None:
    parser = SseParser(SseLimits(max_line=64, max_event=100, max_total=1 << 20))
    with pytest.raises(SseError, match="event is over 100 bytes"):
        parser.feed(b"data: 0123456789\n" * 20)


def test_total_bytes_bound() -> None:
    parser = SseParser(SseLimits(max_line=64, max_event=64, max_total=100, line_charge=0))
    parser.feed(b"event: chunk\ndata: 1\n\n" * 4)  # 88 bytes
    with pytest.raises(SseError, match="over its 100-byte limit"):
        parser.feed(b"event: chunk\ndata: 1\n\n")


def test_not_utf8_is_refused() -> None:
    with pytest.raises(SseError, match="not UTF-8"):
        SseParser().feed(b"data: \xff\xfe\n\n")


@pytest.mark.parametrize("tail", [b"event: chunk\ndata: 1\n", b"data: 1", b"event: done"])
def test_eof_inside_an_event_is_an_error(tail: bytes) -> None:
    parser = SseParser()
    parser.feed(tail)
    with pytest.raises(SseError, match="ended inside an event"):
        parser.eof()


def test_encode_event_round_trips() -> None:
    wire = encode_event("chunk", b'{"a":1}') + encode_event("done", b"{}")
    assert SseParser().feed(wire) == [SseEvent("chunk", '{"a":1}'), SseEvent("done", "{}")]


def test_random_garbage_never_raises_anything_but_sse_error() -> None:
    rng = random.Random(7)
    for _ in range(300):
        parser = SseParser(SseLimits(max_line=128, max_event=256, max_total=4096))
        try:
            for _ in range(10):
                parser.feed(bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
            parser.eof()
        except SseError:
            pass


RAW_EXPECTED = [RawEvent(e.event.encode(), e.data.encode(), e.data.count("\n") + 1) for e in EXPECTED]


@pytest.mark.parametrize("ending", [b"\r\n", b"\r", b"\n"])
def test_the_raw_parser_reads_the_same_events_as_sent(ending: bytes) -> None:
    """The relay's parser: the same events, their type and data the agent's bytes."""
    data = (b"\xef\xbb\xbf: hello\nid: 7\n" + STREAM).replace(b"\n", ending)
    rng = random.Random(14)
    for sizes in ([len(data)], [1] * len(data), *([rng.randint(0, 9) for _ in range(40)] for _ in range(50))):
        parser = RawSseParser()
        out: list[RawEvent] = []
        at = 0
        for size in sizes:
            out.extend(parser.feed(data[at : at + size]))
            at += size
        out.extend(parser.feed(data[at:]))
        parser.eof()
        assert out == RAW_EXPECTED


def test_the_raw_parser_leaves_the_data_undecoded_within_its_bounds() -> None:
    """Bytes that are not UTF-8 pass (the relay's JSON check refuses them); the bounds hold."""
    assert RawSseParser().feed(b"data: \xff\xfe\ndata: 1\n\n") == [RawEvent(b"message", b"\xff\xfe\n1", 2)]
    parser = RawSseParser(SseLimits(max_line=64, max_event=20, max_total=1 << 20))
    with pytest.raises(SseError, match="line is over 64"):
        parser.feed(b"data: " + b"x" * 70)
    parser = RawSseParser(SseLimits(max_line=64, max_event=20, max_total=1 << 20))
    with pytest.raises(SseError, match="event is over 20"):
        parser.feed(b"data: 0123456789\ndata: 0123456789\n")
    parser = RawSseParser(SseLimits(max_line=64, max_event=64, max_total=30, line_charge=0))
    parser.feed(b"event: chunk\ndata: 1\n\n")
    with pytest.raises(SseError, match="over its 30-byte limit"):
        parser.feed(b"event: chunk\ndata: 1\n\n")


def _line_by_line(pieces: list[bytes], limits: SseLimits) -> list[RawEvent] | str:
    """The events (or the SseError) of ``pieces`` fed one byte at a time: the line-by-line
    reader, which the whole-event reading must agree with."""
    parser = RawSseParser(limits)
    out: list[RawEvent] = []
    try:
        for piece in pieces:
            for at in range(len(piece)):
                out += parser.feed(piece[at : at + 1])
    except SseError as exc:
        return str(exc)
    return out


def _as_written(pieces: list[bytes], limits: SseLimits) -> list[RawEvent] | str:
    parser = RawSseParser(limits)
    out: list[RawEvent] = []
    try:
        for piece in pieces:
            out += parser.feed(piece)
    except SseError as exc:
        return str(exc)
    return out


# Streams as agents write them, one write (one read here) per piece; the first piece of a
# stream never takes the whole-event reading (a byte-order mark may open it), so each starts
# with a comment.
OPEN = b": hi\n\n"
WHOLE_EVENT_CASES = [
    [OPEN, b'event: chunk\ndata: "a"\n\n'],
    [
        OPEN,
        b'event: chunk\ndata: [1,"' + b"x" * 5000 + b'"]\n\n',
        b'event: done\ndata: {"status":"SUCCESS"}\n\n',
    ],
    [OPEN, b"event: \ndata: 1\n\n"],  # an empty type is "message"
    [OPEN, b"event: a:b\ndata: 1\n\n"],  # a colon in the type
    [OPEN, b"event: chunk\ndata: \n\n"],  # empty data is an event
    [OPEN, b"event: chunk\ndata:\n\n"],  # no space after the colon
    [OPEN, b"event:chunk\ndata: 1\n\n"],
    [OPEN, b"event: chunk\ndata: 1\ndata: 2\n\n"],  # two data lines
    [OPEN, b"event: chunk\ndata: 1\r\n\n"],  # a CR ends a line anywhere
    [OPEN, b"event: chunk\rdata: 1\n\n"],
    [OPEN, b"event: chunk\ndata: 1\r\r"],
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: 2\n\n"],  # two events in one read
    [OPEN, b"event: chunk\ndata: 1\n\n\n"],
    [OPEN, b"event: chunk\nid: 7\ndata: 1\n\n"],
    [OPEN, b"event: chunk\n: note\ndata: 1\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n"],  # no blank line yet: the next read ends it
    [OPEN, b"event: chunk\ndata: 1\n", b"\n"],
    [OPEN, b"event: chunk\n", b"data: 1\n\n", b'event: chunk\ndata: "\xff\xfe\x00"\n\n'],
    [OPEN, b"event: chunk\ndata: 1\n\n", b"event: chunk\ndata: 1\n\n"[:-1], b"\n"],
    [OPEN, b"data: 1\n\n", b"event: chunk\ndata: x\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\r", b"\nevent: chunk\ndata: 2\n\n"],  # CR LF across reads
    [OPEN + b"event: chunk\ndata: 1\r", b"\nevent: chunk\ndata: 2\n\n"],
    [b"\xef\xbb\xbfevent: chunk\ndata: 1\n\n", b"event: chunk\ndata: 2\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\n", b"\xef\xbb\xbfevent: chunk\ndata: 2\n\n"],  # a BOM later is text
    [OPEN, b"event: chunk\n\n\n"],
    [OPEN, b"event: " + b"n" * 50 + b"\ndata: 1\n\n"],  # the type line over the bound
    [OPEN, b"event: chunk\ndata: " + b"7" * 58 + b"\n\n"],  # the data line at the bound
    [OPEN, b"event: chunk\ndata: " + b"7" * 59 + b"\n\n"],  # one past the line bound
    [OPEN, b"event: chunk\ndata: " + b"7" * 45 + b"\n\n"],  # the event at its bound
    [OPEN, b"event: chunk\ndata: " + b"7" * 46 + b"\n\n"],  # one past the event bound
    # Several events in one read (an agent that writes a batch, or a read that caught up):
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: 2\n\nevent: done\ndata: 3\n\n"],
    [OPEN + b"event: chunk\ndata: 1\n\n"],  # after a comment in the same read
    [OPEN, b"event: chunk\ndata: 1\n\nid: 1\n: c\nevent: chunk\ndata: 2\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\n\nevent: chunk\ndata: 2\n\n"],  # a blank line between
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: 2\r\n\nevent: chunk\ndata: 3\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: 2\ndata: 3\n\nevent: chunk\ndata: 4\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: " + b"7" * 59 + b"\n\n"],  # a bound, second
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: " + b"7" * 46 + b"\n\n"],
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chu", b"nk\ndata: 2\n\nevent: chunk\ndata: 3\n\n"],
    [OPEN, b"event: chunk\ndata: 12", b"34\n\nevent: chunk\ndata: 5\n\n"],  # a line across reads
    [OPEN, b"event: chunk\ndata: 1\n\nevent: chunk\ndata: 2\n", b"\nevent: chunk\ndata: 3\n\n"],
    [OPEN, b"event: ch", b"unk\ndata: 1", b"2\n", b"\n"],
]


@pytest.mark.parametrize("pieces", WHOLE_EVENT_CASES)
def test_whole_event_reads_give_what_the_line_reader_gives(pieces: list[bytes]) -> None:
    small = SseLimits(max_line=64, max_event=48, max_total=1 << 20)
    for limits in (DEFAULT, small):
        assert _as_written(pieces, limits) == _line_by_line(pieces, limits)


DEFAULT = SseLimits()


def test_whole_event_bounds_are_the_line_readers() -> None:
    small = SseLimits(max_line=64, max_event=48, max_total=1 << 20)
    assert _as_written([OPEN, b"event: chunk\ndata: " + b"7" * 59 + b"\n\n"], small) == (
        "an event stream line is over 64 bytes"
    )
    assert (
        _as_written([OPEN, b"event: chunk\ndata: " + b"7" * 46 + b"\n\n"], small)
        == "an event is over 48 bytes"
    )
    assert _as_written([OPEN, b"event: chunk\ndata: 1\n\n"], SseLimits(max_total=20)) == (
        "the event stream is over its 20-byte limit"
    )


def test_whole_event_reads_of_random_streams_agree_with_the_line_reader() -> None:
    rng = random.Random(35)
    atoms = [
        b"event: chunk\n",
        b"event: \n",
        b"data: ",
        b"data:",
        b"1",
        b'"x"',
        b"\n",
        b"\r",
        b"\n\n",
        b": c\n",
        b"\xff",
        b"id: 1\n",
    ]
    small = SseLimits(max_line=40, max_event=30, max_total=4000)
    for _ in range(3000):
        pieces = [OPEN] + [
            b"".join(rng.choice(atoms) for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 6))
        ]
        if rng.random() < 0.5:  # most agents write whole events
            pieces.append(b"event: chunk\ndata: " + b"z" * rng.randint(0, 40) + b"\n\n")
        for limits in (DEFAULT, small):
            assert _as_written(pieces, limits) == _line_by_line(pieces, limits), pieces


def test_socket_reads_of_agent_written_streams_agree_with_the_line_reader() -> None:
    """Events as agents write them, several per write, read in pieces cut anywhere (as a socket
    hands them over): the reads between events take the whole-event reading, the rest the line
    reader, and together they give what the line reader alone gives, bounds included."""
    rng = random.Random(46)
    shapes: list[Callable[[], bytes]] = [
        lambda: b"event: chunk\ndata: [%d]\n\n" % rng.randint(0, 10 ** rng.randint(0, 12)),
        lambda: b"event: chunk\ndata: " + b"z" * rng.randint(0, 60) + b"\n\n",
        lambda: b'event: done\ndata: {"status":"SUCCESS"}\n\n',
        lambda: b"event: chunk\r\ndata: 1\r\n\r\n",
        lambda: b"data: 1\ndata: 2\n\n",
        lambda: b": keep-alive\n\n",
        lambda: b"event: chunk\ndata: 1\n\n\n",
    ]
    small = SseLimits(max_line=48, max_event=40, max_total=1 << 20)
    for _ in range(1500):
        stream = OPEN + b"".join(rng.choice(shapes)() for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(1, len(stream)), min(rng.randint(0, 6), len(stream) - 1)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        for limits in (DEFAULT, small):
            assert _as_written(pieces, limits) == _line_by_line(pieces, limits), pieces


def test_a_line_held_across_reads_is_given_as_bytes() -> None:
    """A data line cut by a read is joined in place; the event's data is bytes all the same."""
    parser = RawSseParser()
    assert parser.feed(OPEN + b"event: chunk\ndata: [1,") == []
    (event,) = parser.feed(b'"two"]\n\n')
    assert event == RawEvent(b"chunk", b'[1,"two"]')
    assert type(event.data) is bytes and type(event.event) is bytes
    assert parser.feed(b"event: ch") == []
    (event,) = parser.feed(b"unk\ndata: 3\n\n")
    assert event == RawEvent(b"chunk", b"3")
    assert type(event.data) is bytes and type(event.event) is bytes


@pytest.mark.parametrize(
    "fault",
    [b"data: " + b"x" * 300 + b"\n", b"data: " + b"x" * 300],  # a line over the bound, ended or not
)
def test_a_fault_keeps_the_events_whole_before_it_in_the_same_read(fault: bytes) -> None:
    """The events before a broken bound are handed over with the error, whatever the reads: one
    read holding a chunk, the done and then a line over the bound lost both (review of #35)."""
    good = b"event: chunk\ndata: 1\n\nevent: done\ndata: {}\n\n"
    parser = RawSseParser(SseLimits(max_line=256, max_event=256, max_total=4096))
    with pytest.raises(SseError) as caught:
        parser.feed(good + fault)
    assert caught.value.events == [RawEvent(b"chunk", b"1"), RawEvent(b"done", b"{}")]


def test_the_total_bound_reads_the_events_within_it() -> None:
    """A read that crosses the stream's total: the events whole within it are handed over with
    the error, nothing past the total is read."""
    good = b"event: chunk\ndata: 1\n\n"
    parser = RawSseParser(SseLimits(max_line=256, max_event=256, max_total=len(good) + 5, line_charge=0))
    with pytest.raises(SseError, match="limit") as caught:
        parser.feed(good + b"event: chunk\ndata: 2\n\n")
    assert caught.value.events == [RawEvent(b"chunk", b"1")]


def test_an_event_of_many_short_lines_holds_about_its_bound() -> None:
    """An event of many short ``data:`` lines, fed up to its bound, holds about its counted
    bytes: the lines were kept as a list, an object and a pointer each, about ten times the
    bound (11 MiB held for a 1 MiB event; review of #35)."""
    bound = 64 * 1024
    parser = RawSseParser(SseLimits(max_line=256, max_event=bound, max_total=1 << 30))
    short = b"data:ab\n" * (bound // 4 - 2)  # each line counts 4 bytes: just within the bound
    tracemalloc.start()
    try:
        assert parser.feed(short) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2 * bound, held
    (event,) = parser.feed(b"\n")
    assert event.data == b"\n".join([b"ab"] * (bound // 4 - 2)) and event.lines == bound // 4 - 2


def test_each_line_counts_against_the_total() -> None:
    """Lines that carry nothing still cost the reader a step each: every line counts
    ``line_charge`` bytes more than it has, so floods of empty events or blank lines end at the
    stream's bound long before their bytes would (a hostile agent's cheapest way to keep the
    Router's CPU busy with nothing relayed)."""
    limits = SseLimits(max_total=64 * 1024)
    for flood in (b"data:\n\n" * 1000, b"\n" * 2000, b":\n" * 2000, b"event: x\n\n" * 1000):
        parser = RawSseParser(limits)
        parser.feed(OPEN)
        with pytest.raises(SseError, match="over its 65536-byte limit"):
            parser.feed(flood)  # 7,000 to 10,000 bytes, from 1,000 to 2,000 lines
    parser = RawSseParser(limits)
    parser.feed(OPEN)
    assert parser.feed(b"event: chunk\ndata: 1\n\n") == [RawEvent(b"chunk", b"1")]
    assert parser.total == len(OPEN + b"event: chunk\ndata: 1\n\n") + 5 * LINE_CHARGE


def test_the_line_charge_ends_a_stream_where_the_line_reader_does() -> None:
    """With a total that the lines' charge reaches often, the whole-event reading, the runs of
    idle lines and the line reader stop at the same line, whatever the reads."""
    rng = random.Random(49)
    shapes: list[Callable[[], bytes]] = [
        lambda: b"event: chunk\ndata: " + b"z" * rng.randint(0, 30) + b"\n\n",
        lambda: b"data:\n\n",
        lambda: b"\n" * rng.randint(1, 5),
        lambda: b": c\r\n",
        lambda: b"event: x\n\n",
        lambda: b"id: 1\r",
        lambda: b"event: chunk\r\ndata: 1\r\n\r\n",
    ]
    for _ in range(1500):
        limits = SseLimits(
            max_line=48, max_event=40, max_total=rng.randint(10, 600), line_charge=rng.randint(0, 20)
        )
        stream = OPEN + b"".join(rng.choice(shapes)() for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(1, len(stream)), min(rng.randint(0, 6), len(stream) - 1)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert _as_written(pieces, limits) == _line_by_line(pieces, limits), (pieces, limits)


def test_a_data_line_cut_by_reads_at_every_offset_gives_what_the_line_reader_gives() -> None:
    """A data line held across reads is joined once, as the event's data: every cut, in two and
    in three reads, of the shapes an agent writes and of the odd ones (no space after the colon,
    CR LF, a second data line, a comment), bounds included, gives what one byte at a time gives."""
    shapes = [
        b'event: chunk\ndata: ["' + b"x" * 40 + b'"]\n\n',
        b'event: chunk\ndata:["' + b"x" * 40 + b'"]\n\n',
        b'event: chunk\r\ndata: ["' + b"x" * 40 + b'"]\r\n\r\n',
        b"event: chunk\ndata: [1,\ndata: " + b"2" * 30 + b"]\n\n",
        b"event: chunk\n: note " + b"n" * 20 + b"\ndata: " + b"3" * 30 + b"\n\n",
        b"data: " + b"4" * 50 + b"\n\n",
    ]
    small = SseLimits(max_line=48, max_event=40, max_total=1 << 20)
    for shape in shapes:
        for cut in range(1, len(shape)):
            for limits in (DEFAULT, small):
                pieces = [OPEN, shape[:cut], shape[cut:]]
                assert _as_written(pieces, limits) == _line_by_line(pieces, limits), pieces
                third = [OPEN, shape[: cut // 2], shape[cut // 2 : cut], shape[cut:]]
                assert _as_written(third, limits) == _line_by_line(third, limits), third


def test_a_large_chunk_cut_by_a_read_is_joined_with_one_copy() -> None:
    """A chunk's data line cut by a read costs one copy of it, as a whole one does: it was
    gathered in a growing buffer and copied out again (about twice its size at the peak)."""
    line = b'["' + b"x" * (512 * 1024) + b'"]'
    event = b"event: chunk\ndata: " + line + b"\n\n"
    parser = RawSseParser()
    parser.feed(OPEN)
    first, second = event[: len(event) // 2], event[len(event) // 2 :]
    tracemalloc.start()
    try:
        assert parser.feed(first) == []
        (got,) = parser.feed(second)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == RawEvent(b"chunk", line)
    assert peak < 1.25 * len(line), peak


def test_a_short_line_at_the_end_of_a_large_read_does_not_keep_the_read() -> None:
    """The line held across reads is a view of the read it came in only when it is most of it:
    a few bytes at the end of a megabyte read are copied, not kept with the whole read."""
    parser = RawSseParser()
    parser.feed(OPEN)
    tracemalloc.start()
    try:
        read = b"event: chunk\ndata: 1\n\n" * 50_000 + b"event: chunk\ndata: [2"
        assert len(parser.feed(read)) == 50_000
        del read
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 64 * 1024, held
    assert parser.feed(b"]\n\n") == [RawEvent(b"chunk", b"[2]")]


def test_a_read_given_as_a_bytearray_is_copied_when_held() -> None:
    """A read that is not bytes may be reused by its owner after it was fed: the line held from
    it is a copy, never a view."""
    parser = RawSseParser()
    parser.feed(OPEN)
    buffer = bytearray(b"event: chunk\ndata: [1,")
    assert parser.feed(buffer) == []  # type: ignore[arg-type]
    buffer[:] = b"x" * len(buffer)
    assert parser.feed(b"2]\n\n") == [RawEvent(b"chunk", b"[1,2]")]


def test_a_line_that_trickles_in_holds_about_its_size() -> None:
    """A line sent a byte a read is held as about its bytes, not as a piece a read (an object
    and a pointer each: about 50 times the line)."""
    parser = RawSseParser()
    parser.feed(OPEN)
    parser.feed(b"event: chunk\n")
    line = b'data: "' + b"t" * (16 * 1024) + b'"'
    tracemalloc.start()
    try:
        for at in range(len(line)):
            parser.feed(line[at : at + 1])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2 * len(line), held
    assert parser.feed(b"\n\n") == [RawEvent(b"chunk", line[6:])]


def test_an_open_line_holds_at_most_twice_the_line_bound() -> None:
    """What docs/limits.md says an open line costs: the parser keeps a view of the read the line
    started in (not a copy) when the line is at least half of it, so between reads it holds up
    to the line's bytes and the rest of that read, never more than twice ``max_line`` in all;
    more than the line alone when the line started mid-read."""
    bound = 256 * 1024
    parser = RawSseParser(SseLimits(max_line=bound, max_event=4 * bound, max_total=1 << 30))
    event = b"event: chunk\ndata: " + b"1" * (bound - 64) + b"\n\n"
    opened = b"data: " + b"2" * (bound - 16)  # the line still open at the end of the read
    tracemalloc.start()
    try:
        # Each read fresh bytes, as the relay's reads are; this test keeps no reference to them.
        assert len(parser.feed(bytes(event + opened))) == 1
        after_first, _ = tracemalloc.get_traced_memory()
        parser.feed(bytes(b"2" * 8))  # the line goes on, within its bound
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bound < after_first <= 2 * bound + 4096, after_first
    assert held <= 2 * bound + 4096, held
    (done,) = parser.feed(b"\n\n")
    assert done.data == b"2" * (bound - 16 + 8)
