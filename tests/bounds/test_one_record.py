"""One record per request: denials, internal errors and drain abandonments go through the finish
path, and a request keeps the policy it started with."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, free_port
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.http import HttpTransport
from tests.helpers import scaled

CALLER = "record-caller-0123456789"
BASE = {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}


def requests_total(metrics: str, status: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("reach_requests_total{") and f'status="{status}"' in line
    )


async def test_denials_and_internal_errors_are_counted_and_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 on /reach and an INTERNAL_ERROR each land in reach_requests_total and the trace store."""
    digest = hashlib.sha256(CALLER.encode()).hexdigest()
    policy = {**BASE, "auth": {"tokens": [{"role": "admin", "sha256": digest}]}}
    async with (
        RouterServer(RouterConfig.model_validate(policy)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as http,
    ):
        resp = await http.post("/reach", json={"targetTask": "echo"})
        assert (resp.status_code, resp.json()["status"]) == (401, "UNAUTHORIZED")
        denied_trace = resp.json()["traceId"]

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        # A bug in the dispatcher: its start() is what the lane calls, and handle() too.
        monkeypatch.setattr(router.app.parts.dispatcher, "start", broken)
        admin = {"Authorization": f"Bearer {CALLER}"}
        resp = await http.post(
            "/reach", json={"targetTask": "echo"}, headers={**admin, "X-Reach-Trace-Id": "bug-1"}
        )
        assert (resp.status_code, resp.json()["status"]) == (500, "INTERNAL_ERROR")
        metrics = (await http.get("/metrics", headers=admin)).text
        assert requests_total(metrics, "UNAUTHORIZED") == 1
        assert requests_total(metrics, "INTERNAL_ERROR") == 1
        for trace_id, status in ((denied_trace, "UNAUTHORIZED"), ("bug-1", "INTERNAL_ERROR")):
            trace = await http.get(f"/admin/traces/{trace_id}", headers=admin)
            assert [hop["status"] for hop in trace.json()["hops"]] == [status]


async def test_requests_running_at_the_drain_deadline_get_timeout_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGTERM with three calls stuck at an agent: each gets a 504 TIMEOUT ReachResponse with its
    trace id before the server's cut-off (never a bare 500), each is logged as abandoned, and
    the Router stops within its drain deadline."""
    caplog.set_level(logging.ERROR)
    policy = {
        **BASE,
        "server": {"drain_timeout_seconds": 2},
        "timeouts": {"read_ms": 30_000, "overall_ms": 60_000},
    }
    stuck = await FakeAgent("stuck", delay_s=30).start()
    router = RouterServer(RouterConfig.model_validate(policy))
    await router.__aenter__()
    try:
        await stuck.register(router.url, vectors=False)
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as http:
            calls = [
                asyncio.create_task(http.post("/reach", json={"traceId": f"stuck-{i}", "targetTask": "echo"}))
                for i in range(3)
            ]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + scaled(10)
            while len(stuck.received) < 3:
                assert loop.time() < deadline, "the calls never reached the agent"
                await asyncio.sleep(0.02)
            signalled = loop.time()
            # What RouterProcess.handle_exit does on SIGTERM, without uvicorn re-raising the
            # signal at this test process once it has stopped.
            router.app.begin_drain(time.monotonic())
            router._server.should_exit = True
            answers = await asyncio.gather(*calls)
            took = loop.time() - signalled
    finally:
        await router.__aexit__(None, None, None)
        await stuck.stop()
    for i, resp in enumerate(answers):
        assert resp.status_code == 504, resp.text
        body = resp.json()
        assert (body["status"], body["traceId"]) == ("TIMEOUT", f"stuck-{i}")
        assert "shut down" in body["error"]["message"]
    assert took < 2.0 + scaled(1.0), took  # the drain deadline (2 s) and the time to write the answers
    abandoned = [r.getMessage() for r in caplog.records if "abandoned at shutdown" in r.getMessage()]
    assert len(abandoned) == 3, abandoned


class GatedTransport(HttpTransport):
    """The real HTTP transport whose first send waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def send(
        self, url: str, body: bytes, headers: dict[str, str], limits: AttemptLimits, protocol: str = "http"
    ) -> Any:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        return await super().send(url, body, headers, limits, protocol)


async def test_a_request_keeps_its_policy_through_a_reload() -> None:
    """Two agents whose connections are refused, one same-agent retry each by the policy the
    request started with; a reload to no same-agent retries while the first attempt is under
    way changes nothing for that request (four attempts), and the next request follows the new
    policy (two attempts)."""
    old = {**BASE, "retries": {"same_agent": 1, "max_per_request": 5, "backoff_ms": 0}}
    new = {**BASE, "retries": {"same_agent": 0, "max_per_request": 5, "backoff_ms": 0}}
    transport = GatedTransport()
    router = RouterServer(RouterConfig.model_validate(old), transport=transport)
    async with router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        for agent_id in ("dead-1", "dead-2"):
            profile = {
                "id": agent_id,
                "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
                "capabilities": [{"task": "t"}],
            }
            assert (await http.post("/agents", json=profile)).status_code == 201
        first = asyncio.create_task(http.post("/reach", json={"targetTask": "t"}))
        await asyncio.wait_for(transport.waiting.wait(), 10)
        router.app.apply(RouterConfig.model_validate(new))
        transport.gate.set()
        body = (await first).json()
        assert [a["outcome"] for a in body["attempts"]] == ["connect_error"] * 4, body
        body = (await http.post("/reach", json={"targetTask": "t"})).json()
        assert len(body["attempts"]) <= 2, body
