"""A Router registered as an agent of itself: each call is forwarded back a bounded number of times.

Found by an attacker's probe: an agent whose endpoint is the Router's own /reach (loopback and
private addresses are allowed by default) had one call forwarded back to the Router 256 deep,
until the Router's own client slots ran out: one request became 256. Each attempt now says how
many Routers the request came through (X-Reach-Hops), and past 8 the Router refuses it
(508 LOOP_DETECTED). Real Router on loopback.
"""

from __future__ import annotations

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer
from reachmesh.transport.base import MAX_HOPS
from tests.helpers import scaled

POLICY = {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}


def served(metrics: str, agent: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("reach_requests_total{") and f'agent="{agent}"' in line
    )


async def test_a_router_forwarding_to_itself_stops_after_max_hops() -> None:
    async with (
        RouterServer(RouterConfig.model_validate(POLICY)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http,
    ):
        profile = {
            "id": "loopy",
            "network": {"endpoint": f"{router.url}/reach"},
            "capabilities": [{"task": "loop"}],
        }
        assert (await http.post("/agents", json=profile)).status_code == 201
        call = {"targetTask": "loop", "preferences": {"timeoutMs": 30_000}}
        answer = await http.post("/reach", json=call)
        assert answer.json()["status"] == "NO_AVAILABLE_HANDLER", answer.text
        metrics = (await http.get("/metrics")).text
        # The caller's request and one per Router it came back through (before: 256).
        assert served(metrics, "loopy") <= MAX_HOPS, metrics


async def test_a_request_past_the_hop_bound_is_refused_loop_detected() -> None:
    async with (
        RouterServer(RouterConfig.model_validate(POLICY)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http,
    ):
        call = {"targetTask": "anything"}
        answer = await http.post("/reach", json=call, headers={"X-Reach-Hops": str(MAX_HOPS)})
        assert answer.status_code == 508
        body = answer.json()
        assert body["status"] == "INVALID_REQUEST" and body["error"]["code"] == "LOOP_DETECTED"
        assert "X-Reach-Hops" in body["error"]["message"]
        # Below the bound, and with a value that is not a count, it is served as usual.
        for hops in (str(MAX_HOPS - 1), "many"):
            ok = await http.post("/reach", json=call, headers={"X-Reach-Hops": hops})
            assert ok.json()["status"] == "NO_AVAILABLE_HANDLER", ok.text
