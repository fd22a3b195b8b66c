"""A stream's bytes are parsed a budget at a time, the loop running between (streamconn.py).

Found by an attacker's probe: a read of half a megabyte of empty, unnamed events (``data:\\n\\n``,
which the relay ignores) was parsed and thrown away in one go, holding the Router's loop half a
second per read: two such streams held /healthz at 1 to 2 s. Bytes in through the
buffered-protocol calls the loop makes, no socket; the loop's turns are counted, not timed.
"""

from __future__ import annotations

import asyncio

from reachmesh.transport.pieces import Chunk
from reachmesh.transport.streamconn import PARSE_STEPS, READ_BUFFER
from tests.transport.test_stream_reads import HEAD, _Pool, _read, _stream


async def test_a_read_of_ignored_events_lets_the_loop_run_between_budgets() -> None:
    stream, _ = _stream(_Pool())
    _read(stream, HEAD)
    chunk = b"event: chunk\ndata: 1\n\n"
    empties = (READ_BUFFER - len(chunk)) // 7
    _read(stream, b"data:\n\n" * empties + chunk)
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    try:
        piece = await asyncio.wait_for(stream.next(), 10)
    finally:
        ticking.cancel()
    assert isinstance(piece, Chunk) and piece.raw == b"1"
    # A turn of the loop after each budget of steps (an empty event is two: its data line and
    # its end): about 36 here; parsed in one go, none (the ticker never ran).
    assert turns >= empties * 2 // PARSE_STEPS // 2, turns


async def test_ready_parses_one_budget_and_leaves_the_rest_for_the_next_turn() -> None:
    stream, _ = _stream(_Pool())
    _read(stream, HEAD)
    _read(stream, b"data:\n\n" * 20_000 + b"event: chunk\ndata: 2\n\n")
    assert stream.ready() == []  # the chunk is past the first budget
    pieces: list[Chunk] = []
    for _ in range(20):
        pieces += [p for p in stream.ready() if isinstance(p, Chunk)]
        if pieces:
            break
    assert [p.raw for p in pieces] == [b"2"]
