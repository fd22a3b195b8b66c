"""One agent token that lets its leases lapse and registers new ids must not fill the registry."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import httpx

TOKEN_A = "quota-token-a-0123456789"
TOKEN_B = "quota-token-b-0123456789"
ADMIN = "quota-admin-0123456789ab"


def tokens() -> dict[str, Any]:
    """The auth section: two agent tokens and an admin."""

    def spec(token: str, role: str) -> dict[str, str]:
        return {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest(), "name": token[:13]}

    return {"tokens": [spec(TOKEN_A, "agent"), spec(TOKEN_B, "agent"), spec(ADMIN, "admin")]}


def body(agent_id: str) -> dict[str, Any]:
    return {
        "id": agent_id,
        "network": {"endpoint": "http://127.0.0.1:9/reach"},
        "capabilities": [{"task": "t"}],
    }


async def rows(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    resp = await http.get(f"{url}/admin/agents", headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()
    return found


async def one_token_cannot_fill_the_registry(
    http: httpx.AsyncClient, url: str, *, rounds: int, per_token: int
) -> None:
    """Token A registers ``per_token`` new ids per round and lets them go offline, ``rounds``
    times (more ids than the registry holds); A never holds more than its quota of entries,
    offline ones included, each of its registrations is taken, and token B's agent is taken."""
    a = {"Authorization": f"Bearer {TOKEN_A}"}
    for round_ in range(rounds):
        for i in range(per_token):
            resp = await http.post(f"{url}/agents", json=body(f"a-{round_}-{i}"), headers=a)
            assert resp.status_code == 201, resp.text
        assert len(await rows(http, url)) <= per_token
        deadline = time.monotonic() + 20
        while any(row["status"] != "offline" for row in await rows(http, url)):
            assert time.monotonic() < deadline, "leases never ran out"
            await asyncio.sleep(0.05)
    resp = await http.post(
        f"{url}/agents", json=body("b-agent"), headers={"Authorization": f"Bearer {TOKEN_B}"}
    )
    assert resp.status_code == 201, resp.text
    listed = {row["id"] for row in await rows(http, url)}
    assert "b-agent" in listed and len(listed) <= per_token + 1
