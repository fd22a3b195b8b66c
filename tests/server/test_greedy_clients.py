"""Slow and greedy clients: bounded heads, body timeouts, and fair shares of the in-flight slots."""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx
import psutil
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

MANY_HEADERS = (
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(150))
    + b"\r\n"
)
ATTACKER = "127.0.0.2"  # another loopback address: another client to the Router
RSS_BOUND_MIB = 150


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))


async def stalled_body(port: int) -> asyncio.StreamWriter:
    """Headers promising 100 kB of body, then a few bytes, then nothing."""
    _, writer = await connect(port)
    writer.write(
        b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100000\r\n\r\n{"targetTask": '
    )
    await writer.drain()
    return writer


async def huge_header(port: int, megabytes: int = 8) -> tuple[int, asyncio.StreamWriter]:
    """A header line that never ends, sent until the Router hangs up; returns the bytes it took."""
    reader, writer = await connect(port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
    chunk = b"a" * 65536
    sent = 0
    with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
        for _ in range(megabytes * 16):
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 2)
            sent += len(chunk)
            if reader.at_eof():
                break
    return sent, writer


async def test_stalled_bodies_and_huge_headers_leave_other_clients_served() -> None:
    """1,030 stalled bodies and 50 endless headers from one client: another client's calls all
    succeed, the huge heads are cut off, and the Router's memory stays bounded."""
    process = psutil.Process(os.getpid())
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("a").start()
        await agent.register(router.url, vectors=False)
        rss_before = process.memory_info().rss
        stalled = [await stalled_body(router.port) for _ in range(1030)]
        heads = await asyncio.gather(*(huge_header(router.port) for _ in range(50)))
        try:
            async with httpx.AsyncClient(base_url=router.url, timeout=10) as http:
                answers = [await http.post("/reach", json={"targetTask": "echo"}) for _ in range(20)]
            assert [r.status_code for r in answers] == [200] * 20
            # Each endless head was cut off near the limit, far short of its 8 MB (the 431 itself
            # may be lost to the reset; test_heads_over_the_limits_are_431 reads it).
            assert max(sent for sent, _ in heads) <= 2 * 2**20
            grown_mib = (process.memory_info().rss - rss_before) / 2**20
            print(f"\nRSS grew {grown_mib:.1f} MiB with 1,030 stalled bodies and 50 endless headers")
            assert grown_mib < RSS_BOUND_MIB
            assert router.app.parts.shedder.inflight <= RouterConfig().limits.max_inflight_per_client
        finally:
            for writer in stalled + [w for _, w in heads]:
                writer.close()
            await agent.stop()


async def test_a_body_that_stalls_is_refused_408_and_frees_its_slot() -> None:
    """A client that sends headers but not the body gets 408 BODY_TIMEOUT after the timeout."""
    config = RouterConfig.model_validate({"server": {"body_timeout_seconds": 0.3}})
    async with RouterServer(config) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(
            b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50\r\n\r\n{"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 408")
        assert b"BODY_TIMEOUT" in head
        assert router.app.parts.shedder.inflight == 0


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(150))
            + b"\r\n",
            431,
        ),
        (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
)
async def test_heads_over_the_limits_are_431(head: bytes, status: int) -> None:
    """More than 100 header lines, or a head over 64 KiB, is refused before the app runs."""
    async with RouterServer(RouterConfig()) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(head)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 %d" % status)


def exact_head(size: int) -> tuple[bytes, bytes]:
    """A GET /healthz head of exactly ``size`` bytes, most of them in its URL, cut in two inside
    the URL: the request line counts toward the head's bound however its pieces arrive."""
    fixed = b"GET /healthz?q= HTTP/1.1\r\nHost: localhost\r\nX-Pad: 0123456789\r\n\r\n"
    url = b"/healthz?q=" + b"u" * (size - len(fixed))
    head = b"GET %s HTTP/1.1\r\nHost: localhost\r\nX-Pad: 0123456789\r\n\r\n" % url
    assert len(head) == size
    return head[:2000], head[2000:]


