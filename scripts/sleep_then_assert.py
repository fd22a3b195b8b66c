"""Fail on a test that sleeps and then asserts: a fixed wait races a busy machine.

Flags a ``sleep(...)`` call (time or asyncio) followed within three statements by an ``assert``
or ``pytest.raises``, in its block or just after it (past a ``finally``): the shape of "wait a
while, then check". A sleep ending a poll loop's body, a handler's simulated work, or a sleep
that is itself the stimulus (time passing) followed by other statements does not match; a sleep
that must stay says why on the line above it, ``# sleep-ok: <reason>``. Poll with a deadline instead
(``tests.helpers.until``, ``tests.procs.wait_for``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SLEEP = re.compile(r"^(\s*)(?:await\s+)?(?:asyncio|time|bg\.run\(asyncio)\.sleep\(")
CHECK = re.compile(r"^\s*(?:assert\b|with pytest\.raises\b)")
SLEEP_OK = re.compile(r"^\s*# sleep-ok: \S")
DEF = re.compile(r"^\s*(?:async\s+)?def\b")
LOOP = re.compile(r"^\s*(?:for|while|async for)\b")
CLAUSE = re.compile(r"^\s*(?:finally|else|except\b[^:]*)\s*:")
BLOCK = re.compile(
    r"^\s*(?:for|while|if|elif|else|with|async with|async for|try|except|finally|def|async def)\b"
)


def _depth(line: str) -> int:
    return len(line) - len(line.lstrip())


def _headers(lines: list[str], number: int) -> list[str]:
    """The lines opening each block that holds line ``number``, innermost first."""
    found: list[str] = []
    depth = _depth(lines[number])
    for line in reversed(lines[:number]):
        if line.strip() and not line.strip().startswith("#") and _depth(line) < depth:
            found.append(line)
            depth = _depth(line)
    return found


def _check_follows(lines: list[str], number: int) -> bool:
    """Whether an assert comes within three statements after the sleep on line ``number``.

    Leaving the sleep's block continues the search after it (past a ``finally`` or ``except``
    body), unless that leaves a loop: a sleep inside a loop body is a poll.
    """
    indent = _depth(lines[number])
    if number and SLEEP_OK.match(lines[number - 1]):
        return False
    enclosing = _headers(lines, number)
    statements = 0
    for line in _code(lines[number + 1 :]):
        depth = _depth(line)
        if depth > indent:
            continue  # the rest of a multi-line statement, or a skipped clause's body
        if depth < indent:
            if any(LOOP.match(h) or DEF.match(h) for h in enclosing if _depth(h) >= depth):
                return False  # a poll's loop, or a function's own work (a fake server's pause)
            indent = depth
        if CLAUSE.match(line):
            continue
        if CHECK.match(line):
            return True
        statements += 1
        if BLOCK.match(line) or statements == 3:
            return False
    return False


def _code(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def findings(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [
        f"{path}:{number + 1}: sleep then assert: {line.strip()}"
        for number, line in enumerate(lines)
        if SLEEP.match(line) and _check_follows(lines, number)
    ]


def main(root: str = "tests") -> int:
    found = [hit for path in sorted(Path(root).rglob("*.py")) for hit in findings(path)]
    for hit in found:
        print(hit)
    if found:
        print("poll with a deadline instead (tests.helpers.until, tests.procs.wait_for)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
