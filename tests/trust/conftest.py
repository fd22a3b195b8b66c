"""A Router with auth on and two tenants, for the trust model's tests (docs/security.md).

Team A's agent token may register ``a-*`` ids serving ``a_*`` tasks, team B's ``b-*`` and ``b_*``;
caller A's token reaches ``a_*`` tasks by meaning only, caller B's any. Policies here use only
keys the Router had before the trust model, except where a test is about a new key.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

ADMIN, CALLER_A, CALLER_B, AGENT_A, AGENT_B = "adm-trust-1", "cal-a-22", "cal-b-33", "agt-a-44", "agt-b-55"

TRACK = "a_track_order"
PRICE = "a_query_product_price"
TRACK_TEXT = "Shows where an order is: its shipping status and tracking events."


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tokens(**caller_a: Any) -> list[dict[str, Any]]:
    """The five tokens; ``caller_a`` adds keys to caller A's."""
    return [
        {"role": "admin", "sha256": sha(ADMIN), "name": "ops"},
        {"role": "caller", "sha256": sha(CALLER_A), "name": "caller a", **caller_a},
        {"role": "caller", "sha256": sha(CALLER_B), "name": "caller b"},
        {"role": "agent", "sha256": sha(AGENT_A), "agent_ids": ["a-*"], "tasks": ["a_*"], "name": "team a"},
        {"role": "agent", "sha256": sha(AGENT_B), "agent_ids": ["b-*"], "tasks": ["b_*"], "name": "team b"},
    ]


def secured(
    *, semantic: bool = True, caller_a: dict[str, Any] | None = None, **sections: Any
) -> RouterConfig:
    policy: dict[str, Any] = {
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
        "auth": {"tokens": tokens(**(caller_a or {}))},
        "embedding": {"backend": "auto", "limit_margin": 0.33} if semantic else {"backend": "none"},
    }
    if semantic:
        policy["routing"] = {"semantic_tasks": ["*"]}
    for name, values in sections.items():
        policy[name] = {**policy.get(name, {}), **values}
    return RouterConfig.model_validate(policy)


def tracker(agent_id: str, **extra: Any) -> FakeAgent:
    return FakeAgent(
        agent_id,
        tasks=(TRACK,),
        descriptions={TRACK: TRACK_TEXT},
        examples={TRACK: ["where is my order"]},
        **extra,
    )


def pricer(agent_id: str = "a-price") -> FakeAgent:
    return FakeAgent(
        agent_id,
        tasks=(PRICE,),
        descriptions={PRICE: "查询指定商品的当前售价"},
        examples={PRICE: ["how much does it cost"]},
    )


async def started(server: RouterServer, token: str, *agents: FakeAgent) -> list[FakeAgent]:
    for agent in agents:
        await agent.start()
        await agent.register(server.url, token=token, admin_token=ADMIN)
    return list(agents)


async def stop(agents: list[FakeAgent]) -> None:
    for agent in agents:
        await agent.stop()


async def reach(
    http: httpx.AsyncClient, token: str, task: str, payload: Any = None, **prefs: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"targetTask": task, "payload": payload or {}}
    for field in ("conversationId", "targetAgent"):
        if field in prefs:
            body[field] = prefs.pop(field)
    if prefs:
        body["preferences"] = prefs
    answer: dict[str, Any] = (await http.post("/reach", json=body, headers=bearer(token))).json()
    return answer


async def settled(server: RouterServer) -> None:
    """Wait until what finished requests taught is kept (the learner writes in the background)."""
    learner = server.app.parts.learner
    for _ in range(2000):  # bounded: a write that never ends fails the test
        if not learner.pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the learner never settled")


async def learned(http: httpx.AsyncClient) -> dict[str, Any]:
    listing: dict[str, Any] = (await http.get("/admin/learned", headers=bearer(ADMIN))).json()
    return listing


@asynccontextmanager
async def router(config: RouterConfig) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        yield server, http
