"""The check of a chunk event's data (protocol §14: one JSON value), bytes in and bytes out.

A large chunk is read by a quicker reader than a small one; both must accept and refuse the
same texts, and a valid chunk goes on as the agent wrote it (on one line).
"""

from __future__ import annotations

import pytest

from reachmesh.exceptions import BadAgentResponse
from reachmesh.sse import RawEvent, RawSseParser
from reachmesh.transport.streaming import Chunk, checked_raw, raw_piece

TEXT = b"x" * 5000  # past the size from which the quicker reader is used


@pytest.mark.parametrize(
    "raw",
    [
        b'"' + TEXT + b'"',
        b'{"n": 1, "text": "' + TEXT + b'", "more": [true, null, -1.5e3]}',
        b'["' + TEXT + b'", 123456789012345678901234567890]',  # past 64 bits: valid JSON
        b"[" + b"1," * 3000 + b"1]",  # more values than the quick look goes over
        b'"short"',
        b"[" * 600 + b'"' + TEXT + b'"' + b"]" * 600,  # nested, within every reader's depth
    ],
)
def test_valid_chunks_go_on_as_written(raw: bytes) -> None:
    assert checked_raw(raw) == raw


def test_a_chunk_over_several_lines_goes_on_as_one() -> None:
    assert checked_raw(b'{"a":\n"' + TEXT + b'"}') == b'{"a": "' + TEXT + b'"}'


@pytest.mark.parametrize("size", [10, len(TEXT)])
def test_the_relay_reads_a_chunks_lines_as_the_parser_counts_them(size: int) -> None:
    """The parser says how many data lines an event had: one line goes on as it is (no look
    for a break), several are joined with spaces, whichever reader checks them."""
    text = b"y" * size
    stream = (
        b': hi\n\nevent: chunk\ndata: [1,\ndata: "' + text + b'"]\n\nevent: chunk\ndata: "' + text + b'"\n\n'
    )
    several, one = RawSseParser().feed(stream)
    assert (several.lines, one.lines) == (2, 1)
    assert raw_piece(several) == Chunk(b'[1, "' + text + b'"]')
    assert raw_piece(one) == Chunk(b'"' + text + b'"')


@pytest.mark.parametrize(
    "raw",
    [
        b'"' + TEXT,  # cut off
        b'"' + TEXT + b'\t"',  # a raw control character in a string
        b'"' + TEXT + b'\xff"',  # not UTF-8
        b'"' + TEXT + b'" trailing',
        b'["' + TEXT + b'", NaN]',
        b'["' + TEXT + b'", 1e999]',  # a number past a double's range, within the quick look
        b"[" + b"1," * 3000 + b"1e999]",  # and past it
        b'"' + TEXT + b'\\ud800"',  # a lone surrogate
        b"",
        b"[" * 100_000 + b"]" * 100_000,  # nested past every reader's depth: refused, no RecursionError
        b'{"a":' * 100_000 + b'"' + TEXT + b'"' + b"}" * 100_000,
        b"[" * 100_000,
    ],
)
def test_invalid_chunks_are_refused(raw: bytes) -> None:
    with pytest.raises(BadAgentResponse, match="not JSON"):
        checked_raw(raw)


FLAT = [b'"' + TEXT + b'"', b"1", b"true", b"null"]


@pytest.mark.parametrize(
    "raw",
    [
        b'"' + TEXT + b'"',
        b"12345678901234567890123456789012345678901234567890" + b" " * 3000,  # an integer alone
        b'[7,"' + TEXT + b'"]',  # the bench's chunk: a flat list, read in one loop
        b"[" + b",".join(FLAT * 15 + [b"1"] * 3) + b"]",  # 63 values: the most the one loop takes
        b"[" + b",".join(FLAT * 16) + b"]",  # 64: the whole look
        b"[" + b",".join(FLAT * 16 + [b"1e999"]) + b"]",  # past the look, an infinity: refused
        b'["' + TEXT + b'", 1.5, [1e999]]',  # a float and a nested infinity: refused
        b'["' + TEXT + b'", 1e999]',
        b'["' + TEXT + b'", {"a": -1e999}]',
        b'["' + TEXT + b'" 1]',  # not JSON
        b'{"a":\n"' + TEXT + b'"}',
    ],
)
@pytest.mark.parametrize("lines", [1, 2])
def test_the_relays_piece_of_a_chunk_is_what_the_check_gives(raw: bytes, lines: int) -> None:
    """The relay reads a chunk event with the check in line (once per event of a large stream):
    the same text goes on, or the same refusal, as :func:`checked_raw` gives, for every shape
    the quick reader takes in one loop, looks over, or leaves to the exact one."""
    try:
        expected: Chunk | str = Chunk(checked_raw(raw, lines))
    except BadAgentResponse as exc:
        expected = str(exc)
    try:
        got: object = raw_piece(RawEvent(b"chunk", raw, lines))
    except BadAgentResponse as exc:
        got = str(exc)
    assert got == expected
