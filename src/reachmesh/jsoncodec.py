"""JSON in and out without losing a number, and without nesting past a limit.

orjson is the fast path, but it reads an integer beyond 64 bits as a float
(``123456789012345678901234567890`` became ``1.2345678901234568e+29``) and refuses to write one.
A Router must pass on what it does not understand unchanged, so:

- :func:`loads` parses with orjson (which also refuses NaN, bad UTF-8 and absurd nesting); when
  the text holds a run of 19 or more digits, or orjson refuses an integer as too big for a
  double, it parses again with :func:`_exact`, whose integers are exact. Floats are IEEE doubles
  either way, as RFC 8259 allows; a float beyond a double's range is refused.
- Integers keep every digit up to :data:`MAX_INT_DIGITS` (4,300, Python's own default limit for
  turning text into an ``int``); a longer one is refused as invalid JSON, so the limit is the
  same whatever ``sys.set_int_max_str_digits`` says.
- :func:`dumps` writes with orjson, and without it when an integer is too big or the nesting
  deeper than orjson writes (255).
- Neither fallback recurses: a document nested 1,000 deep is a loop with a stack, not 1,000
  Python frames, so it can never end in a RecursionError (a 500 where an answer was due).
- :func:`depth` measures nesting so callers can refuse a document deeper than they allow before
  anything recurses over it.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import accumulate
from typing import Any

import orjson

# 19 digits: the shortest integer that may fall outside the 64-bit range orjson keeps exact.
_LONG_DIGITS = re.compile(rb"\d{19,}")

JSONDecodeError = orjson.JSONDecodeError

# The longest integer kept exactly; Python's default for int(str), fixed here rather than read
# from the interpreter so that the documented limit holds everywhere.
MAX_INT_DIGITS = 4300
# orjson's own limit, kept by the exact parser too.
MAX_DEPTH = 1024

_TOKEN = re.compile(
    rb"""[ \t\n\r]*(?:
      (?P<str>"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")
    | (?P<num>-?(?:0|[1-9][0-9]*)(?P<real>(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?))
    | (?P<lit>true|false|null)
    | (?P<punct>[{}\[\],:])
    )""",
    re.VERBOSE,
)
# The standard library's parser recurses once per level; at most this deep it stays far from
# the interpreter's recursion limit (1,000 frames, shared with the caller's own stack).
_C_PARSER_DEPTH = 200
# The most bytes of a deeper document read by the loop in _exact (about a microsecond a byte,
# so about a quarter of a second of the event loop at most).
MAX_DEEP_EXACT_BYTES = 256 * 1024
_TRAILING_SPACE = re.compile(rb"[ \t\n\r]*")
_LITERALS: dict[bytes, Any] = {b"true": True, b"false": False, b"null": None}


def loads(raw: bytes | str) -> Any:
    """The decoded document; raises :class:`JSONDecodeError` when it is not valid JSON."""
    blob = raw if raw.__class__ is bytes else _as_bytes(raw)
    try:
        data = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        # orjson reads every integer it cannot hold in 64 bits as a double, and refuses one
        # beyond a double's range: only an exact reader can say whether the text is valid.
        if "infinity" not in str(exc):
            raise
        return _exact_loads(blob, None)
    if _LONG_DIGITS.search(blob) is None:
        return data
    deep = may_nest_deeper(blob, _C_PARSER_DEPTH) and depth(data, _C_PARSER_DEPTH) > _C_PARSER_DEPTH
    return _exact_loads(blob, deep)


def _as_bytes(raw: bytes | str) -> bytes:
    return raw.encode() if isinstance(raw, str) else raw


def _exact_loads(blob: bytes, deep: bool | None) -> Any:
    """``blob`` read with exact integers: by the standard library's C parser when the document
    nests at most 200 deep (it recurses once per level, but is twenty times faster than the
    loop in _exact), else by _exact, whose cost (about a microsecond a byte) is why a deep
    document is read exactly only up to MAX_DEEP_EXACT_BYTES."""
    if deep is None:
        deep = may_nest_deeper(blob, _C_PARSER_DEPTH) and _text_depth(blob) > _C_PARSER_DEPTH
    if not deep:
        # The interpreter refuses integers over its own digit limit; only when someone has
        # changed it from the default (ours) does each integer go through a Python check,
        # which costs the C parser more than half its speed.
        own_limit = sys.get_int_max_str_digits() == MAX_INT_DIGITS
        try:
            return json.loads(
                blob, parse_int=None if own_limit else _int, parse_float=_float, parse_constant=_constant
            )
        except ValueError as exc:  # json's own JSONDecodeError, or one of the checks below
            message = getattr(exc, "msg", str(exc))
            if "Exceeds the limit" in message:
                message = f"an integer of more than {MAX_INT_DIGITS} digits; at most {MAX_INT_DIGITS}"
            raise _error(message, blob, getattr(exc, "pos", 0)) from exc
    if len(blob) > MAX_DEEP_EXACT_BYTES:
        raise _error(
            f"a document nested deeper than {_C_PARSER_DEPTH} levels with an integer over 18 digits "
            f"is read exactly up to {MAX_DEEP_EXACT_BYTES} bytes; this one has {len(blob)}",
            blob,
            0,
        )
    return _exact(blob)


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits; at most {MAX_INT_DIGITS}")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number is infinity when parsed as double")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _text_depth(blob: bytes) -> int:
    """How deep the text nests, its strings skipped: for text orjson could not read."""
    brackets = _STRING.sub(b"", blob).translate(None, _NOT_BRACKETS)
    return max(accumulate(1 if b in (0x5B, 0x7B) else -1 for b in brackets), default=0)


def _error(message: str, blob: bytes, pos: int) -> JSONDecodeError:
    return JSONDecodeError(message, blob.decode("utf-8", "replace"), pos)


def _number(token: bytes, real: bool, blob: bytes, pos: int) -> int | float:
    if real:
        value = float(token)
        if value in (float("inf"), float("-inf")):
            raise _error("number is infinity when parsed as double", blob, pos)
        return value
    digits = len(token) - token.startswith(b"-")
    if digits > MAX_INT_DIGITS:
        raise _error(f"an integer of {digits} digits; at most {MAX_INT_DIGITS}", blob, pos)
    try:
        return int(token)
    except ValueError as exc:  # the interpreter's own digit limit, set lower than ours
        raise _error(f"an integer of {digits} digits is over this interpreter's limit", blob, pos) from exc


def _exact(blob: bytes) -> Any:
    """Parse ``blob`` with exact integers, in a loop over tokens (no recursion)."""
    return _ExactParser(blob).run()


class _ExactParser:
    """A JSON parser as a loop over tokens with an explicit stack of open containers."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        # Each open container, and for an object the key awaiting its value.
        self.stack: list[tuple[dict[str, Any] | list[Any], str | None]] = []
        # What the grammar allows next: "value", "key", "colon", or "next" ("," or the close).
        self.expect = "value"

    def run(self) -> Any:
        blob, pos = self.blob, 0
        while True:
            match = _TOKEN.match(blob, pos)
            if match is None:
                raise _error("invalid JSON", blob, pos)
            pos = match.end()
            kind = match.lastgroup if match.lastgroup != "real" else "num"
            assert kind is not None
            value = self._step(kind, match)
            if value is _MORE:
                continue
            if not self.stack:  # a whole document
                if _TRAILING_SPACE.match(blob, pos).end() != len(blob):  # type: ignore[union-attr]
                    raise _error("extra data after the document", blob, pos)
                return value
            self._store(value)

    def _step(self, kind: str, match: re.Match[bytes]) -> Any:
        """The value this token completes, or _MORE when it completes none."""
        token, at, expect = match.group(kind), match.start(kind), self.expect
        if kind == "punct":
            if token in b"]}" and expect in ("value", "key", "next"):
                return self._close(token, at)
            if token == b"," and expect == "next":
                self.expect = "key" if isinstance(self.stack[-1][0], dict) else "value"
                return _MORE
            if token == b":" and expect == "colon":
                self.expect = "value"
                return _MORE
        if expect == "key":
            if kind != "str":
                raise _error("an object key must be a string", self.blob, at)
            self.stack[-1] = (self.stack[-1][0], orjson.loads(token))
            self.expect = "colon"
            return _MORE
        if expect != "value":
            raise _error("unexpected token", self.blob, at)
        if kind == "punct" and token in b"[{":
            if len(self.stack) >= MAX_DEPTH:
                raise _error(f"nested deeper than {MAX_DEPTH}", self.blob, at)
            self.stack.append(([] if token == b"[" else {}, None))
            self.expect = "key" if token == b"{" else "value"
            return _MORE
        return _scalar_value(kind, token, match, self.blob)

    def _close(self, token: bytes, at: int) -> Any:
        container = self.stack[-1][0] if self.stack else None
        is_list = isinstance(container, list)
        # "[]" closes in the value state and "{}" in the key state, only when empty.
        just_opened = not container and self.expect == ("value" if is_list else "key")
        if container is None or token != (b"]" if is_list else b"}"):
            raise _error(f"unexpected {token.decode()}", self.blob, at)
        if self.expect != "next" and not just_opened:
            raise _error(f"unexpected {token.decode()}", self.blob, at)
        self.stack.pop()
        return container

    def _store(self, value: Any) -> None:
        container, key = self.stack[-1]
        if isinstance(container, list):
            container.append(value)
        else:
            assert key is not None
            container[key] = value
            self.stack[-1] = (container, None)
        self.expect = "next"


_MORE = object()


def _scalar_value(kind: str, token: bytes, match: re.Match[bytes], blob: bytes) -> Any:
    if kind == "str":
        return orjson.loads(token)  # refuses lone surrogates, as orjson does everywhere
    if kind == "num":
        return _number(token, bool(match.group("real")), blob, match.start(kind))
    if kind == "lit":
        return _LITERALS[token]
    raise _error("unexpected token", blob, match.start(kind))


def fitted(blob: bytes) -> bytes:
    """``blob`` in memory of its own size.

    orjson returns its text in the buffer it wrote it into, never shrunk: at least 4 KiB for
    ``{}``, and 64 KiB for a 5 KB string (measured, orjson 3.13). Bytes the Router keeps (an
    attempt's body for the whole attempt, a trace hop for minutes) were most of its memory per
    call in flight; one copy of the text is far cheaper than that.
    """
    return memoryview(blob).tobytes()


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value``, in memory of its own size (:func:`fitted`); integers of
    any size are written exactly."""
    try:
        return memoryview(orjson.dumps(value)).tobytes()  # fitted(), without a call per answer
    except TypeError:
        if depth(value, _C_PARSER_DEPTH) > _C_PARSER_DEPTH:
            return _dumps_slow(value)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _scalar(value: Any) -> bytes:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


def _dumps_slow(value: Any) -> bytes:
    """What :func:`dumps` writes when orjson cannot: a loop with a stack, no recursion."""
    out: list[bytes] = []
    # Work items: a value to write, or literal bytes (a separator or a closing bracket).
    work: list[Any] = [value]
    while work:
        item = work.pop()
        if isinstance(item, _Raw):
            out.append(item.data)
        elif isinstance(item, dict):
            out.append(b"{")
            work.append(_Raw(b"}"))
            pending: list[Any] = []
            for index, (key, child) in enumerate(item.items()):
                if not isinstance(key, str):
                    raise TypeError(f"an object key must be a string, not {type(key).__name__}")
                pending.append(_Raw((b"," if index else b"") + orjson.dumps(key) + b":"))
                pending.append(child)
            work.extend(reversed(pending))
        elif isinstance(item, list | tuple):
            out.append(b"[")
            work.append(_Raw(b"]"))
            pending = []
            for index, child in enumerate(item):
                if index:
                    pending.append(_Raw(b","))
                pending.append(child)
            work.extend(reversed(pending))
        else:
            out.append(_scalar(item))
    return b"".join(out)


class _Raw:
    """Bytes already encoded, on the work stack of :func:`_dumps_slow`."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


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
