"""Credentials and roles: every endpoint against no token, a wrong one, and each role."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import AuthPolicy, RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.server.auth import TokenGuard
from reachmesh.testing import FakeAgent, RouterServer

ADMIN, CALLER, AGENT, OTHER_CALLER = "adm-5e1f", "cal-77aa", "agt-09b3", "cal-other-31"
PRICE, OTHER = "agt-price-44", "agt-other-45"
TOKENS = {"none": None, "wrong": "not-a-token", "caller": CALLER, "agent": AGENT, "admin": ADMIN}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def profile(agent_id: str, task: str = "t") -> dict:
    """A profile at an endpoint nobody listens on: these tests never call the agent."""
    endpoint = {"endpoint": "http://127.0.0.1:9/reach"}
    return {"id": agent_id, "network": endpoint, "capabilities": [{"task": task}]}


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
async def secured(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[RouterServer, FakeAgent]]:
    """A Router with env tokens for each role, two bound agent tokens in the policy, and one agent."""
    monkeypatch.setenv("REACH_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("REACH_CALLER_TOKEN", f"{CALLER},{OTHER_CALLER}")
    monkeypatch.setenv("REACH_AGENT_TOKEN", AGENT)
    policy = {
        "health": {"enabled": False},
        "embedding": {"backend": "none"},
        "auth": {
            "tokens": [
                {"role": "agent", "sha256": sha(PRICE), "agent_ids": ["price-*"], "tasks": ["query_*"]},
                {"role": "agent", "sha256": sha(OTHER), "agent_ids": ["other-*"], "name": "other team"},
            ]
        },
    }
    async with RouterServer(RouterConfig.model_validate(policy)) as router:
        agent = await FakeAgent("echo-agent").start()
        async with httpx.AsyncClient(base_url=router.url) as http:
            resp = await http.post("/agents", json=agent.profile(), headers=auth(ADMIN))
            assert resp.status_code == 201, resp.text
        yield router, agent
        await agent.stop()


MATRIX = [
    # (method, path, body, expected status per: none, wrong, caller, agent, admin)
    ("GET", "/healthz", None, (200, 200, 200, 200, 200)),
    ("GET", "/readyz", None, (200, 200, 200, 200, 200)),
    ("GET", "/openapi.json", None, (200, 200, 200, 200, 200)),
    ("GET", "/metrics", None, (401, 401, 403, 403, 200)),
    ("GET", "/admin/agents", None, (401, 401, 403, 403, 200)),
    ("GET", "/admin/agents/echo-agent", None, (401, 401, 403, 403, 200)),
    ("GET", "/admin/traces", None, (401, 401, 403, 403, 200)),
    ("GET", "/admin/summary", None, (401, 401, 403, 403, 200)),
    # The admin page holds no data: it loads for anyone, and its data calls need the admin token.
    ("GET", "/admin/ui", None, (200, 200, 200, 200, 200)),
    ("GET", "/admin/ui/app.js", None, (200, 200, 200, 200, 200)),
    ("POST", "/admin/reload", None, (401, 401, 403, 403, 409)),
    ("POST", "/reach", {"targetTask": "echo"}, (401, 401, 200, 200, 200)),
    ("GET", "/reach/never-started", None, (401, 401, 404, 404, 404)),
    ("POST", "/agents", "profile", (401, 401, 403, 201, 201)),
    ("PUT", "/agents/matrix-agent/lease", {"leaseId": "0x0"}, (401, 401, 403, 404, 404)),
    ("DELETE", "/agents/matrix-agent", {"leaseId": "0x0"}, (401, 401, 403, 404, 404)),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"), MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX]
)
async def test_role_matrix(secured, method: str, path: str, body: object, expected: tuple[int, ...]) -> None:
    """Each endpoint answers 2xx (or its own 4xx), 401 or 403 as the role table says."""
    router, _agent = secured
    seen = []
    async with httpx.AsyncClient(base_url=router.url) as http:
        for who, token in TOKENS.items():
            payload = body
            if body == "profile":
                payload = profile(f"matrix-{who}")
            resp = await http.request(method, path, json=payload, headers=auth(token))
            seen.append(resp.status_code)
            if resp.status_code == 401:
                assert resp.headers["www-authenticate"].startswith("Bearer")
            if resp.status_code in (401, 403):
                error = resp.json()["error"]
                assert error["code"] == ("UNAUTHORIZED" if resp.status_code == 401 else "FORBIDDEN")
                assert token is None or token not in resp.text
    assert tuple(seen) == expected


async def test_a_bound_agent_token_registers_only_its_ids_and_tasks(secured) -> None:
    """A token bound to price-* and query_* can't register pay-agent, nor serve pay_task."""
    router, _ = secured

    async with httpx.AsyncClient(base_url=router.url) as http:
        ok = await http.post("/agents", json=profile("price-1", "query_price"), headers=auth(PRICE))
        assert ok.status_code == 201
        lease = ok.json()["leaseId"]
        hijack = await http.post("/agents", json=profile("price-2", "pay_task"), headers=auth(PRICE))
        assert hijack.status_code == 403 and "pay_task" in hijack.json()["error"]["message"]
        foreign = await http.post("/agents", json=profile("pay-agent", "query_price"), headers=auth(PRICE))
        assert foreign.status_code == 403
        # Another agent's token can't renew, deregister or re-register the id, lease or not.
        other = auth(OTHER)
        assert (
            await http.put("/agents/price-1/lease", json={"leaseId": lease}, headers=other)
        ).status_code == 403
        assert (
            await http.request("DELETE", "/agents/price-1", json={"leaseId": lease}, headers=other)
        ).status_code == 403
        again = {**profile("price-1", "query_price"), "leaseId": lease}
        assert (await http.post("/agents", json=again, headers=other)).status_code == 403
        # The owner can.
        assert (
            await http.put("/agents/price-1/lease", json={"leaseId": lease}, headers=auth(PRICE))
        ).status_code == 200


