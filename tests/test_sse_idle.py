"""Runs of lines that change nothing are skipped in one scan, with the same events and bounds.

Bytes in, events out: what the line-by-line reader would give, however the reads fall.
"""

from __future__ import annotations

import time

import pytest

from reachmesh.sse import RawEvent, RawSseParser, SseError, SseLimits

IDLE = [
    b": ping\n",
    b"\n",
    b"\r\n",
    b"\r",
    b"id: 7\n",
    b"retry: 10\n",
    b"foo\n",
    b"event: x\n\n",
    b"dataz: 1\n",
]


def events_of(data: bytes, cut: int, limits: SseLimits | None = None) -> list[RawEvent]:
    parser = RawSseParser(limits or SseLimits())
    out = parser.feed(data[:cut]) + parser.feed(data[cut:])
    parser.eof()
    return out


@pytest.mark.parametrize("idle", IDLE)
def test_idle_runs_between_and_inside_events_change_nothing(idle: bytes) -> None:
    # Inside an event only the ignored fields are idle: a blank line (or an event's end) ends it.
    inside = idle if idle.strip() and not idle.startswith(b"event") else b""
    body = b"event: chunk\ndata: 1\n\n" + idle * 50 + b"event: chunk\n" + inside * 3
    body += b"data: 2\n\n" + idle * 5 + b"event: done\ndata: {}\n\n"
    want = [RawEvent(b"chunk", b"1"), RawEvent(b"chunk", b"2"), RawEvent(b"done", b"{}")]
    for cut in range(len(body) + 1):
        assert events_of(body, cut) == want, (idle, cut)


def test_a_cr_ending_a_run_at_the_end_of_a_read_takes_its_lf_from_the_next() -> None:
    body = b"event: chunk\ndata: 1\n\n: a\r\n: b\r\nevent: chunk\r\ndata: 2\r\n\r\n"
    for cut in range(len(body) + 1):
        assert events_of(body, cut) == [RawEvent(b"chunk", b"1"), RawEvent(b"chunk", b"2")], cut


def test_an_idle_line_over_the_line_bound_is_still_refused() -> None:
    parser = RawSseParser(SseLimits(max_line=256))
    parser.feed(b"event: chunk\ndata: 1\n\n")
    with pytest.raises(SseError, match="line is over 256 bytes"):
        parser.feed(b":" + b"x" * 300 + b"\n")


def cpu_to_read(blob: bytes, reads: int) -> float:
    """The least CPU time of three readings of ``reads`` copies of ``blob``."""
    best = float("inf")
    for _ in range(3):
        parser = RawSseParser()
        parser.feed(b"event: chunk\ndata: 1\n\n")
        began = time.process_time()
        for _ in range(reads):
            parser.feed(blob)
        best = min(best, time.process_time() - began)
    return best


def test_comment_lines_cost_less_than_the_chunks_of_as_many_bytes() -> None:
    """The CPU cost is what this is about: read line by line, `:` lines took several times the
    CPU of as many bytes of the smallest chunk events (1 against 8 MB/s; now about 20), so a
    stream of comments was a cheap way to keep a core busy. A ratio of two readings in one
    process, not a time."""
    comments = cpu_to_read(b":\n" * 32768, 8)
    chunks = cpu_to_read(b"event: chunk\ndata: 1\n\n" * 3120, 8)
    assert comments < chunks, (comments, chunks)
