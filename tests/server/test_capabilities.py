"""GET /admin/capabilities (the bridges' catalogue) and managed registrations over HTTP."""

from __future__ import annotations

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer


async def test_the_catalogue_lists_tasks_with_json_schemas(http, make_agent) -> None:
    """Shorthand schemas come out as JSON Schema; the first agent by id describes a shared task."""
    await make_agent("b-agent", tasks=("price",), input_schema={"sku": "string"}, descriptions={"price": "B"})
    await make_agent("a-agent", tasks=("price", "stock"), descriptions={"price": "A"})
    rows = (await http.get("/admin/capabilities")).json()
    assert [r["task"] for r in rows] == ["price", "stock"]
    price = rows[0]
    assert price["agents"] == ["a-agent", "b-agent"] and price["description"] == "A"
    assert price["inputSchema"] is None  # a-agent declared none, and it comes first


async def test_a_managed_registration_shows_protocol_and_no_ttl(http) -> None:
    """Auth off (every caller is admin): a managed A2A profile registers with ttlSeconds 0."""
    profile = {
        "id": "imported",
        "network": {"protocol": "a2a", "endpoint": "http://127.0.0.1:9/"},
        "capabilities": [{"task": "summarise"}],
        "managed": True,
    }
    resp = await http.post("/agents", json=profile)
    assert resp.status_code == 201 and resp.json()["ttlSeconds"] == 0
    status = (await http.get("/admin/agents/imported")).json()
    assert status["protocol"] == "a2a" and status["managed"] is True
    bad = await http.post("/agents", json={**profile, "id": "other", "managed": "yes"})
    assert bad.status_code == 422


async def test_only_an_admin_may_register_managed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent token keeps a lease; a lease-less entry is an operator's: 403 for the agent."""
    monkeypatch.setenv("REACH_ADMIN_TOKEN", "admin-secret")
    monkeypatch.setenv("REACH_AGENT_TOKEN", "agent-secret")
    profile = {
        "id": "imported",
        "network": {"protocol": "a2a", "endpoint": "http://127.0.0.1:9/"},
        "capabilities": [{"task": "summarise"}],
        "managed": True,
    }
    config = RouterConfig.model_validate({"health": {"enabled": False}, "embedding": {"backend": "none"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as http:
        as_agent = await http.post("/agents", json=profile, headers={"Authorization": "Bearer agent-secret"})
        assert as_agent.status_code == 403
        as_admin = await http.post("/agents", json=profile, headers={"Authorization": "Bearer admin-secret"})
        assert as_admin.status_code == 201
