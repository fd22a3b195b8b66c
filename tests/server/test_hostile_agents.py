"""Agents that break HTTP on purpose, through a real Router: every caller gets its own answer or a
clean structured error, and a healthy agent's callers are served throughout.

The hostile agents are asyncio servers writing raw bytes on loopback; each behaviour is one
function of (writer, answer bytes, call number).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, wait_vectors

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


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    # Loop-lag shedding is tested apart; here a busy machine must not turn calls into OVERLOADED.
    # Breakers stay closed, so the hostile agents keep getting calls on their connections.
    config = RouterConfig.model_validate(
        {"limits": {"loop_lag_ms": 10_000}, "breaker": {"failure_threshold": 10_000}}
    )
    async with RouterServer(config) as server:
        yield server


async def call(http: httpx.AsyncClient, task: str, nonce: str) -> dict[str, Any]:
    body = {"targetTask": task, "payload": {"nonce": nonce}, "preferences": {"timeoutMs": 10_000}}
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
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as http:
            answers = await asyncio.gather(*(call(http, task, nonce) for task, nonce in calls))
        served: dict[str, int] = {}
        for (task, nonce), answer in zip(calls, answers, strict=True):
            if task == "steady":
                assert answer["status"] == "SUCCESS" and answer["result"] == {"steady": True}, answer
                continue
            served[task] = served.get(task, 0) + own_or_clean(answer, nonce)
        # Interim answers are skipped, so that agent serves every one of its callers.
        assert served["interim"] == 25
        assert served.get("mixed", 0) > 0
        assert agents[0].calls >= 25
    finally:
        for agent in agents:
            await agent.stop()
        await steady.stop()
