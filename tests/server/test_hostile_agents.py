"""Agents that break HTTP on purpose, through a real Router: every caller gets its own answer or a
clean structured error, and a healthy agent's callers are served throughout.

The hostile agents are asyncio servers writing raw bytes on loopback; each behaviour is one
function of (writer, answer bytes, call number).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import random
import socket
import statistics
import struct
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import psutil
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, wait_vectors
from tests.helpers import scaled

Behaviour = Callable[[asyncio.StreamWriter, bytes, int], Awaitable[bool]]
ERROR_STATUSES = {"NO_AVAILABLE_HANDLER", "AGENT_ERROR", "TIMEOUT"}


def http_answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (RST), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def interim_first(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    """100 Continue and 103 Early Hints, each in its own write, then the answer."""
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await writer.drain()
    # Long enough for a client that took the 100 for the answer to hand the connection on.
    await asyncio.sleep(0.02)
    writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.005)
    writer.write(http_answer(body))
    await writer.drain()
    return True


async def close_after_answer(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    """Answer with keep-alive promised, then close the connection at once."""
    writer.write(http_answer(body))
    await writer.drain()
    return False


async def reset_mid_body(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    """Half of a close-delimited body, then a reset (odd calls), or of a sized one (even calls)."""
    extra = b"Connection: close\r\n\r\n" if n % 2 else b"Content-Length: %d\r\n\r\n" % len(body)
    writer.write(b"HTTP/1.1 200 OK\r\n" + extra + body[: len(body) // 2])
    await writer.drain()
    await asyncio.sleep(0.001)
    reset(writer)
    return False


async def mixed(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    return await (interim_first, close_after_answer, reset_mid_body)[n % 3](writer, body, n)


class RawAgent:
    """An agent on loopback that answers ``POST /reach`` through ``behave`` and health probes
    with 200; it echoes the payload's ``nonce``."""

    def __init__(self, agent_id: str, tasks: tuple[str, ...], behave: Behaviour) -> None:
        self.agent_id = agent_id
        self.tasks = tasks
        self.behave = behave
        self.calls = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> RawAgent:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def register(self, router_url: str) -> None:
        profile = {
            "id": self.agent_id,
            "network": {"endpoint": f"http://127.0.0.1:{self.port}/reach"},
            "capabilities": [{"task": task} for task in self.tasks],
            "health_check": {"interval_seconds": 30, "timeout_ms": 2000},
        }
        async with httpx.AsyncClient() as http:
            resp = await http.post(f"{router_url}/agents", json=profile)
            assert resp.status_code in (200, 201), resp.text
        await wait_vectors(router_url, self.agent_id)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):
                    writer.write(http_answer(b'{"status":"ok"}'))
                    continue
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                envelope = orjson.loads(await reader.readexactly(length))
                self.calls += 1
                nonce = (envelope.get("payload") or {}).get("nonce")
                body = orjson.dumps({"status": "SUCCESS", "result": {"nonce": nonce, "pad": "x" * 200}})
                if not await self.behave(writer, body, self.calls):
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()


# The answer limit of these Routers: a flood is many times over it.
ANSWER_LIMIT = 1024 * 1024

# The Routers' connect timeout (default 1000 ms), scaled: on a loaded machine a connect to a
# hostile agent's loopback port took longer than the default once (load 8.5), and a call the
# test expects served at the first attempt had a connect_error first.
CONNECT_MS = int(scaled(1.0) * 1000)


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    # Loop-lag shedding is tested apart; here a busy machine must not turn calls into OVERLOADED.
    # Breakers stay closed, so the hostile agents keep getting calls on their connections.
    config = RouterConfig.model_validate(
        {
            "limits": {"loop_lag_ms": 10_000},
            "breaker": {"failure_threshold": 10_000},
            "timeouts": {"connect_ms": CONNECT_MS},
            "server": {"response_limit_bytes": ANSWER_LIMIT},
        }
    )
    async with RouterServer(config) as server:
        yield server


async def call(http: httpx.AsyncClient, task: str, nonce: str) -> dict[str, Any]:
    body = {
        "targetTask": task,
        "payload": {"nonce": nonce},
        "preferences": {"timeoutMs": int(scaled(10) * 1000)},
    }
    resp = await http.post("/reach", json=body)
    answer: dict[str, Any] = resp.json()
    assert answer["status"] == "SUCCESS" or resp.status_code >= 400, answer
    return answer


def own_or_clean(answer: dict[str, Any], nonce: str) -> bool:
    """True for a SUCCESS carrying this caller's nonce; asserts an error is structured."""
    if answer["status"] == "SUCCESS":
        assert answer["result"]["nonce"] == nonce, "a caller received another call's answer"
        return True
    assert answer["status"] in ERROR_STATUSES, answer
    assert isinstance(answer["error"]["code"], str) and answer["error"]["message"], answer
    assert answer.get("result") is None
    return False