@pytest.mark.parametrize(("size", "status"), [(64 * 1024, 200), (64 * 1024 + 1, 431)])
async def test_the_request_line_counts_toward_the_head_bound_to_the_byte(size: int, status: int) -> None:
    """A head of exactly 64 KiB (request line, header lines, blank line) is served; one byte
    more is 431, though each header line is short: the long URL is what fills it."""
    async with RouterServer(RouterConfig()) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        for piece in exact_head(size):
            writer.write(piece)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 %d" % status)


async def test_a_head_that_trickles_is_closed_408() -> None:
    """A client that starts a request and never finishes its headers is answered 408 and closed."""
    config = RouterConfig.model_validate({"server": {"header_timeout_seconds": 0.3}})
    async with RouterServer(config) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("split", [False, True])
async def test_a_later_head_that_trickles_on_a_kept_alive_connection_is_closed_408(split: bool) -> None:
    """After a whole request, the next head on the connection has the same bound: begun alone,
    or begun in the read that carried the end of the request before it (``split``)."""
    config = RouterConfig.model_validate({"server": {"header_timeout_seconds": 0.3}})
    async with RouterServer(config) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        first = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        started = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
        writer.write(first + started if split else first)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await asyncio.wait_for(reader.readexactly(length), 5)
        if not split:
            writer.write(started)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")


async def _healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(5))
    assert head.startswith(b"HTTP/1.1 200")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), scaled(5))


async def test_a_kept_alive_connection_closes_once_idle_for_the_keep_alive_timeout() -> None:
    """One keep-alive timer per connection, not one per response: a connection that keeps
    asking is never closed under a caller, and one left idle still closes after the timeout
    counted from its last response."""
    keep_alive = scaled(0.6)
    router = RouterServer(RouterConfig())
    # Read by each connection's protocol; typed int by uvicorn, used as a float (call_later).
    router._server.config.timeout_keep_alive = keep_alive  # type: ignore[assignment]
    async with router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        loop = asyncio.get_running_loop()
        began = loop.time()
        while loop.time() - began < 2.5 * keep_alive:  # past the first response's timeout
            await _healthz(reader, writer)
            await asyncio.sleep(keep_alive / 5)
        await _healthz(reader, writer)
        assert await asyncio.wait_for(reader.read(1), scaled(10)) == b""  # closed by the Router
        writer.close()


async def test_keep_alive_requests_are_not_mistaken_for_long_heads() -> None:
    """Many requests on one connection, with bodies bigger than the head limit, all pass."""
    async with RouterServer(RouterConfig()) as router, httpx.AsyncClient(base_url=router.url) as http:
        agent = await FakeAgent("a").start()
        await agent.register(router.url, vectors=False)
        try:
            for _ in range(5):
                payload = {"blob": "x" * 200_000}
                resp = await http.post("/reach", json={"targetTask": "echo", "payload": payload})
                assert resp.status_code == 200
        finally:
            await agent.stop()


