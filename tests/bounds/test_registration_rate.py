"""One agent token cannot write the registry full: profile bytes, and registrations per minute."""

from __future__ import annotations

from typing import Any

import httpx

from reachmesh.clock import ManualClock
from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer
from tests.bounds.quota import ADMIN, TOKEN_A, TOKEN_B, body, tokens


def config(**registry: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "auth": tokens(),
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "registry": registry,
        }
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_profile_over_max_profile_bytes_is_refused_with_the_key_named() -> None:
    """A 20 KB description under a 16 KiB bound: 422 INVALID_PROFILE naming the size and the
    key; the same agent with a short description is taken."""
    big = body("big-agent")
    big["capabilities"][0]["input_schema"] = {"type": "object", "description": "x" * 20_000}
    policy = config(max_profile_bytes=16 * 1024)
    async with RouterServer(policy) as router, httpx.AsyncClient(timeout=15) as http:
        resp = await http.post(f"{router.url}/agents", json=big, headers=bearer(TOKEN_A))
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "INVALID_PROFILE"
        assert "registry.max_profile_bytes" in error["message"] and "16384" in error["message"]
        resp = await http.post(f"{router.url}/agents", json=body("big-agent"), headers=bearer(TOKEN_A))
        assert resp.status_code == 201, resp.text


async def test_re_registering_in_a_loop_gets_429_with_retry_after_and_spares_other_tokens() -> None:
    """A burst of 3 and 6 a minute: token A's fourth re-registration is 429 OVERLOADED with a
    Retry-After of 10 s (one registration's worth of refill); token B and the admin still
    register; after 10 s on the Router's clock, A registers again."""
    clock = ManualClock()
    policy = config(registration_burst_per_token=3, registrations_per_minute_per_token=6)
    async with RouterServer(policy, clock=clock) as router, httpx.AsyncClient(timeout=15) as http:
        lease = None
        for _ in range(3):
            profile = {**body("a-agent"), **({"leaseId": lease} if lease else {})}
            resp = await http.post(f"{router.url}/agents", json=profile, headers=bearer(TOKEN_A))
            assert resp.status_code in (200, 201), resp.text
            lease = resp.json()["leaseId"]
        resp = await http.post(
            f"{router.url}/agents", json={**body("a-agent"), "leaseId": lease}, headers=bearer(TOKEN_A)
        )
        assert resp.status_code == 429, resp.text
        assert resp.headers["retry-after"] == "10"
        error = resp.json()["error"]
        assert error["code"] == "OVERLOADED" and error["retryAfterSeconds"] == 10
        assert "registry.registrations_per_minute_per_token" in error["message"]
        for token, agent in ((TOKEN_B, "b-agent"), (ADMIN, "admin-agent")):
            resp = await http.post(f"{router.url}/agents", json=body(agent), headers=bearer(token))
            assert resp.status_code == 201, resp.text
        clock.advance(10)
        resp = await http.post(
            f"{router.url}/agents", json={**body("a-agent"), "leaseId": lease}, headers=bearer(TOKEN_A)
        )
        assert resp.status_code == 200, resp.text
