"""The JSON codec: exact integers up to 4,300 digits, and no recursion at any nesting it accepts."""

from __future__ import annotations

import json
import sys
import time
import tracemalloc

import pytest

from reachmesh import jsoncodec

VALID = [
    b'{"a":[1,2,{"b":12345678901234567890123}],"c":"x\\u00e9\\n","d":-0.5e3,"e":true,"f":null}',
    b"[]",
    b"{}",
    b" 12345678901234567890 ",
    b'"1234567890123456789012"',
    b"[[[]],[{}],-12345678901234567890]",
    b'{"a":1,"a":12345678901234567890}',
]
INVALID = [
    b"[1,]",
    b'{"a":1,}',
    b"[1 2]",
    b'{"a" 1}',
    b"{1:2}",
    b"[",
    b"]",
    b'{"a":1}}',
    b"[1]x",
    b",",
    b"{,}",
    b"[,1]",
    b'{"a"}',
    b'{"a":}',
    b"01",
    b"1.",
    b"[1,,2]",
    b'{"a":1 "b":2}',
    b"[}",
    b"{]",
    b"",
    b"[NaN]",
]


@pytest.mark.parametrize("text", VALID)
def test_the_exact_parser_reads_what_the_standard_library_reads(text: bytes) -> None:
    """Same values, integers exact, duplicate keys last-wins."""
    assert jsoncodec._exact(text) == json.loads(text)


@pytest.mark.parametrize("text", INVALID)
def test_the_exact_parser_refuses_what_is_not_json(text: bytes) -> None:
    """Every malformed document is a JSONDecodeError, with a 19-digit integer in it or not."""
    for doc in (text, text.replace(b"1", b"1234567890123456789012", 1)):
        with pytest.raises(jsoncodec.JSONDecodeError):
            jsoncodec._exact(doc)


@pytest.mark.parametrize("shape", ["[", '{"k":'])
def test_a_long_integer_deep_inside_is_read_and_written_without_recursion(shape: str) -> None:
    """970 levels around a 20-digit integer: read exactly and written back byte for byte, even with
    the recursion limit lowered to where any per-level recursion would fail."""
    close = "]" if shape == "[" else "}"
    text = (shape * 970 + "12345678901234567890" + close * 970).encode()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(150)  # restored below: the test, not the library, changes it
    try:
        value = jsoncodec.loads(text)
        assert jsoncodec.dumps(value) == text
    finally:
        sys.setrecursionlimit(limit)
    for _ in range(970):
        value = value[0] if shape == "[" else value["k"]
    assert value == 12345678901234567890


def test_integers_keep_every_digit_up_to_4300() -> None:
    """309 to 4,300 digits: exact (orjson alone refused them as infinity); 4,301: refused by name."""
    for digits in (309, 1000, 4300):
        number = int("7" * digits)
        assert jsoncodec.loads(b'{"n":-' + b"7" * digits + b"}") == {"n": -number}
        assert jsoncodec.dumps([number]) == b"[" + b"7" * digits + b"]"
    with pytest.raises(jsoncodec.JSONDecodeError, match="digits; at most 4300"):
        jsoncodec.loads(b"[" + b"7" * 4301 + b"]")
    # An interpreter whose own limit was raised: the documented one still holds.
    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(10_000)  # restored below: the test, not the library, changes it
    try:
        with pytest.raises(jsoncodec.JSONDecodeError, match="4301 digits; at most 4300"):
            jsoncodec.loads(b"[" + b"7" * 4301 + b"]")
        assert jsoncodec.loads(b"[" + b"7" * 4300 + b"]") == [int("7" * 4300)]
    finally:
        sys.set_int_max_str_digits(saved)
    with pytest.raises(jsoncodec.JSONDecodeError, match="infinity"):
        jsoncodec.loads(b"[1e400]")
    with pytest.raises(jsoncodec.JSONDecodeError):
        jsoncodec.loads(b'["\\ud800", ' + b"7" * 400 + b"]")  # a lone surrogate, as orjson refuses it


def test_a_big_shallow_document_with_a_huge_integer_takes_the_fast_exact_path() -> None:
    """4 MB of ordinary JSON around one 400-digit integer (which orjson refuses as infinity) is
    read exactly, by the standard library's C parser: the token loop would spend seconds."""
    items = b",".join(b'{"id":%d,"name":"item","tags":["a","b"]}' % i for i in range(100_000))
    text = b'{"items":[' + items + b'],"big":' + b"9" * 400 + b"}"
    started = time.process_time()
    value = jsoncodec.loads(text)
    took = time.process_time() - started
    assert value["big"] == int("9" * 400) and len(value["items"]) == 100_000
    print(f"\n{len(text) / 1e6:.1f} MB with a 400-digit integer read in {took:.2f} s of CPU")
    with pytest.raises(jsoncodec.JSONDecodeError, match="more than 4300 digits; at most 4300"):
        jsoncodec.loads(b"[" + items + b"," + b"9" * 4301 + b"]")
    with pytest.raises(jsoncodec.JSONDecodeError):
        jsoncodec.loads(b"[NaN, " + b"9" * 400 + b"]")


def test_a_big_deep_document_with_a_long_integer_is_refused_not_read_slowly() -> None:
    """Deeper than 200 levels, with a 20-digit integer, over 256 KiB: refused by name (reading
    it exactly would hold the event loop for about a microsecond a byte); under it, read."""
    filler = b'"' + b"x" * 1000 + b'",'
    big = b"[" * 300 + filler * 300 + b"12345678901234567890" + b"]" * 300
    with pytest.raises(jsoncodec.JSONDecodeError, match="read exactly up to 262144 bytes"):
        jsoncodec.loads(big)
    small = b"[" * 300 + filler * 10 + b"12345678901234567890" + b"]" * 300
    value = jsoncodec.loads(small)
    for _ in range(299):
        value = value[0]
    assert value[-1] == 12345678901234567890


def test_dumps_gives_bytes_in_memory_of_their_own_size() -> None:
    """The Router keeps an attempt's body for the whole attempt: orjson's result sat in a 4 KiB
    buffer (64 KiB for a 5 KB string), most of the Router's memory per call in flight."""
    values = [{"targetTask": "echo", "payload": {"n": i}} for i in range(200)] + [{"text": "x" * 5000}]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [jsoncodec.dumps(value) for value in values]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    text = sum(len(blob) for blob in kept)
    # Each bytes object has a 33-byte header, and the list its slots.
    assert held < text + 64 * len(kept) + 4096, (held, text)
