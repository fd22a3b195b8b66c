"""The trust model on etcd (issue 36): what a caller or an agent can leave in the shared store,
with auth on, reaches every Router only as far as docs/security.md says."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from reachmesh.registry.base import LearnedRoute
from reachmesh.testing import RouterServer, wait_vectors
from tests.etcd.conftest import etcd_policy
from tests.trust.conftest import (
    ADMIN,
    AGENT_A,
    AGENT_B,
    CALLER_A,
    CALLER_B,
    TRACK,
    bearer,
    pricer,
    reach,
    settled,
    started,
    stop,
    tokens,
    tracker,
)
from tests.trust.test_tenants import confirm_by_retry, tenants

pytestmark = pytest.mark.etcd


def policy(etcd: Any, **routing: Any) -> Any:
    return etcd_policy(
        etcd,
        health={"enabled": False},
        auth={"tokens": tokens()},
        routing={"semantic_tasks": ["*"], **routing},
        # No few-shot head: the refund capabilities of A and B must tie by similarity, so that a
        # phrase is refused and a retry can confirm a route (the head would break the tie).
        embedding={"backend": "auto", "limit_margin": 0.33, "head": False},
    )


async def listing(http: httpx.AsyncClient, url: str, key: str, count: int) -> list[dict[str, Any]]:
    """``key`` of /admin/learned on ``url`` once it holds ``count`` items (the watch brings them)."""
    for _ in range(3000):  # bounded: what never arrives fails the test
        items: list[dict[str, Any]] = (await http.get(f"{url}/admin/learned", headers=bearer(ADMIN))).json()[
            key
        ]
        if len(items) == count:
            return items
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached {count} {key}")


async def test_negatives_on_etcd_are_per_registration_and_never_from_a_narrowed_request(etcd, client) -> None:
    """Reproduction 1 on etcd: caller B's narrowed request stores nothing; a request that let the
    Router choose stores the decliner's own negative, with its TTL, and another Router keeps the
    phrase off that agent alone. The agent registered afresh is offered the phrase again there."""
    config = policy(etcd)
    async with RouterServer(config) as first, RouterServer(config) as second:
        picky = tracker("a-picky", mode="decline", weight=100)
        agents = await started(first, AGENT_A, picky, tracker("a-taker"), pricer())
        try:
            async with httpx.AsyncClient(base_url=first.url, timeout=60) as http:
                planted = await reach(http, CALLER_B, "where is my order", filterAgentIds=["a-picky"])
                assert planted["status"] == "NO_AVAILABLE_HANDLER"
                await settled(first)
                for _ in range(50):
                    await reach(http, CALLER_B, "where is my order")
                    if len(picky.received) > 1:
                        break
                await settled(first)
            (negative,) = await listing(client, second.url, "negatives", 1)
            assert (negative["agent"], negative["task"], negative["applies"]) == ("a-picky", TRACK, True)
            assert negative["expires"] and negative["by"].startswith("fp:")
            async with httpx.AsyncClient(base_url=second.url, timeout=60) as http:
                for agent in agents:
                    await wait_vectors(second.url, agent.agent_id, token=ADMIN)
                tried = len(picky.received)
                for _ in range(3):
                    answer = await reach(http, CALLER_A, "Where is MY order")
                    assert [a["agentId"] for a in answer["attempts"]] == ["a-taker"], answer
                assert len(picky.received) == tried
                await picky.register(second.url, token=AGENT_A, admin_token=ADMIN)
                for _ in range(100):
                    negatives = (await http.get("/admin/learned", headers=bearer(ADMIN))).json()["negatives"]
                    if negatives and negatives[0]["applies"] is False:
                        break
                    await asyncio.sleep(0.02)
                assert negatives[0]["applies"] is False
        finally:
            await stop(agents)


async def test_learned_routes_on_etcd_serve_their_caller_alone(etcd, client) -> None:
    """Reproduction 4's learning on etcd: B's agent token stores no route to its own task; caller
    B's confirmation is stored for caller B, and another Router routes it for B and no one else."""
    config = policy(etcd, learning={"enabled": True})
    async with RouterServer(config) as first, RouterServer(config) as second:
        agents = await tenants(first)
        try:
            async with httpx.AsyncClient(base_url=first.url, timeout=60) as http:
                await confirm_by_retry(http, AGENT_B, "agent-b")
                await settled(first)
                await confirm_by_retry(http, CALLER_B, "caller-b")
                await settled(first)
            (route,) = await listing(client, second.url, "learned", 1)
            assert route["owner"].startswith("fp:") and route["task"] == "b_refund"
            async with httpx.AsyncClient(base_url=second.url, timeout=60) as http:
                mine = await reach(http, CALLER_B, "refund my purchase please")
                assert (mine["status"], mine.get("handlerAgentId")) == ("SUCCESS", "b-refund"), mine
                theirs = await reach(http, CALLER_A, "refund my purchase please")
                assert theirs.get("handlerAgentId") != "b-refund", theirs
        finally:
            await stop(agents)


async def test_quotas_per_token_hold_across_routers_on_etcd(etcd, client) -> None:
    """negatives_per_token: a token's flood evicts its own oldest, in etcd, never another's."""
    config = policy(etcd)
    async with RouterServer(config) as first, RouterServer(config) as second:
        registry = first.app.parts.registry
        now = first.app.parts.clock.time()

        def negative(phrase: str, by: str, at: float) -> LearnedRoute:
            return LearnedRoute(phrase, TRACK, "decline", now + at, agent="a-one", by=by, expires=now + 3600)

        await registry.remember_negative(negative("kept", "fp:a", 0), limit=100, quota=2)
        for i in range(5):
            await registry.remember_negative(negative(f"flood {i}", "fp:b", 1 + i), limit=100, quota=2)
        seen = await listing(client, second.url, "negatives", 3)
        assert sorted(n["phrase"] for n in seen) == ["flood 3", "flood 4", "kept"]
