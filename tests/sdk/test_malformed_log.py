"""A stranger's malformed requests cannot flood an SDK agent's log.

aiohttp refuses a 100 KB header line or 5000 headers with 400, and logged each refusal as
"Error handling request" with a full traceback (about 30 lines): anyone who reaches the agent's
port could write its log as fast as they could send. The agent's server logs such refusals as
one short line at most every few seconds, with a count of the ones it did not log; an error in a
handler is still logged with its traceback.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from aiohttp import web

from reachmesh import AgentConfig, ReachAgent
from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer, free_port

POLICY = RouterConfig.model_validate({"embedding": {"backend": "none"}, "health": {"enabled": False}})


def agent_config(router_url: str) -> AgentConfig:
    port = free_port()
    return AgentConfig.from_mapping(
        {
            "agent": {
                "id": "log-agent",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "echo"}],
            },
            "router": {"url": router_url},
        }
    )


async def raw_request(port: int, head: bytes) -> bytes:
    """Send ``head`` on a fresh connection and read the answer until the agent closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()


def long_line() -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n"


def many_headers() -> bytes:
    lines = b"".join(b"X-H%d: v\r\n" % n for n in range(5000))
    return b"GET /health HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n"


def health_path(agent: ReachAgent) -> str:
    return agent.config.profile.health_check.path


def tracebacks(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.exc_info or "Traceback" in r.getMessage()]


async def test_malformed_requests_are_refused_with_one_short_line(caplog: pytest.LogCaptureFixture) -> None:
    """Forty malformed requests (each one 400): no traceback in the log, and one line for all of
    them (each refusal wrote one "Error handling request" record with a traceback before)."""
    caplog.set_level(logging.INFO)
    async with RouterServer(POLICY) as router:
        agent = ReachAgent(agent_config(router.url))
        agent.capability("echo")(lambda payload: payload)
        await agent.start()
        try:
            caplog.clear()
            assert agent.port is not None
            for n in range(40):
                answer = await raw_request(agent.port, long_line() if n % 2 else many_headers())
                assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:200]
            async with httpx.AsyncClient(timeout=15) as http:
                resp = await http.get(f"http://127.0.0.1:{agent.port}{health_path(agent)}")
                assert resp.status_code == 200
        finally:
            await agent.stop()
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "reachmesh.sdk"))]
    assert not tracebacks(records), [r.getMessage() for r in tracebacks(records)][:2]
    refused = [r for r in records if "malformed request" in r.getMessage()]
    # The first refusal is logged; the other 39 come within the few seconds it holds the rest.
    assert 1 <= len(refused) <= 2, [r.getMessage() for r in refused]
    first = refused[0].getMessage()
    assert "400" in first and "127.0.0.1" in first and len(first) < 400, first
    assert "Error handling request" not in caplog.text


async def test_a_failing_handler_is_still_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception that reaches aiohttp (here the health handler's) is a real error: it keeps
    aiohttp's "Error handling request" record and traceback, every time."""
    caplog.set_level(logging.INFO)

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("the health handler broke")

    async with RouterServer(POLICY) as router:
        agent = ReachAgent(agent_config(router.url))
        agent.capability("echo")(lambda payload: payload)
        agent._on_health = broken  # type: ignore[method-assign]
        await agent.start()
        try:
            caplog.clear()
            async with httpx.AsyncClient(timeout=15) as http:
                for _ in range(3):
                    resp = await http.get(f"http://127.0.0.1:{agent.port}{health_path(agent)}")
                    assert resp.status_code == 500
        finally:
            await agent.stop()
    errors = [r for r in caplog.records if "Error handling request" in r.getMessage()]
    assert len(errors) == 3
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in errors)


def test_the_next_line_counts_the_refusals_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """Within the interval refusals are counted, not logged; the next line says how many."""
    from aiohttp.http_exceptions import LineTooLong

    from reachmesh.sdk.serverlog import RefusalLog

    now = [100.0]
    refusals = RefusalLog(logging.getLogger("aiohttp.server"), every_s=5.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO)
    for _ in range(4):
        refused = LineTooLong("x" * 9000, "8190")
        refusals.exception("Error handling request from %s", "10.0.0.9", exc_info=refused)
    now[0] += 5.0
    refusals.exception("Error handling request from %s", "10.0.0.9", exc_info=LineTooLong("line", "8190"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and not any(r.exc_info for r in caplog.records), lines
    assert "10.0.0.9" in lines[0] and "LineTooLong" in lines[0] and len(lines[0]) < 400
    assert lines[1].endswith("(3 more refused since the last such line)"), lines[1]
