"""The per-client in-flight limit counts a caller's credential when auth is on, its address when off."""

from __future__ import annotations

import asyncio
import hashlib

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

HOG = "slot-hog-token-0123456789"
FAIR = "slot-fair-token-0123456789"
AGENT = "slot-agent-token-0123456789"


def spec(token: str, role: str) -> dict[str, str]:
    return {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest()}


async def test_five_addresses_under_one_token_share_one_clients_slots() -> None:
    """One caller token from 127.0.0.2-6, five slow calls from each (25) against 4 slots per client
    and 12 in all: only 4 are admitted, the rest get 429 OVERLOADED, and another token's calls
    are all served meanwhile (with slots per address the hog held 20 and left it none)."""
    policy = {
        "auth": {"tokens": [spec(HOG, "caller"), spec(FAIR, "caller"), spec(AGENT, "agent")]},
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000, "max_inflight": 12, "max_inflight_per_client": 4},
        "timeouts": {"read_ms": 60_000},
    }
    async with RouterServer(RouterConfig.model_validate(policy)) as router:
        # The slow agent holds every call until the test has seen the others answered.
        release = asyncio.Event()
        slow = FakeAgent("slow", tasks=("slow",), hold=release)
        quick = FakeAgent("quick", tasks=("echo",))
        agent_auth = {"Authorization": f"Bearer {AGENT}"}
        for agent in (slow, quick):
            await agent.start()
            async with httpx.AsyncClient(headers=agent_auth) as http:
                assert (await http.post(f"{router.url}/agents", json=agent.profile())).status_code == 201
        clients = [
            httpx.AsyncClient(
                base_url=router.url,
                timeout=scaled(60),
                headers={"Authorization": f"Bearer {HOG}"},
                transport=httpx.AsyncHTTPTransport(local_address=f"127.0.0.{n}"),
            )
            for n in range(2, 7)
        ]
        fair = httpx.AsyncClient(
            base_url=router.url, timeout=scaled(60), headers={"Authorization": f"Bearer {FAIR}"}
        )
        try:
            hog_calls = [
                asyncio.create_task(client.post("/reach", json={"targetTask": "slow"}))
                for client in clients
                for _ in range(5)
            ]
            # The hog's calls are in: four held at the slow agent, the rest refused.
            await until(
                lambda: router.app.parts.shedder.inflight == 4 and sum(c.done() for c in hog_calls) == 21,
                "the hog's 4 calls in flight and its other 21 answered",
            )
            fair_answers = [(await fair.post("/reach", json={"targetTask": "echo"})).json() for _ in range(5)]
            assert [a["status"] for a in fair_answers] == ["SUCCESS"] * 5
            release.set()
            hog_answers = [(await call).json() for call in hog_calls]
            statuses = sorted(a["status"] for a in hog_answers)
            assert statuses == ["OVERLOADED"] * 21 + ["SUCCESS"] * 4, statuses
        finally:
            for client in (*clients, fair):
                await client.aclose()
            for agent in (slow, quick):
                await agent.stop()