async def test_async_results_belong_to_their_caller(secured) -> None:
    """GET /reach/{traceId} answers the caller that started it and admins; others get 404."""
    router, _ = secured
    async with httpx.AsyncClient(base_url=router.url) as http:
        body = {"traceId": "mine-1", "targetTask": "echo", "preferences": {"mode": "async"}}
        assert (await http.post("/reach", json=body, headers=auth(CALLER))).status_code == 202
        for _ in range(50):
            if (await http.get("/reach/mine-1", headers=auth(CALLER))).status_code == 200:
                break
        assert (await http.get("/reach/mine-1", headers=auth(CALLER))).status_code == 200
        assert (await http.get("/reach/mine-1", headers=auth(ADMIN))).status_code == 200
        assert (await http.get("/reach/mine-1", headers=auth(OTHER_CALLER))).status_code == 404
        assert (await http.get("/reach/mine-1", headers=auth(AGENT))).status_code == 404


async def test_auth_is_off_by_default(http) -> None:
    """With no token configured, every endpoint answers without one (the demo needs nothing)."""
    assert (await http.get("/admin/agents")).status_code == 200
    assert (await http.get("/metrics")).status_code == 200


async def test_the_openapi_document_declares_the_bearer_scheme(http) -> None:
    """The document names the bearer scheme and leaves health and itself open."""
    document = (await http.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert "security" not in document["paths"]["/healthz"]["get"]
    assert {"bearer": []} in document["paths"]["/admin/agents"]["get"]["security"]


async def test_an_agent_token_holds_at_most_its_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """registry.max_agents_per_token: the third agent of one token is refused until one leaves."""
    monkeypatch.setenv("REACH_AGENT_TOKEN", AGENT)
    policy = {"registry": {"max_agents_per_token": 2}, "embedding": {"backend": "none"}}

    async with (
        RouterServer(RouterConfig.model_validate(policy)) as router,
        httpx.AsyncClient(base_url=router.url, headers=auth(AGENT)) as http,
    ):
        leases = {}
        for agent_id in ("q-1", "q-2"):
            resp = await http.post("/agents", json=profile(agent_id))
            assert resp.status_code == 201
            leases[agent_id] = resp.json()["leaseId"]
        third = await http.post("/agents", json=profile("q-3"))
        assert (third.status_code, third.json()["error"]["code"]) == (503, "REGISTRY_FULL")
        # Replacing one of its own agents in place is not a new one.
        again = await http.post("/agents", json={**profile("q-1"), "leaseId": leases["q-1"]})
        assert again.status_code == 200
        gone = await http.request("DELETE", "/agents/q-2", json={"leaseId": leases["q-2"]})
        assert gone.status_code == 204
        assert (await http.post("/agents", json=profile("q-3"))).status_code == 201


def test_two_tokens_with_one_fingerprint_are_refused() -> None:
    """A token's fingerprint (32 bits of its digest) is the owner of its async results, in etcd
    too, and of its share of them: two tokens with one fingerprint were accepted, and each
    could read the other's results. A tenant who hands the operator a digest can grind a token
    with another's fingerprint (shown in logs, stored in etcd): the policy is refused."""
    victim = {"role": "caller", "sha256": "abcd1234" + "0" * 56, "name": "victim"}
    grinder = {"role": "caller", "sha256": "abcd1234" + "f" * 56}
    with pytest.raises(ConfigError) as refused:
        TokenGuard.from_policy(AuthPolicy.model_validate({"tokens": [victim, grinder]}), {})
    assert "fp:abcd1234" in refused.value.message and "victim" in refused.value.message
    # The same digest twice is one token, not two.
    guard = TokenGuard.from_policy(AuthPolicy.model_validate({"tokens": [victim, victim]}), {})
    assert guard is not None


def test_a_token_is_compared_with_every_known_digest_whichever_it_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The constant-time property: no early exit at a match, and each principal's grants as before."""
    import hmac

    from reachmesh.dispatch.dispatcher import EVERY_TASK, Grants
    from reachmesh.server.auth import Action, Principal

    tokens = {"tok-a": "caller", "tok-b": "admin", "tok-c": "agent"}
    specs: list[dict[str, Any]] = [
        {"role": r, "sha256": hashlib.sha256(t.encode()).hexdigest()} for t, r in tokens.items()
    ]
    specs[2]["tasks"] = ["echo"]
    guard = TokenGuard.from_policy(AuthPolicy.model_validate({"tokens": specs}), {})
    assert guard is not None
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for token, role in [*tokens.items(), ("unknown", None)]:
        compared.clear()
        scope: dict[str, Any] = {"headers": [(b"host", b"x"), (b"authorization", f"Bearer {token}".encode())]}
        guard.check(Action.REACH, scope)
        assert len(compared) == 3, token
        principal: Principal | None = scope.get("reach.principal")
        assert (principal.role if principal else None) == role
        if principal is not None:
            assert principal.grants == Grants(principal.serves, principal.reach_tasks)
            assert (principal.grants is EVERY_TASK) == (principal.role != "agent")
    assert guard.check(Action.REACH, {"headers": [(b"host", b"x")]}) is not None  # no token: refused
