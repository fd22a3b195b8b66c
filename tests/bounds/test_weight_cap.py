"""A policy cap on routing_weight: a newcomer cannot outbid an incumbent by declaring 10,000."""

from __future__ import annotations

import hashlib
from collections import Counter

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

INCUMBENT = "weight-incumbent-0123456789"
NEWCOMER = "weight-newcomer-0123456789"
TRUSTED = "weight-trusted-0123456789"
CALLER = "weight-caller-0123456789"


def spec(token: str, role: str, **extra: object) -> dict[str, object]:
    return {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest(), **extra}


async def test_a_newcomer_declaring_10000_is_refused_and_the_incumbent_keeps_its_traffic() -> None:
    """Under the default cap (routing.max_weight 100) a weight of 10,000 is 422 at the field; the
    newcomer at 100 against the incumbent at 10 takes a share, never all; a token granted
    max_weight 1000 may declare 1000."""
    policy = {
        "auth": {
            "tokens": [
                spec(INCUMBENT, "agent"),
                spec(NEWCOMER, "agent"),
                spec(TRUSTED, "agent", max_weight=1000),
                spec(CALLER, "caller"),
            ]
        },
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
    }
    async with (
        RouterServer(RouterConfig.model_validate(policy)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=15) as http,
    ):
        incumbent = FakeAgent("incumbent", tasks=("pay",), weight=10)
        newcomer = FakeAgent("newcomer", tasks=("pay",), weight=10_000)
        try:
            for agent in (incumbent, newcomer):
                await agent.start()
            resp = await http.post(
                "/agents", json=incumbent.profile(), headers={"Authorization": f"Bearer {INCUMBENT}"}
            )
            assert resp.status_code == 201
            resp = await http.post(
                "/agents", json=newcomer.profile(), headers={"Authorization": f"Bearer {NEWCOMER}"}
            )
            assert resp.status_code == 422
            [detail] = resp.json()["error"]["details"]
            assert detail["field"] == "capabilities.0.routing_weight"
            assert "routing.max_weight" in detail["message"] and "10000" in detail["message"]
            newcomer.weight = 100
            resp = await http.post(
                "/agents", json=newcomer.profile(), headers={"Authorization": f"Bearer {NEWCOMER}"}
            )
            assert resp.status_code == 201
            caller = {"Authorization": f"Bearer {CALLER}"}
            handlers: Counter[str] = Counter()
            for _ in range(110):
                body = {"targetTask": "pay", "preferences": {"strategy": "weighted_round_robin"}}
                answer = (await http.post("/reach", json=body, headers=caller)).json()
                handlers[answer["handlerAgentId"]] += 1
            assert handlers["incumbent"] >= 5, handlers
            trusted = {**newcomer.profile(), "id": "trusted"}
            trusted["capabilities"][0]["routing_weight"] = 1000
            resp = await http.post("/agents", json=trusted, headers={"Authorization": f"Bearer {TRUSTED}"})
            assert resp.status_code == 201
        finally:
            for agent in (incumbent, newcomer):
                await agent.stop()
