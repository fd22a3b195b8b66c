"""JSON in and out without losing a number, and without nesting past a limit.

orjson is the fast path, but it reads an integer beyond 64 bits as a float
(``123456789012345678901234567890`` became ``1.2345678901234568e+29``) and refuses to write one.
A Router must pass on what it does not understand unchanged, so:

- :func:`loads` parses with orjson (which also refuses NaN, bad UTF-8 and absurd nesting); when
  the text holds a run of 19 or more digits it parses again with the standard library, whose
  integers are exact. Floats are IEEE doubles either way, as RFC 8259 allows.
- :func:`dumps` writes with orjson, and with the standard library when an integer is too big.
- :func:`depth` measures nesting so callers can refuse a document deeper than they allow before
  anything recurses over it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# 19 digits: the shortest integer that may fall outside the 64-bit range orjson keeps exact.
_LONG_DIGITS = re.compile(rb"\d{19,}")

JSONDecodeError = orjson.JSONDecodeError


def loads(raw: bytes | str) -> Any:
    """The decoded document; raises :class:`JSONDecodeError` when it is not valid JSON."""
    data = orjson.loads(raw)
    blob = raw.encode() if isinstance(raw, str) else raw
    if _LONG_DIGITS.search(blob) is None:
        return data
    # orjson already vouched for the text (and for its depth, at most 1024), so the standard
    # library only has to keep long integers exact.
    return json.loads(blob)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value``; integers of any size are written exactly."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), counting no further than ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        stack.extend((child, level) for child in children)
    return deepest


def may_nest_deeper(raw: bytes, limit: int) -> bool:
    """False when ``raw`` cannot nest deeper than ``limit``: it opens no more brackets than that.

    A cheap test in C, so only documents with many brackets pay for :func:`depth`.
    """
    return raw.count(b"{") + raw.count(b"[") > limit
