"""The answer reader, bytes in and outcome out: no sockets, no loop, no clock."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from reachmesh.exceptions import AgentRejected
from reachmesh.transport.answer import (
    DEFAULT_HEAD,
    Answer,
    AnswerReader,
    BrokenBody,
    Disconnected,
    HeadLimits,
    HeadTooLarge,
)

OK = b'{"status":"SUCCESS","result":1}'
LIMIT = 1024


def reader(head: HeadLimits = DEFAULT_HEAD, limit: int = LIMIT) -> AnswerReader:
    r = AnswerReader(head)
    r.start(limit)
    return r


def answer(body: bytes, extra: bytes = b"", status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s" % (status, extra, len(body), body)


def feed_bytewise(r: AnswerReader, data: bytes) -> bool:
    whole = False
    for i in range(len(data)):
        whole = r.feed(data[i : i + 1])
    return whole


@pytest.mark.parametrize("split", ["whole", "bytewise"])
@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: <a>\r\n\r\n",
    ],
)
def test_interim_answers_are_skipped_and_the_real_answer_is_read(interim: bytes, split: str) -> None:
    r = reader()
    data = interim + answer(OK, b"Retry-After: 7\r\n")
    if split == "whole":
        assert r.feed(data) is True
    else:
        # Interim heads alone never complete the exchange.
        assert r.feed(interim) is False
        assert feed_bytewise(r, data[len(interim) :]) is True
    assert r.reusable
    assert r.answer() == Answer(200, OK, b"7")


def test_an_interim_answer_alone_is_not_an_answer_and_eof_after_it_is_disconnected() -> None:
    r = reader()
    assert r.feed(b"HTTP/1.1 100 Continue\r\n\r\n") is False
    assert not r.head_done
    with pytest.raises(Disconnected):
        r.eof(clean=True)


def test_101_switching_protocols_is_an_error() -> None:
    with pytest.raises(BrokenBody, match="101"):
        reader().feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n")


def test_a_second_answer_behind_the_first_makes_the_connection_unusable() -> None:
    r = reader()
    assert r.feed(answer(OK) + answer(b'{"stolen":1}')) is True
    assert not r.reusable
    assert r.answer().body == OK
    r2 = reader()
    assert r2.feed(answer(OK) + b"garbage") is True
    assert not r2.reusable


def test_bytes_after_the_answer_in_a_later_read_make_it_unusable() -> None:
    r = reader()
    assert r.feed(answer(OK)) is True
    assert r.reusable
    r.feed(b"HTTP/1.1 200 OK\r\n")
    assert not r.reusable


# What a stray partial answer leaves behind: each alone, in the answer's own read, once started
# a parser that is mid-message for whatever comes next on the connection.
STRAYS = [
    b"H",
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
    b"x",
]


@pytest.mark.parametrize("stray", STRAYS)
@pytest.mark.parametrize("when", ["same read", "later read"])
def test_any_byte_after_a_whole_answer_makes_the_connection_unusable(stray: bytes, when: str) -> None:
    r = reader()
    if when == "same read":
        assert r.feed(answer(OK) + stray) is True
    else:
        assert r.feed(answer(OK)) is True
        assert r.feed(stray) is True
    assert not r.reusable
    assert r.answer() == Answer(200, OK, None)  # the answer itself stands


def test_a_stray_status_line_never_becomes_the_next_exchanges_answer() -> None:
    """Without the stray marking the connection, the next answer on it would be read as header
    lines of the stray message ("Invalid header token")."""
    r = reader()
    assert r.feed(answer(OK, b"Retry-After: 3\r\n") + b"HTTP/1.1 503 Service Unavailable\r\n") is True
    assert (r.status, r.retry_after, r.reusable) == (200, b"3", False)


def test_connection_close_and_http10_answers_are_not_reusable() -> None:
    r = reader()
    assert r.feed(answer(OK, b"Connection: close\r\n")) is True
    assert not r.reusable
    r = reader()
    assert r.feed(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), OK)) is True
    assert not r.reusable


def test_the_reader_serves_several_exchanges_in_turn() -> None:
    r = AnswerReader(HeadLimits())
    for n in range(3):
        r.start(LIMIT)
        body = b'{"n":%d}' % n
        assert r.feed(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(body)) is True
        assert r.reusable
        assert r.answer().body == body


# -- bodies that end early -------------------------------------------------------------------


def test_a_close_delimited_body_is_whole_only_on_an_orderly_close() -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    r = reader()
    assert r.feed(head + OK[:10]) is False
    assert r.feed(OK[10:]) is False
    assert r.eof(clean=True) is True
    assert r.answer().body == OK
    r = reader()
    r.feed(head + OK[:10])
    with pytest.raises(BrokenBody, match="cut off"):
        r.eof(clean=False)


@pytest.mark.parametrize("clean", [True, False])
def test_a_cut_content_length_or_chunked_body_is_broken(clean: bool) -> None:
    r = reader()
    r.feed(answer(OK)[:-3])
    with pytest.raises(BrokenBody):
        r.eof(clean=clean)
    r = reader()
    r.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n")
    with pytest.raises(BrokenBody):
        r.eof(clean=clean)


def test_a_cut_head_is_disconnected() -> None:
    r = reader()
    r.feed(b"HTTP/1.1 200 OK\r\nContent-Le")
    with pytest.raises(Disconnected):
        r.eof(clean=True)


# -- bounds on the head ----------------------------------------------------------------------


def test_an_endless_header_line_ends_at_the_line_bound_fed_bytewise_or_in_pieces() -> None:
    limits = HeadLimits(max_bytes=32 * 1024, max_headers=100, max_line=100)
    r = reader(limits)
    r.feed(b"HTTP/1.1 200 OK\r\nX-Endless: ")
    with pytest.raises(HeadTooLarge, match="line"):
        for _ in range(200):
            r.feed(b"a")
    r = reader(limits)
    with pytest.raises(HeadTooLarge, match="line"):
        r.feed(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200 + b"\r\n\r\n")


def test_head_bytes_are_bounded_across_many_short_lines_and_interim_heads() -> None:
    limits = HeadLimits(max_bytes=1024, max_headers=1000, max_line=8190)
    r = reader(limits)
    fed = 0
    with pytest.raises(HeadTooLarge, match="head"):
        r.feed(b"HTTP/1.1 200 OK\r\n")
        while fed < 10_000:
            fed += 8
            r.feed(b"X-A: 1\r\n")
    assert fed <= 1024
    r = reader(limits)
    with pytest.raises(HeadTooLarge, match="head"):
        r.feed(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)


def test_a_40_mb_header_arriving_in_one_read_is_refused_without_parsing_it() -> None:
    r = reader()
    with pytest.raises(HeadTooLarge):
        r.feed(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (40 * 1024 * 1024))


def test_header_count_is_bounded() -> None:
    r = reader(HeadLimits(max_bytes=64 * 1024, max_headers=10, max_line=8190))
    with pytest.raises(HeadTooLarge, match="10 header"):
        r.feed(b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 11 + b"\r\n")
    r = reader(HeadLimits(max_bytes=64 * 1024, max_headers=10, max_line=8190))
    assert r.feed(answer(OK, b"X-A: 1\r\n" * 9)) is True


def test_a_head_at_its_bounds_passes_and_a_big_body_after_it_is_not_a_long_line() -> None:
    limits = HeadLimits(max_bytes=512, max_headers=100, max_line=200)
    body = b'"' + b"x" * 900 + b'"'
    r = reader(limits, limit=4096)
    assert r.feed(answer(body, b"X-Line: " + b"a" * 190 + b"\r\n")) is True
    assert r.answer().body == body


# -- bounds on the body ----------------------------------------------------------------------


def test_a_body_over_the_limit_is_too_large_announced_or_found() -> None:
    with pytest.raises(AgentRejected) as caught:
        reader().feed(answer(b"x" * (LIMIT + 1)))
    assert caught.value.to_error()["code"] == "RESPONSE_TOO_LARGE"
    r = reader()
    r.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(AgentRejected):
        for _ in range(LIMIT):
            r.feed(b"10\r\n" + b"x" * 16 + b"\r\n")


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate", b"raw-deflate"])
def test_compressed_answers_are_inflated_and_checked_for_their_end(encoding: bytes) -> None:
    if encoding == b"gzip":
        packed = gzip.compress(OK)
    elif encoding == b"deflate":
        packed = zlib.compress(OK)
    else:
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = squeeze.compress(OK) + squeeze.flush()
    name = encoding.replace(b"raw-", b"")
    r = reader()
    assert feed_bytewise(r, answer(packed, b"Content-Encoding: %s\r\n" % name)) is True
    assert r.answer().body == OK
    r = reader()
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nConnection: close\r\n\r\n" % name
    r.feed(head + packed[:-4])
    with pytest.raises(BrokenBody, match="cut off"):
        r.eof(clean=True)


def test_a_gzip_bomb_is_refused_at_the_inflated_limit_without_inflating_it_all() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # about 64 KB on the wire
    limit = 256 * 1024
    r = reader(limit=limit)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    r.feed(head)
    with pytest.raises(AgentRejected, match="decoded"):
        for start in range(0, len(bomb), 4096):
            piece = bomb[start : start + 4096]
            r.feed(b"%x\r\n%s\r\n" % (len(piece), piece))
    assert r._inflated <= limit + 1


def test_the_compressed_stream_itself_is_bounded() -> None:
    noise = gzip.compress(random.Random(7).randbytes(2 * LIMIT))  # incompressible: over LIMIT
    assert len(noise) > LIMIT
    r = reader()
    r.feed(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n")
    with pytest.raises(AgentRejected):
        r.feed(noise)


def test_garbage_in_a_gzip_body_is_broken() -> None:
    with pytest.raises(BrokenBody, match="gzip"):
        reader().feed(answer(b"not gzip at all", b"Content-Encoding: gzip\r\n"))


def test_a_malformed_status_line_is_broken() -> None:
    with pytest.raises(BrokenBody, match="malformed"):
        reader().feed(b"HTTX/1.1 200 OK\r\n\r\n")


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"


def test_trailer_lines_count_toward_the_header_line_bound_sent_whole_or_without_end() -> None:
    """A chunked answer's trailer lines come after its head is whole, past the head's byte bound:
    they count toward the header lines' bound, so an agent cannot send them without end (the
    answer's byte limit counts only its body)."""
    limits = HeadLimits(max_bytes=32 * 1024, max_headers=10, max_line=8190)
    r = reader(limits)
    with pytest.raises(HeadTooLarge, match="10 header"):
        r.feed(_CHUNKED_HEAD + b"X-T: 1\r\n" * 11 + b"\r\n")
    r = reader(limits)
    r.feed(_CHUNKED_HEAD)
    fed = 0
    with pytest.raises(HeadTooLarge, match="10 header"):
        while fed < 10_000:
            fed += 1
            r.feed(b"X-T: %d\r\n" % fed)
    assert fed <= 11  # a line is handed over as the next begins
    r = reader(limits)
    assert r.feed(_CHUNKED_HEAD + b"X-T: 1\r\n" * 9 + b"\r\n") is True  # 10 lines in all
    assert r.answer().body == b"{}"


def test_a_streamed_answers_trailer_lines_are_bounded_too() -> None:
    """The stream's reader takes the body's reads by feed_body: its trailers are bounded there."""
    from reachmesh.transport.streamconn import _StreamReader

    r = _StreamReader(HeadLimits(max_bytes=32 * 1024, max_headers=10, max_line=8190), LIMIT)
    r.feed(_CHUNKED_HEAD)
    fed = 0
    with pytest.raises(HeadTooLarge, match="10 header"):
        while fed < 10_000:
            fed += 1
            r.feed_body(memoryview(b"X-T: %d\r\n" % fed))
    assert fed <= 11  # a line is handed over as the next begins
