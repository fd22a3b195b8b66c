"""How much a stream reads at once (transport/streamconn.py): its reads share one buffer, and a
read never takes more than keeps the stream within READ_BUFFER bytes held while its caller is
behind (WAITED_READ while the relay waits for the bytes). Bytes in through the buffered-protocol
calls the loop makes, no socket."""

from __future__ import annotations

import asyncio

from reachmesh.sse import SseLimits
from reachmesh.transport.answer import DEFAULT_HEAD
from reachmesh.transport.pieces import Chunk, StreamBounds
from reachmesh.transport.streamconn import _MIN_READ as MIN_READ
from reachmesh.transport.streamconn import HIGH_WATER, READ_BUFFER, WAITED_READ, LeanAgentStream
from reachmesh.transport.streaming import raw_piece

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000000\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class _Conn:
    def __init__(self) -> None:
        self.transport = _Transport()


class _Pool:
    read_buffer = None


def _stream(pool: _Pool) -> tuple[LeanAgentStream, _Transport]:
    bounds = StreamBounds(idle_s=5.0, deadline=1e12, sse=SseLimits(), plain_limit=1 << 20)
    conn = _Conn()
    return LeanAgentStream(pool, conn, bounds, raw_piece, DEFAULT_HEAD), conn.transport  # type: ignore[arg-type]


def _read(stream: LeanAgentStream, data: bytes) -> None:
    """What the loop does for one read: ask for the buffer, fill it, say how much."""
    buffer = stream.get_buffer(-1)
    assert len(data) <= len(buffer)
    buffer[: len(data)] = data
    stream.buffer_updated(len(data))


async def test_a_slow_callers_stream_holds_at_most_the_read_buffer() -> None:
    stream, transport = _stream(_Pool())
    _read(stream, HEAD)
    event = b'event: chunk\ndata: "' + b"x" * 1000 + b'"\n\n'
    held = 0
    while not transport.paused:  # nobody asks for the events: the caller is slow
        room = len(stream.get_buffer(-1))
        assert held + room <= READ_BUFFER
        data = (event * (room // len(event) + 1))[:room]
        _read(stream, data)
        held += len(data)
    assert HIGH_WATER < held <= READ_BUFFER == 512 * 1024  # the bound in docs/limits.md
    # The stream's events are read in order once the caller asks, and reading goes on.
    pieces = stream.ready()
    assert len(pieces) == held // len(event)
    assert not transport.paused


async def test_the_pools_streams_share_one_buffer() -> None:
    pool = _Pool()
    (first, _), (second, _) = _stream(pool), _stream(pool)
    assert first.get_buffer(-1).obj is second.get_buffer(-1).obj
    assert len(first.get_buffer(-1)) == READ_BUFFER


def _events(size: int) -> bytes:
    event = b'event: chunk\ndata: "' + b"x" * 1000 + b'"\n\n'
    return (event * (size // len(event) + 1))[:size]


async def test_reading_goes_on_past_high_water_while_the_relay_waits_for_the_bytes() -> None:
    """A relay waiting for the next event takes what a read brings in this turn of the loop:
    reading is not paused for it (two epoll changes per read, for nothing), a read may take up to
    WAITED_READ (a quarter of the reads of READ_BUFFER ones, for the Router's CPU), and the stream still
    never holds more than WAITED_READ, pausing when the next read would be too small."""
    stream, transport = _stream(_Pool())
    _read(stream, HEAD)
    waiting = asyncio.ensure_future(stream.next())
    for _ in range(10):
        if stream._waiter is not None:
            break
        await asyncio.sleep(0)  # one turn: the relay reaches its wait
    assert stream._waiter is not None
    assert len(stream.get_buffer(-1)) == WAITED_READ == 4 * READ_BUFFER  # the bound in docs/limits.md
    held = 0
    sizes = iter([HIGH_WATER + 1000, READ_BUFFER])  # reads of what the agent had sent, then whole
    while not transport.paused:  # the loop's reads in one turn, before the relay runs
        room = len(stream.get_buffer(-1))
        size = min(next(sizes, room), room)
        assert held + room <= WAITED_READ
        _read(stream, _events(size))
        held += size
        if held <= WAITED_READ - MIN_READ:
            assert not transport.paused
    assert READ_BUFFER < WAITED_READ - MIN_READ < held <= WAITED_READ
    assert isinstance(await waiting, Chunk)  # the relay takes them, and reading resumes
    assert stream.ready() and not transport.paused


async def test_a_plain_answer_is_read_whole_past_the_streams_bounds() -> None:
    """A plain answer (not an event stream) is bounded by the answer limit, not by the stream's
    read bounds: reading never pauses for it (nothing would resume it: it stalled to the
    deadline)."""
    stream, transport = _stream(_Pool())
    body = b'"' + b"y" * (900 * 1024) + b'"'
    _read(
        stream, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    at = 0
    while at < len(body):
        room = len(stream.get_buffer(-1))
        _read(stream, body[at : at + room])
        at += room
        assert not transport.paused
    assert await asyncio.wait_for(stream.whole(), 5) == body
