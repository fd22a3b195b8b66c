"""The event-stream parser, bytes in and events out: no sockets, no loop, no clock."""

from __future__ import annotations

import random

import pytest

from reachmesh.sse import RawEvent, RawSseParser, SseError, SseEvent, SseLimits, SseParser, encode_event

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
    parser = SseParser(SseLimits(max_line=64, max_event=64, max_total=100))
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


RAW_EXPECTED = [RawEvent(e.event.encode(), e.data.encode()) for e in EXPECTED]


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
    assert RawSseParser().feed(b"data: \xff\xfe\ndata: 1\n\n") == [RawEvent(b"message", b"\xff\xfe\n1")]
    parser = RawSseParser(SseLimits(max_line=64, max_event=20, max_total=1 << 20))
    with pytest.raises(SseError, match="line is over 64"):
        parser.feed(b"data: " + b"x" * 70)
    parser = RawSseParser(SseLimits(max_line=64, max_event=20, max_total=1 << 20))
    with pytest.raises(SseError, match="event is over 20"):
        parser.feed(b"data: 0123456789\ndata: 0123456789\n")
    parser = RawSseParser(SseLimits(max_line=64, max_event=64, max_total=30))
    parser.feed(b"event: chunk\ndata: 1\n\n")
    with pytest.raises(SseError, match="over its 30-byte limit"):
        parser.feed(b"event: chunk\ndata: 1\n\n")
