"""The admin page's server side: the page and its files, /admin/summary, the traffic history."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RouterConfig
from reachmesh.observability.traffic import TrafficHistory, totals_by_status
from reachmesh.server.ui import CSP, policy_digest
from reachmesh.testing import FakeAgent, RouterServer

ASSETS = Path(__file__).resolve().parents[2] / "src" / "reachmesh" / "server" / "ui_assets"


def test_traffic_history_counts_requests_per_interval_by_status() -> None:
    clock = ManualClock(wall=1_767_225_600.0)
    totals: dict[str, float] = {}
    history = TrafficHistory(lambda: totals, clock, step_seconds=2, span_seconds=6)
    history.sample()
    totals.update({"SUCCESS": 5})
    clock.advance(2)
    history.sample()
    totals.update({"SUCCESS": 6, "TIMEOUT": 3})
    clock.advance(2)
    history.sample()
    points = history.view()["points"]
    assert [p["byStatus"] for p in points] == [{"SUCCESS": 5}, {"SUCCESS": 1, "TIMEOUT": 3}]
    assert [p["seconds"] for p in points] == [2, 2]
    assert points[-1]["at"] == "2026-01-01T00:00:04.000Z"
    # Up to now: a point for a span of half a step or more, none for a sliver (no spike from it).
    totals["SUCCESS"] = 7
    clock.advance(0.5)
    assert len(history.view()["points"]) == 2
    clock.advance(0.5)
    assert history.view()["points"][-1] == {
        "at": "2026-01-01T00:00:05.000Z",
        "seconds": 1,
        "byStatus": {"SUCCESS": 1},
    }


def test_traffic_history_keeps_only_its_span() -> None:
    clock = ManualClock()
    history = TrafficHistory(lambda: {"SUCCESS": clock.time()}, clock, step_seconds=2, span_seconds=10)
    for _ in range(100):
        history.sample()
        clock.advance(2)
    assert len(history.view()["points"]) == 6  # five intervals kept, and the one up to now


def test_totals_by_status_sum_over_tasks_and_agents() -> None:
    series: dict[tuple[str, ...], float] = {
        ("a", "x", "SUCCESS"): 2.0,
        ("b", "y", "SUCCESS"): 3.0,
        ("a", "x", "TIMEOUT"): 1.0,
    }
    assert totals_by_status(series) == {"SUCCESS": 5.0, "TIMEOUT": 1.0}


async def test_the_page_and_its_files_carry_a_strict_csp(http: httpx.AsyncClient) -> None:
    page = await http.get("/admin/ui")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.text == (ASSETS / "index.html").read_text()
    for path in ("/admin/ui", "/admin/ui/app.js", "/admin/ui/app.css"):
        resp = await http.get(path)
        assert resp.headers["content-security-policy"] == CSP, path
        assert resp.headers["x-content-type-options"] == "nosniff", path
        assert resp.headers["x-frame-options"] == "DENY", path
    assert (await http.get("/admin/ui/app.css")).headers["content-type"] == "text/css; charset=utf-8"
    for missing in ("/admin/ui/index.html", "/admin/ui/nope.js", "/admin/ui/app.js/x"):
        resp = await http.get(missing)
        assert resp.status_code == 404, missing
        assert resp.json()["error"]["code"] == "NOT_FOUND"
    assert (await http.post("/admin/ui")).status_code == 405


async def test_the_address_with_a_slash_leads_to_the_page(http: httpx.AsyncClient) -> None:
    """/admin/ui/ (as people type it) redirects to /admin/ui, where the page's relative file
    names resolve, with a relative Location that survives a proxy's path prefix."""
    resp = await http.get("/admin/ui/")
    assert resp.status_code == 308 and resp.headers["location"] == "../ui"
    assert str(resp.url.join(resp.headers["location"])).endswith("/admin/ui")
    followed = await http.get("/admin/ui/", follow_redirects=True)
    assert followed.status_code == 200 and followed.url.path == "/admin/ui"
    assert followed.text == (ASSETS / "index.html").read_text()


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """Offline and behind a firewall: no URL to another origin, no inline script or style."""
    html = (ASSETS / "index.html").read_text()
    assert "http://" not in html and "https://" not in html and "//" not in html.replace("://", "")
    assert "<script>" not in html and "style=" not in html and "<style" not in html
    script = (ASSETS / "app.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script
    assert "document.write" not in script and "localStorage" not in script and "document.cookie" not in script


async def test_summary_reports_traffic_budget_shedding_and_policy(
    router: RouterServer, http: httpx.AsyncClient
) -> None:
    agent = await FakeAgent("sum-agent").start()
    try:
        await agent.register(router.url)
        assert (await http.post("/reach", json={"targetTask": "echo"})).json()["status"] == "SUCCESS"
        assert (await http.post("/reach", json={"targetTask": "nobody"})).status_code == 503
        summary = (await http.get("/admin/summary")).json()
    finally:
        await agent.stop()
    assert summary["auth"] is False and summary["ready"] is None and summary["worker"] is None
    assert summary["registry"] == {
        "backend": "memory",
        "degraded": None,
        "agents": {"available": 1, "suspect": 0, "unhealthy": 0, "offline": 0},
    }
    traffic = summary["traffic"]
    assert traffic["totals"] == {"SUCCESS": 1, "NO_AVAILABLE_HANDLER": 1}
    assert traffic["stepSeconds"] == 2 and traffic["spanSeconds"] == 300 and traffic["metricsEnabled"]
    assert summary["retryBudget"]["requests"] >= 1 and summary["retryBudget"]["enabled"] is True
    shedding = summary["shedding"]
    assert (
        shedding["active"] is False and shedding["maxInflight"] == 1024 and shedding["overloadedTotal"] == 0
    )
    policy = summary["policy"]
    assert policy["path"] is None and policy["lastReload"] is None
    assert policy["digest"] == policy_digest(router.app.config)
    assert policy["settings"]["limits"]["loop_lag_ms"] == 10_000


async def test_summary_shows_no_token_digest_and_no_url_credentials() -> None:
    digest = hashlib.sha256(b"admin-secret").hexdigest()
    config = RouterConfig.model_validate(
        {
            "auth": {"tokens": [{"sha256": digest, "role": "admin"}]},
            "embedding": {"backend": "none", "url": "http://user:pw@127.0.0.1:9/embed?key=k"},
        }
    )
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as http:
        resp = await http.get("/admin/summary", headers={"Authorization": "Bearer admin-secret"})
    assert resp.status_code == 200 and resp.json()["auth"] is True
    assert digest not in resp.text and "pw@" not in resp.text and "key=k" not in resp.text
    assert resp.json()["policy"]["settings"]["auth"] == {
        "tokensByRole": {"admin": 1},
        "metrics_public": False,
    }


async def test_summary_tells_when_the_policy_was_last_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("health: {enabled: false}\nembedding: {backend: none}\n")
    clock = ManualClock(wall=1_767_225_600.0)
    async with (
        RouterServer(RouterConfig.load(path), config_path=path, clock=clock) as router,
        httpx.AsyncClient(base_url=router.url) as http,
    ):
        before = (await http.get("/admin/summary")).json()["policy"]
        assert before["loadedAt"] == "2026-01-01T00:00:00.000Z" and before["lastReload"] is None
        clock.advance(60)
        path.write_text("health: {enabled: false}\nembedding: {backend: none}\nlimits: {max_inflight: 7}\n")
        assert (await http.post("/admin/reload")).status_code == 200
        after = (await http.get("/admin/summary")).json()["policy"]
        assert after["loadedAt"] == "2026-01-01T00:01:00.000Z"
        assert after["lastReload"] == {"at": "2026-01-01T00:01:00.000Z", "ok": True, "error": None}
        assert after["digest"] != before["digest"] and after["settings"]["limits"]["max_inflight"] == 7
        clock.advance(5)
        path.write_text("limits: {max_inflight: -1}\n")
        assert (await http.post("/admin/reload")).status_code == 422
        refused = (await http.get("/admin/summary")).json()["policy"]
    assert refused["loadedAt"] == after["loadedAt"] and refused["digest"] == after["digest"]
    assert refused["lastReload"]["ok"] is False and refused["lastReload"]["at"] == "2026-01-01T00:01:05.000Z"
    assert "max_inflight" in refused["lastReload"]["error"]


@pytest.mark.parametrize("name", ["index.html", "app.js", "app.css"])
def test_the_assets_ship_as_package_data(name: str) -> None:
    """pyproject's package-data covers every file of the page (the wheel carries them)."""
    import tomllib
    from fnmatch import fnmatch

    pyproject = tomllib.loads((ASSETS.parents[3] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["reachmesh"]
    assert any(fnmatch(f"server/ui_assets/{name}", g) for g in globs)