async def test_every_caller_gets_its_own_answer_through_hostile_agents(router: RouterServer) -> None:
    """1xx answers, kept-alive connections closed after answering and resets mid-body, at
    concurrency: no caller ever receives another call's answer, and the healthy agent's callers
    are all served."""
    agents = [
        RawAgent("interim", ("interim", "mixed"), interim_first),
        RawAgent("closer", ("closer", "mixed"), close_after_answer),
        RawAgent("resetter", ("mixed",), reset_mid_body),
        RawAgent("chaos", ("mixed",), mixed),
    ]
    steady = FakeAgent("steady", tasks=("steady",), result={"steady": True})
    await steady.start()
    try:
        for agent in agents:
            await (await agent.start()).register(router.url)
        await steady.register(router.url)
        calls: list[tuple[str, str]] = [
            (task, uuid.uuid4().hex) for _ in range(25) for task in ("interim", "closer", "mixed", "steady")
        ]
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
            answers = await asyncio.gather(*(call(http, task, nonce) for task, nonce in calls))
        served: dict[str, int] = {}
        for (task, nonce), answer in zip(calls, answers, strict=True):
            if task == "steady":
                assert answer["status"] == "SUCCESS" and answer["result"] == {"steady": True}, answer
                continue
            served[task] = served.get(task, 0) + own_or_clean(answer, nonce)
        # Interim answers are skipped, and a connection the agent closed after answering is never
        # reused blindly: those two agents serve every one of their callers at the first attempt.
        assert served["interim"] == 25
        assert served["closer"] == 25
        for (task, _), answer in zip(calls, answers, strict=True):
            if task in ("interim", "closer"):
                assert [a["outcome"] for a in answer["attempts"]] == ["SUCCESS"], answer["attempts"]
        assert served.get("mixed", 0) > 0
        assert agents[0].calls >= 25
    finally:
        for agent in agents:
            await agent.stop()
        await steady.stop()


# -- answers that would exhaust the Router ---------------------------------------------------

MB = 1024 * 1024
FLOOD_BYTES = 40 * MB  # what a flooding agent sends at most: the test stays bounded
PIECE = 64 * 1024


async def flood(writer: asyncio.StreamWriter, head: bytes, pieces: Callable[[int], bytes]) -> None:
    """Write ``head``, then pieces until FLOOD_BYTES, an empty piece, or the Router hangs up."""
    writer.write(head)
    sent = 0
    try:
        while sent < FLOOD_BYTES:
            piece = pieces(sent)
            if not piece:
                break
            writer.write(piece)
            sent += len(piece)
            await writer.drain()
    except ConnectionError:
        pass


