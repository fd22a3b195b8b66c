"""No lease, token or replyTo secret reaches a log line, a trace or a metric, and no line is forged."""

from __future__ import annotations

import logging

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.redaction import fingerprint, loggable, loggable_url
from reachmesh.testing import FakeAgent, RouterServer

MARKER = "tok-3b1f9c2e-secret-marker"
FORGED = "2026-11-30T00:00:00.000Z INFO [registry] registered evil"


def test_fingerprints_stand_in_for_secrets() -> None:
    """A fingerprint is short, stable, and does not contain the secret."""
    assert fingerprint(MARKER) == fingerprint(MARKER)
    assert MARKER not in fingerprint(MARKER)
    assert fingerprint(None) == "-"


def test_urls_lose_their_query_and_credentials_and_text_its_newlines() -> None:
    """Query strings, user info and fragments are dropped; control characters are escaped."""
    assert (
        loggable_url(f"https://u:{MARKER}@h.example:8443/cb?token={MARKER}#x") == "https://h.example:8443/cb"
    )
    assert "\n" not in loggable("a\nregistered evil")
    assert loggable("a\nb") == "a\\nb"


async def test_a_run_leaves_no_secret_in_logs_traces_or_metrics(caplog: pytest.LogCaptureFixture) -> None:
    """Register, call, async with a secret replyTo and a newline injection: none of it in the output."""
    caplog.set_level(logging.DEBUG)
    config = RouterConfig.model_validate({"health": {"enabled": False}, "logging": {"log_payloads": True}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        agent = await FakeAgent("a").start()
        try:
            lease = await agent.register(router.url, vectors=False)
            payload = {"apiKey": MARKER, "nested": {"accessToken": MARKER, "cardNumber": MARKER}, "ok": 1}
            await http.post("/reach", json={"targetTask": "echo", "payload": payload})
            reply_to = f"http://127.0.0.1:{agent.port}/reach?token={MARKER}"
            await http.post(
                "/reach",
                json={
                    "traceId": "async-1",
                    "targetTask": "echo",
                    "preferences": {"mode": "async", "replyTo": reply_to},
                },
            )
            forged = "http://127.0.0.1:9/cb\n2026-11-30T00:00:00.000Z INFO [registry] registered evil"
            await http.post(
                "/reach", json={"targetTask": "echo", "preferences": {"mode": "async", "replyTo": forged}}
            )
            for _ in range(50):
                if (await http.get("/reach/async-1")).status_code == 200:
                    break
            traces = (await http.get("/admin/traces?limit=100")).text
            metrics = (await http.get("/metrics")).text
            agents = (await http.get("/admin/agents")).text
        finally:
            await agent.stop()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for where, text in (("logs", logged), ("traces", traces), ("metrics", metrics), ("agents", agents)):
        assert lease not in text, f"the lease is in the {where}"
        assert MARKER not in text, f"a secret is in the {where}"
    assert fingerprint(lease) in logged
    assert not any(
        line.lstrip().startswith("2026-11-30T00:00:00.000Z INFO [registry] registered evil")
        for line in logged.splitlines()
    )


async def test_unicode_line_breaks_in_caller_text_are_escaped(
    http, make_agent, caplog: pytest.LogCaptureFixture
) -> None:
    """U+2028, NEL and bidi controls in sourceAgent or targetTask never reach a log line raw."""
    caplog.set_level(logging.INFO)
    await make_agent("a")
    body = {"sourceAgent": "src\u2028FORGED\u0085y\u202eRTL", "targetTask": "echo\u2028FORGED", "payload": {}}
    await http.post("/reach", json=body)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for raw in ("\u2028", "\u0085", "\u202e"):
        assert raw not in logged
    assert "\\u2028FORGED" in logged
