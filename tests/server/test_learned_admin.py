"""GET, POST and DELETE /admin/learned: the operator's way to confirm a route, and its roles."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

ADMIN, CALLER, AGENT = "adm-secret", "caller-secret", "agent-secret"


def _policy(*, learning: bool) -> RouterConfig:
    def token(role: str, secret: str) -> dict[str, str]:
        return {"role": role, "sha256": hashlib.sha256(secret.encode()).hexdigest()}

    return RouterConfig.model_validate(
        {
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "embedding": {"backend": "none"},
            "routing": {"learning": {"enabled": learning, "max_phrases": 2}},
            "auth": {"tokens": [token("admin", ADMIN), token("caller", CALLER), token("agent", AGENT)]},
        }
    )


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def _router(learning: bool) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    async with (
        RouterServer(_policy(learning=learning)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=15) as http,
    ):
        agent = await FakeAgent("parcel-agent", tasks=("track_parcel",)).start()
        (await http.post("/agents", json=agent.profile(), headers=_as(ADMIN))).raise_for_status()
        yield server, http
        await agent.stop()


@pytest.fixture
async def learning_on() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    """A Router without an embedder, auth on, learning on (at most 2 phrases), one parcel agent."""
    async for made in _router(True):
        yield made


@pytest.fixture
async def learning_off() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    """As learning_on, with learning off (the default)."""
    async for made in _router(False):
        yield made


async def confirm(http: httpx.AsyncClient, phrase: str, task: str, secret: str = ADMIN) -> httpx.Response:
    return await http.post("/admin/learned", json={"phrase": phrase, "task": task}, headers=_as(secret))


async def test_an_operator_confirms_lists_and_forgets_a_route(learning_on) -> None:
    """POST remembers (201), the phrase routes by `learned` without any model, GET lists it,
    DELETE forgets it (204, then 404) and the phrase is no longer routed."""
    _server, http = learning_on
    made = await confirm(http, "Where is my parcel", "track_parcel")
    assert made.status_code == 201, made.text
    assert made.json()["source"] == "operator" and made.json()["declared"] is True
    body: dict[str, Any] = (
        await http.post("/reach", json={"targetTask": "where is  my PARCEL"}, headers=_as(CALLER))
    ).json()
    assert body["status"] == "SUCCESS", body
    trace = (await http.get(f"/admin/traces/{body['traceId']}", headers=_as(ADMIN))).json()
    assert trace["hops"][0]["decision"]["rule"] == "learned"
    listing = (await http.get("/admin/learned", headers=_as(ADMIN))).json()
    assert listing["enabled"] is True and listing["maxPhrases"] == 2 and listing["count"] == 1
    assert listing["learned"][0]["phrase"] == "Where is my parcel"
    gone = await http.delete("/admin/learned", params={"phrase": "where is my parcel"}, headers=_as(ADMIN))
    assert gone.status_code == 204
    again = await http.delete("/admin/learned", params={"phrase": "where is my parcel"}, headers=_as(ADMIN))
    assert again.status_code == 404
    refused = (
        await http.post("/reach", json={"targetTask": "where is my parcel"}, headers=_as(CALLER))
    ).json()
    assert refused["status"] == "NO_AVAILABLE_HANDLER"


async def test_only_an_admin_may_see_or_change_learned_routes(learning_on) -> None:
    """Callers and agents get 403, no token 401, on every method of /admin/learned."""
    _server, http = learning_on
    for secret in (CALLER, AGENT):
        assert (await confirm(http, "p", "track_parcel", secret)).status_code == 403
        assert (await http.get("/admin/learned", headers=_as(secret))).status_code == 403
        forget = await http.delete("/admin/learned", params={"phrase": "p"}, headers=_as(secret))
        assert forget.status_code == 403
    assert (await http.get("/admin/learned")).status_code == 401
    assert (await http.get("/admin/learned", headers=_as(ADMIN))).json()["count"] == 0


async def test_bad_confirmations_are_refused_and_the_table_is_bounded(learning_on) -> None:
    """An undeclared task or a bad phrase is 400; past max_phrases the oldest route goes."""
    _server, http = learning_on
    unknown = await confirm(http, "where is it", "no_such_task")
    assert unknown.status_code == 400 and unknown.json()["error"]["details"][0]["field"] == "task"
    blank = await confirm(http, "   ", "track_parcel")
    assert blank.status_code == 400 and blank.json()["error"]["details"][0]["field"] == "phrase"
    missing = await http.delete("/admin/learned", headers=_as(ADMIN))
    assert missing.status_code == 400
    for phrase in ("one", "two", "three"):
        assert (await confirm(http, phrase, "track_parcel")).status_code == 201
    listing = (await http.get("/admin/learned", headers=_as(ADMIN))).json()
    assert sorted(r["phrase"] for r in listing["learned"]) == ["three", "two"]


async def test_confirming_while_learning_is_off_is_a_conflict(learning_off) -> None:
    """With routing.learning.enabled false, POST answers 409 LEARNING_DISABLED and nothing is kept."""
    _server, http = learning_off
    refused = await confirm(http, "where is my parcel", "track_parcel")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "LEARNING_DISABLED"
    listing = (await http.get("/admin/learned", headers=_as(ADMIN))).json()
    assert listing == {
        "enabled": False,
        "maxPhrases": 2,
        "count": 0,
        "pendingVectors": 0,
        "learned": [],
        "negativesEnabled": True,
        "scope": "caller",
        "negativeTtlSeconds": 3600,
        "negatives": [],
    }