async def test_a_head_pipelined_behind_a_call_in_flight_is_bounded_across_its_answer() -> None:
    """A second request's head begun behind a call still in flight, its bytes sent across the
    moment that call is answered: over 64 KiB in all, it is 431, though no one read of it is."""
    from tests.server.test_response_writes import Answers, post_reach

    hold = asyncio.Event()
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("held", hold=hold).start()
        try:
            await agent.register(router.url, vectors=False)
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(post_reach())  # served by the agent, which holds it
            await until(lambda: len(agent.received) == 1, "the first call at the agent")
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            for i in range(4):  # 40 KB of the head while the first call is in flight
                writer.write(b"X-Early-%d: %s\r\n" % (i, b"e" * 10_000))
                await writer.drain()
                await asyncio.sleep(scaled(0.02))  # pacing: separate reads, not a wait for a result
            answers = Answers()
            hold.set()  # the first call is answered: the head under way is still counted
            while not answers.done:
                chunk = await asyncio.wait_for(reader.read(65536), scaled(10))
                assert chunk
                answers.parser.feed_data(chunk)
            for i in range(3):  # 30 KB more, and the end of the head
                writer.write(b"X-Late-%d: %s\r\n" % (i, b"l" * 10_000))
            writer.write(b"\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            rest = await asyncio.wait_for(reader.read(65536), scaled(10))
            writer.close()
        finally:
            await agent.stop()
    assert answers.done[0][0] == 200
    assert rest.startswith(b"HTTP/1.1 431")


_FIRST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _deliveries(big: bytes) -> dict[str, list[bytes]]:
    """A small request, then ``big``, cut into the writes (reads, paced) named."""
    return {
        # The bytes of ``big`` in a read that began within the head before it: counted by
        # neither the read count (it began within a head) nor the bytes after it.
        "behind_a_split_head": [_FIRST[:10], _FIRST[10:] + big],
        "behind_a_split_head_then_more": [_FIRST[:10], _FIRST[10:] + big[:30_000], big[30_000:]],
        "behind_a_whole_request_in_one_read": [_FIRST + big],
        "after_the_first_answer_in_two_reads": [_FIRST, big[:2000], big[2000:]],
    }


@pytest.mark.parametrize("delivery", sorted(_deliveries(b"")))
@pytest.mark.parametrize(("size", "status"), [(64 * 1024, 200), (64 * 1024 + 1, 431)])
async def test_a_second_head_is_bounded_to_the_byte_however_its_reads_fall(
    delivery: str, size: int, status: int
) -> None:
    """A head after a small request on one connection: exactly 64 KiB is served, one byte more
    is 431, however the reads that carry it begin and end."""
    from tests.server.test_response_writes import Answers

    writes = _deliveries(b"".join(exact_head(size)))[delivery]
    async with RouterServer(RouterConfig()) as router:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        answers = Answers()
        for n, piece in enumerate(writes):
            if n:
                await asyncio.sleep(scaled(0.05))  # pacing: a read of its own, not a wait for a result
            writer.write(piece)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        while len(answers.done) < 2:
            chunk = b""  # a reset ends the answers as a close does
            with contextlib.suppress(ConnectionError):
                chunk = await asyncio.wait_for(reader.read(65536), scaled(5))
            if not chunk:
                break
            answers.parser.feed_data(chunk)
        writer.close()
    # The first request's answer may not precede a refusal (its turn may not have come).
    assert [got for got, _, _ in answers.done][-1] == status


CHUNKED_CALL = (
    b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


async def test_a_chunked_body_s_trailer_line_that_never_ends_is_refused_431() -> None:
    """A chunked request whose trailer line never ends: httptools keeps the open line whole, so
    without a bound the Router's memory grew with it (40 MB sent, about 100 MB more RSS). The
    bytes after a head that are not body (chunk framing, trailers) are bounded by the head's and
    the body's limits together: the Router answers 431 and hangs up once they are past."""
    config = RouterConfig.model_validate({"server": {"body_limit_bytes": 4096, "max_header_bytes": 4096}})
    async with RouterServer(config) as router:
        reader, writer = await connect(router.port)
        # The head alone first, asking to be told to go on: the 100 Continue says the Router has
        # read it and is reading the body, so what follows arrives in reads of the body's own.
        writer.write(CHUNKED_CALL.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
        go_on = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(5))
        assert go_on.startswith(b"HTTP/1.1 100 "), go_on
        # Then 12 KiB of a trailer line that does not end, in one write, and nothing more: the
        # Router takes it all (no reset for bytes left unread) and must answer without its end.
        writer.write(b"2\r\n{}\r\n0\r\nX-Trailer: " + b"a" * 12288)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), scaled(5))
        writer.close()
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"chunk framing and trailers are over 8192 bytes" in answer


async def test_a_chunked_body_with_its_trailers_under_the_bound_is_served() -> None:
    """Chunk framing and a short trailer line within the bound: the call is answered as any."""
    config = RouterConfig.model_validate({"server": {"body_limit_bytes": 4096, "max_header_bytes": 4096}})
    async with RouterServer(config) as router:
        agent = await FakeAgent("echo-agent").start()
        try:
            await agent.register(router.url)
            body = b'{"targetTask": "echo", "payload": {"n": 1}}'
            pieces = [body[i : i + 5] for i in range(0, len(body), 5)]
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
            reader, writer = await connect(router.port)
            writer.write(CHUNKED_CALL + chunks + b"0\r\nX-Trailer: " + b"t" * 1000 + b"\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(5))
            writer.close()
            assert head.startswith(b"HTTP/1.1 200 "), head
        finally:
            await agent.stop()