async def endless_header_line(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    await flood(writer, b"HTTP/1.1 200 OK\r\nX-Endless: ", lambda _: b"a" * PIECE)
    return False


async def endless_headers(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    await flood(writer, b"HTTP/1.1 200 OK\r\n", lambda _: b"X-A: 1\r\n" * (PIECE // 8))
    return False


@functools.cache
def bomb_blocks() -> tuple[bytes, bytes]:
    """A gzip stream's opening (header and 4 MiB of zeros) and a block of 4 MiB more zeros that
    may follow it any number of times: about 4 KB each on the wire."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (4 * MB)
    first = squeeze.compress(zeros) + squeeze.flush(zlib.Z_SYNC_FLUSH)
    again = squeeze.compress(zeros) + squeeze.flush(zlib.Z_SYNC_FLUSH)
    return first, again


@functools.cache
def noise_stream() -> bytes:
    """12 MiB of noise, gzipped: a compressed stream twelve times the answer limit."""
    return gzip.compress(random.Random(7).randbytes(12 * MB), compresslevel=1)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def gzip_bomb(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    """A gzip stream of zeros inflating a thousandfold, chunked, with no end in sight."""
    first, again = bomb_blocks()
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    await flood(writer, head + chunk(first), lambda _: chunk(again))
    return False


async def gzip_noise(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
    """A long close-delimited gzip stream of noise: the compressed bytes alone are the flood."""
    stream = noise_stream()
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n"
    await flood(writer, head, lambda sent: stream[sent : sent + PIECE])
    return False


class PeakRss:
    """The process's peak RSS growth while in ``async with``, sampled every 5 ms."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._proc.memory_info().rss)
            await asyncio.sleep(0.005)

    async def __aenter__(self) -> PeakRss:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / MB


async def steady_calls(http: httpx.AsyncClient, n: int) -> list[float]:
    """``n`` calls to the healthy agent, one after another: each one's seconds; all must succeed."""
    took = []
    loop = asyncio.get_running_loop()
    for _ in range(n):
        began = loop.time()
        answer = await call(http, "steady", "-")
        took.append(loop.time() - began)
        assert answer["status"] == "SUCCESS", answer
    return took


# A bad head is a broken agent (failover, then NO_AVAILABLE_HANDLER); a body over the limit is
# AGENT_ERROR RESPONSE_TOO_LARGE at once.
BROKEN = ("NO_AVAILABLE_HANDLER", "agent_error")
TOO_LARGE = ("AGENT_ERROR", "RESPONSE_TOO_LARGE")


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        (endless_header_line, BROKEN),
        (endless_headers, BROKEN),
        (gzip_bomb, TOO_LARGE),
        (gzip_noise, TOO_LARGE),
    ],
)
async def test_a_flooding_agent_is_cut_off_within_bounds_while_others_are_served(
    router: RouterServer, behaviour: Behaviour, outcome: tuple[str, str]
) -> None:
    """An endless head, a gzip bomb or a long compressed stream (up to 40 MB sent) ends in a
    structured answer in seconds, grows the Router by a bounded amount, and the healthy agent's
    callers are served meanwhile with a p50 under one second (scaled on a busy machine)."""
    bomb_blocks(), noise_stream()  # made before the clock starts: they cost the test, not the Router
    hostile = await RawAgent("flood", ("flood",), behaviour).start()
    steady = await FakeAgent("steady", tasks=("steady",)).start()
    try:
        await hostile.register(router.url)
        await steady.register(router.url)
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
            await steady_calls(http, 3)  # warm: connections, caches
            loop = asyncio.get_running_loop()
            async with PeakRss() as rss:
                began = loop.time()
                floods = asyncio.gather(*(call(http, "flood", "-") for _ in range(4)))
                took = await steady_calls(http, 20)
                answers = await floods
                flooded_s = loop.time() - began
        status, why = outcome
        for answer in answers:
            assert answer["status"] == status, answer
            error = answer["error"]
            assert why in (error["code"], *(c["reason"] for c in error.get("candidates", []))), error
        # Bounds, not service levels (those are in bench/): a Router frozen by a flood, as a 112 s
        # endless head once froze it, fails them on any machine.
        assert flooded_s < scaled(20), flooded_s
        assert statistics.median(took) < scaled(1.0), took
        # Four floods at once, each holding at most the 1 MiB limit decoded, plus socket buffers
        # and the test's own work: 12 MiB (measured: under 1 MiB). Reading the compressed stream
        # whole before checking it, the flaw this bounds, grew the process by 35 MiB here.
        assert rss.growth_mb < 12, rss.growth_mb
    finally:
        await hostile.stop()
        await steady.stop()


# -- busy agents -----------------------------------------------------------------------------


def busy_for(retry_after: bytes) -> Behaviour:
    async def busy(writer: asyncio.StreamWriter, body: bytes, n: int) -> bool:
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: %s\r\nContent-Length: 0\r\n\r\n" % retry_after
        )
        await writer.drain()
        return True

    return busy


async def test_a_busy_agent_fails_over_to_a_peer_and_is_not_a_breaker_failure() -> None:
    config = RouterConfig.model_validate(
        {
            "limits": {"loop_lag_ms": 10_000},
            "breaker": {"failure_threshold": 2},
            "timeouts": {"connect_ms": CONNECT_MS},
        }
    )
    async with RouterServer(config) as router:
        busy = await RawAgent("busy", ("work",), busy_for(b"7")).start()
        peer = await FakeAgent("peer", tasks=("work",), result={"by": "peer"}).start()
        try:
            await busy.register(router.url)
            await peer.register(router.url)
            async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
                answers = [await call(http, "work", str(n)) for n in range(10)]
            assert all(a["status"] == "SUCCESS" and a["result"] == {"by": "peer"} for a in answers), answers
            outcomes = [o["outcome"] for a in answers for o in a["attempts"]]
            assert "busy" in outcomes
            assert busy.calls == outcomes.count("busy")
            # More busy answers than the breaker's threshold, and it stays closed.
            assert busy.calls > 2
            assert router.app.parts.breakers.state("busy").value == "closed"
        finally:
            await busy.stop()
            await peer.stop()


async def test_when_every_agent_is_busy_the_caller_gets_the_soonest_retry_after(router: RouterServer) -> None:
    soon = await RawAgent("soon", ("work",), busy_for(b"7")).start()
    later = await RawAgent("later", ("work",), busy_for(b"100000")).start()
    dated = await RawAgent("dated", ("dated",), busy_for(b"Wed, 21 Oct 2015 07:28:00 GMT")).start()
    try:
        for agent in (soon, later, dated):
            await agent.register(router.url)
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
            resp = await http.post("/reach", json={"targetTask": "work", "payload": {}})
            dated_resp = await http.post("/reach", json={"targetTask": "dated", "payload": {}})
            past = dated_resp.json()
            streamed = await http.post(
                "/reach", json={"targetTask": "work", "payload": {}}, headers={"Accept": "text/event-stream"}
            )
        assert resp.status_code == 503
        # In the header too, where HTTP clients look for it (it was only in the body), for a
        # caller that asked for a stream as for a plain one.
        assert resp.headers["Retry-After"] == "7"
        assert streamed.status_code == 503
        assert streamed.headers["Retry-After"] == "7"
        assert streamed.json()["error"]["retryAfterSeconds"] == 7
        assert dated_resp.headers["Retry-After"] == "0"
        error = resp.json()["error"]
        assert error["code"] == "NO_AVAILABLE_HANDLER"
        assert error["retryAfterSeconds"] == 7
        assert {c["agentId"]: c["reason"] for c in error["candidates"]} == {"soon": "busy", "later": "busy"}
        # A date in the past means "now": zero seconds, still said.
        assert past["error"]["retryAfterSeconds"] == 0
    finally:
        for agent in (soon, later, dated):
            await agent.stop()
