"""A2A calls enter through the gates /reach keeps: the load shedder, counted per caller, the
caller's identity on the decision record (learning keys what it learns by it), and the log
formatter that escapes what a caller sent, whichever library logs it."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import uuid
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a")

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.integrations.a2a import A2AExport
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import scaled
from tests.observability.test_log_forging import ESC, FORGED, assert_clean, flush_log, root_log_buffer

__all__ = ["root_log_buffer"]  # a fixture, used by name

pytestmark = pytest.mark.integrations

TOKEN_A = "a2a-gates-caller-a-0123456789"
TOKEN_B = "a2a-gates-caller-b-0123456789"
ADMIN = "a2a-gates-admin-0123456789"
V1 = {"A2A-Version": "1.0"}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def policy(max_inflight_per_client: int) -> RouterConfig:
    tokens = [{"role": "caller", "sha256": digest(t)} for t in (TOKEN_A, TOKEN_B)]
    tokens.append({"role": "admin", "sha256": digest(ADMIN)})
    return RouterConfig.model_validate(
        {
            "health": {"enabled": False},
            "embedding": {"backend": "none"},
            "limits": {
                "loop_lag_ms": 10_000,
                "max_inflight": 16,
                "max_inflight_per_client": max_inflight_per_client,
            },
            "auth": {"tokens": tokens},
            # The calls A2A sends carry no preferences: two are held at the agent while the test
            # makes other calls, and the default read timeout (3 s, not scaled) must not end them
            # first on a busy machine.
            "timeouts": {"read_ms": int(scaled(20_000))},
        }
    )


def send_message(skill: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"data": {"n": 1}}],
    }
    message["metadata"] = {"skill": skill}
    return {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": "SendMessage", "params": {"message": message}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **V1}


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_a2a_calls_are_shed_per_caller_like_reach_calls() -> None:
    """Two slots per caller: of 6 concurrent SendMessage calls on token A, 2 run and 4 are 429
    OVERLOADED with Retry-After; A's /reach is shed too (the same slots), token B's is served;
    each record of an A2A call names A as its caller, on the fast path and through a2a-sdk."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    records: list[DecisionRecord] = []
    async with (
        RouterServer(policy(2), port=port, middleware=lambda app: A2AExport(app, url)) as router,  # type: ignore[arg-type]
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        router.app.parts.dispatcher.observers.append(records.append)
        held = await FakeAgent("held", tasks=("slow",), hold=asyncio.Event()).start()
        free = await FakeAgent("free", tasks=("fast",)).start()
        try:
            for agent in (held, free):
                resp = await http.post("/agents", json=agent.profile(), headers=bearer(ADMIN))
                assert resp.status_code == 201, resp.text
            calls = [
                asyncio.create_task(
                    http.post("/a2a/jsonrpc", json=send_message("slow"), headers=bearer(TOKEN_A))
                )
                for _ in range(6)
            ]
            await until(
                lambda: sum(c.done() for c in calls) == 4 and len(held.received) == 2, "4 shed, 2 held"
            )
            shed = [c.result() for c in calls if c.done()]
            assert [r.status_code for r in shed] == [429] * 4
            assert all(r.json()["error"]["code"] == "OVERLOADED" and r.headers["retry-after"] for r in shed)
            reach_a = await http.post("/reach", json={"targetTask": "fast"}, headers=bearer(TOKEN_A))
            assert (reach_a.status_code, reach_a.json()["status"]) == (429, "OVERLOADED")
            reach_b = await http.post("/reach", json={"targetTask": "fast"}, headers=bearer(TOKEN_B))
            assert reach_b.json()["status"] == "SUCCESS"
            assert held.hold is not None
            held.hold.set()
            ran = [await c for c in calls]
            completed = [r for r in ran if r.status_code == 200]
            assert len(completed) == 2
            assert all(
                r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED" for r in completed
            )
            # a2a-sdk's own path (HTTP+JSON) passes the caller too.
            body = {"message": send_message("fast")["params"]["message"]}
            rest = await http.post("/a2a/rest/message:send", json=body, headers=bearer(TOKEN_A))
            assert rest.status_code == 200, rest.text
        finally:
            await held.stop()
            await free.stop()
    key_a = f"fp:{digest(TOKEN_A)[:8]}"
    by_task: dict[str, list[str]] = {}
    for record in records:
        by_task.setdefault(record.task, []).append(record.caller)
    # 2 A2A calls served, 4 shed A2A calls and 1 shed /reach (those have no task), B's /reach,
    # and the HTTP+JSON call.
    assert by_task["slow"] == [key_a, key_a]
    assert sorted(by_task["fast"]) == sorted([f"fp:{digest(TOKEN_B)[:8]}", key_a])


async def test_a2a_sdk_log_lines_cannot_be_forged_through_the_bridge(root_log_buffer: io.StringIO) -> None:
    """A taskId carrying a newline, a forged [registry] line and an ESC, sent to the A2A face:
    a2a-sdk logs it in its own words through its own logger; with the entry point's logging set
    up, the Router's log holds it escaped on one line, and no raw control byte."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(
        {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
    )
    evil = f"x\n{FORGED}{ESC}"
    async with (
        RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router,  # type: ignore[arg-type]
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        assert router.url == url
        body = {"message": {"messageId": "m", "role": "ROLE_USER", "taskId": evil, "parts": [{"text": evil}]}}
        resp = await http.post("/a2a/rest/message:send", json=body, headers=V1)
        assert resp.status_code == 404
    flush_log()
    logged = root_log_buffer.getvalue()
    assert_clean(logged)
    assert "[a2a." in logged and f"x\\n{FORGED}" in logged
