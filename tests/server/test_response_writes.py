"""How /reach answers leave the Router on the wire: whole, in order, and closed when asked."""

from __future__ import annotations

import asyncio

import httptools
import orjson

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

CALL = b'{"targetTask": "echo", "payload": {"n": 1}}'


def post_reach(extra: bytes = b"", call: bytes = CALL) -> bytes:
    return (
        b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(call)
        + call
    )


def held_call() -> bytes:
    """CALL for a call held at its agent while the test goes on: it asks a read timeout and a
    deadline as long as the test's (the Router's default read timeout, 3 s, is not scaled)."""
    held_ms = int(scaled(20_000))
    prefs = {"timeoutMs": held_ms, "readTimeoutMs": held_ms}
    return orjson.dumps({**orjson.loads(CALL), "preferences": prefs})


class Answers:
    """Parses a stream of HTTP/1.1 responses into (status, headers, body) triples."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self._headers, b"".join(self._body)))
        self._headers, self._body = [], []


async def exchange(port: int, data: bytes, count: int, close_wait_s: float) -> tuple[Answers, bool]:
    """Send ``data`` in one write; read until ``count`` responses are whole. Also says whether
    the Router then closed the connection within ``close_wait_s`` (well inside uvicorn's 5 s
    keep-alive, which would close it anyway)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = Answers()
    try:
        writer.write(data)
        while len(answers.done) < count:
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, f"connection closed after {len(answers.done)} of {count} responses"
            answers.parser.feed_data(chunk)
        closed = await asyncio.wait_for(reader.read(1), close_wait_s) == b""
    except TimeoutError:
        closed = False
    finally:
        writer.close()
    return answers, closed


async def test_pipelined_reach_calls_are_answered_whole_and_in_order() -> None:
    """Three calls and a health check in one write: four whole responses, in the order asked,
    each /reach answer with exactly the date, content-type and content-length headers."""
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("a").start()
        try:
            await agent.register(router.url, vectors=False)
            health = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
            data = post_reach() + post_reach() + health + post_reach()
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            answers = Answers()
            writer.write(data)
            while len(answers.done) < 4:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                assert chunk
                answers.parser.feed_data(chunk)
            writer.close()
        finally:
            await agent.stop()
    statuses = [status for status, _, _ in answers.done]
    assert statuses == [200, 200, 200, 200]
    reach = [answers.done[i] for i in (0, 1, 3)]
    for _, headers, body in reach:
        assert [name for name, _ in headers] == [b"date", b"content-type", b"content-length"]
        assert dict(headers)[b"content-length"] == str(len(body)).encode()
        assert orjson.loads(body)["status"] == "SUCCESS"
    assert b"status" in answers.done[2][2]  # the health check's own body, between the calls


async def test_a_call_asking_to_close_gets_connection_close_and_the_connection_ends() -> None:
    """``Connection: close`` on /reach: a whole answer saying ``connection: close``, then EOF."""
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("a").start()
        try:
            await agent.register(router.url, vectors=False)
            call = post_reach(b"Connection: close\r\n")
            answers, closed = await exchange(router.port, call, 1, close_wait_s=4)
        finally:
            await agent.stop()
    (status, headers, body) = answers.done[0]
    assert status == 200
    assert (b"connection", b"close") in headers
    assert orjson.loads(body)["status"] == "SUCCESS"
    assert closed


async def test_a_refusal_on_reach_is_one_whole_answer_with_its_extra_headers() -> None:
    """A call over the per-client in-flight limit is refused 429 with Retry-After, and its
    connection stays open for the next call."""
    limits = {"max_inflight_per_client": 1, "retry_after_seconds": 3}
    config = RouterConfig.model_validate({"limits": limits})
    async with RouterServer(config) as router:
        # The first call stays in flight until the second one is answered.
        agent = await FakeAgent("a", hold=asyncio.Event()).start()
        try:
            await agent.register(router.url, vectors=False)
            call = post_reach(call=held_call())
            first = asyncio.ensure_future(exchange(router.port, call, 1, close_wait_s=0))
            await until(lambda: agent.received, "the first call to reach the agent")
            answers, closed = await exchange(router.port, post_reach(), 1, close_wait_s=1)
            assert agent.hold is not None
            agent.hold.set()
            await first
        finally:
            await agent.stop()
    status, headers, body = answers.done[0]
    assert status == 429
    assert (b"retry-after", b"3") in headers
    assert orjson.loads(body)["status"] == "OVERLOADED"
    assert not closed


# -- the lane: a POST /reach whose body came with its head (server/h1.py) -----------------------


async def test_a_call_whose_body_comes_after_its_head_is_answered_the_asgi_way() -> None:
    """The head and the first bytes of the body in one write, the rest in a later one: the lane
    leaves the request to uvicorn's cycle, which reads the rest and answers it whole."""
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("a").start()
        try:
            await agent.register(router.url, vectors=False)
            call = post_reach()
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            answers = Answers()
            try:
                writer.write(call[:-10])
                await writer.drain()
                await asyncio.sleep(0.05)  # a separate read, most likely; either way one answer
                writer.write(call[-10:])
                while not answers.done:
                    chunk = await asyncio.wait_for(reader.read(65536), 10)
                    assert chunk
                    answers.parser.feed_data(chunk)
            finally:
                writer.close()
        finally:
            await agent.stop()
    status, headers, body = answers.done[0]
    assert status == 200
    assert [name for name, _ in headers] == [b"date", b"content-type", b"content-length"]
    assert orjson.loads(body)["status"] == "SUCCESS"


async def test_a_trusted_proxys_forwarded_client_is_still_the_client_the_limits_count() -> None:
    """uvicorn's proxy-headers middleware names the client behind a trusted proxy (loopback by
    default): the lane never skips it. One call in flight per client: a second call forwarded
    for another client is served, one for the same client is refused."""
    limits = {"max_inflight_per_client": 1, "retry_after_seconds": 3}
    async with RouterServer(RouterConfig.model_validate({"limits": limits})) as router:
        # The first call stays in flight until the two others are answered; they are not held.
        release = asyncio.Event()
        agent = await FakeAgent("a", hold=release).start()
        try:
            await agent.register(router.url, vectors=False)
            call = post_reach(b"X-Forwarded-For: 10.0.0.1\r\n", call=held_call())
            first = asyncio.ensure_future(exchange(router.port, call, 1, close_wait_s=0))
            await until(lambda: agent.received, "the first call to reach the agent")
            agent.hold = None
            same, _ = await exchange(router.port, post_reach(b"X-Forwarded-For: 10.0.0.1\r\n"), 1, 0)
            other, _ = await exchange(router.port, post_reach(b"X-Forwarded-For: 10.0.0.2\r\n"), 1, 0)
            release.set()
            await first
        finally:
            await agent.stop()
    assert same.done[0][0] == 429
    assert other.done[0][0] == 200


async def test_a_bug_behind_the_lane_answers_500_and_closes_as_uvicorn_does() -> None:
    """An exception out of the app's lane entry: the caller gets uvicorn's own 500 and the
    connection closes, never a hang or half an answer."""

    async def broken(*args: object) -> tuple[tuple[int, bytes, None], None]:
        raise RuntimeError("a bug")

    async with RouterServer(RouterConfig()) as router:
        router.app.serve_whole = broken  # type: ignore[method-assign, assignment]
        answers, closed = await exchange(router.port, post_reach(), 1, close_wait_s=4)
    status, headers, body = answers.done[0]
    assert status == 500
    assert body == b"Internal Server Error"
    assert (b"connection", b"close") in headers
    assert closed
