"""With auth off, a page on another site cannot drive the Router: the exact requests a browser
sends for such a page (no-cors, an untyped or text body, a foreign Origin, a rebound Host) are
refused before anything is read or registered; programs and the Router's own page still work."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.server.origin import host_name, is_loopback_name
from reachmesh.testing import RouterServer

EVIL = "http://evil.example"


def config(**server: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "server": server,
        }
    )


def profile(agent_id: str) -> bytes:
    return httpx.Request(
        "POST",
        "http://x",
        json={
            "id": agent_id,
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "query_price", "routing_weight": 100}],
        },
    ).content


async def registered(http: httpx.AsyncClient) -> list[str]:
    return [row["id"] for row in (await http.get("/admin/agents")).json()]


async def test_a_no_cors_page_cannot_register_or_call() -> None:
    """The shapes of fetch(url, {method: "POST", mode: "no-cors", body}) from a page at
    http://evil.example: an untyped body, text/plain and a form, each with that Origin; and the
    same bodies with no Origin at all. None registers an agent; /reach answers a ReachResponse."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        body = profile("evil-agent")
        for ctype in (None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"):
            for origin in (EVIL, "null", None):
                headers = {k: v for k, v in (("Content-Type", ctype), ("Origin", origin)) if v is not None}
                resp = await http.post("/agents", content=body, headers=headers)
                assert resp.status_code in (403, 415), (ctype, origin, resp.text)
                expected = "FORBIDDEN" if origin is not None else "UNSUPPORTED_MEDIA_TYPE"
                assert resp.json()["error"]["code"] == expected, (ctype, origin, resp.text)
                call = await http.post("/reach", content=b'{"targetTask":"query_price"}', headers=headers)
                answer = call.json()
                assert call.status_code in (403, 415)
                assert answer["status"] in ("FORBIDDEN", "INVALID_REQUEST") and answer["traceId"]
        assert await registered(http) == []
        # A typed body from that page (which a browser would preflight) is refused for its Origin.
        typed = {"Content-Type": "application/json", "Origin": EVIL}
        resp = await http.post("/agents", content=body, headers=typed)
        assert (resp.status_code, resp.json()["error"]["code"]) == (403, "FORBIDDEN")
        assert "server.allowed_origins" in resp.json()["error"]["message"]
        assert await registered(http) == []
        # A program (no Origin, JSON typed) and the Router's own origin are served.
        own = {"Content-Type": "application/json", "Origin": router.url}
        assert (await http.post("/agents", content=body, headers=own)).status_code == 201
        assert await registered(http) == ["evil-agent"]


async def test_a_rebound_host_is_refused_on_loopback_unless_allowed() -> None:
    """DNS rebinding: evil.example resolving to 127.0.0.1 makes the page same-origin to the
    browser, but its Host is evil.example: refused (403 naming server.allowed_hosts), for GETs
    too; localhost, 127.0.0.1 and [::1] names pass; server.allowed_hosts admits a name."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        port = router.port
        rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        resp = await http.post("/reach", json={"targetTask": "x"}, headers=rebound)
        assert (resp.status_code, resp.json()["status"]) == (403, "FORBIDDEN")
        assert "server.allowed_hosts" in resp.json()["error"]["message"]
        resp = await http.get("/admin/agents", headers={"Host": "evil.example"})
        assert resp.status_code == 403
        for name in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
            assert (await http.get("/admin/agents", headers={"Host": name})).status_code == 200, name
    async with (
        RouterServer(config(allowed_hosts=["Router.Example"])) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as http,
    ):
        assert (await http.get("/admin/agents", headers={"Host": "router.example:8080"})).status_code == 200
        assert (await http.get("/admin/agents", headers={"Host": "other.example"})).status_code == 403


async def test_allowed_origins_widen_the_origin_check() -> None:
    """server.allowed_origins admits a listed origin (case aside); others stay refused."""
    async with (
        RouterServer(config(allowed_origins=["https://Console.Example"])) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as http,
    ):
        ok = {"Origin": "https://console.example", "Content-Type": "application/json"}
        resp = await http.post("/reach", content=b'{"targetTask":"x"}', headers=ok)
        assert resp.json()["status"] == "NO_AVAILABLE_HANDLER"
        resp = await http.post("/reach", content=b'{"targetTask":"x"}', headers={**ok, "Origin": EVIL})
        assert resp.json()["status"] == "FORBIDDEN"


async def test_an_origin_listed_with_its_default_port_admits_the_page() -> None:
    """A browser sends ``https://console.example``, never ``:443``: an origin listed with its
    scheme's default port is that page's, not one no browser names; another port stays apart."""
    listed = ["https://console.example:443", "http://intranet.example:80/", "http://dev.example:8080"]
    async with (
        RouterServer(config(allowed_origins=listed)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as http,
    ):
        for origin, admitted in (
            ("https://console.example", True),
            ("http://intranet.example", True),
            ("http://dev.example:8080", True),
            ("http://dev.example", False),
            ("http://console.example", False),
        ):
            headers = {"Origin": origin, "Content-Type": "application/json"}
            resp = await http.post("/reach", content=b'{"targetTask":"x"}', headers=headers)
            expected = "NO_AVAILABLE_HANDLER" if admitted else "FORBIDDEN"
            assert resp.json()["status"] == expected, origin


async def test_an_untyped_body_is_415_and_a_bodyless_delete_is_not() -> None:
    """POST /reach without a Content-Type: 415 with a curl hint; DELETE /agents/{id} with the
    lease in a header needs no type (it has no body)."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        resp = await http.post("/reach", content=b'{"targetTask":"x"}')
        assert (resp.status_code, resp.json()["error"]["code"]) == (415, "UNSUPPORTED_MEDIA_TYPE")
        assert "-H 'Content-Type: application/json'" in resp.json()["error"]["message"]
        created = await http.post(
            "/agents", content=profile("a1"), headers={"Content-Type": "application/json"}
        )
        lease = created.json()["leaseId"]
        assert (await http.delete("/agents/a1", headers={"X-Reach-Lease": lease})).status_code == 204


async def test_a_browser_pages_untyped_call_is_told_to_type_its_fetch_not_to_use_curl() -> None:
    """A page whose origin is admitted (listed, or the Router's own) that forgets the type was
    told to add curl's -H: its author writes fetch, so the 415 says what to send from there. A
    program (no Origin) keeps the curl hint. On the lane, and on uvicorn's way (Expect)."""
    page = "http://page.example"
    async with (
        RouterServer(config(allowed_origins=[page])) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as http,
    ):
        for origin in (page, router.url, None):
            for ctype in ("text/plain", None):
                for expect in ({}, {"Expect": "100-continue"}):
                    headers = {"Origin": origin} if origin else {}
                    headers |= {"Content-Type": ctype} if ctype else {}
                    resp = await http.post("/reach", content=b'{"targetTask":"x"}', headers=headers | expect)
                    assert resp.status_code == 415, (origin, ctype, resp.text)
                    message = resp.json()["error"]["message"]
                    if origin is None:
                        assert "-H 'Content-Type: application/json'" in message, message
                    else:
                        assert "curl" not in message, message
                        assert "from fetch" in message and "'Content-Type': 'application/json'" in message


@pytest.mark.parametrize(
    ("authority", "name", "loopback"),
    [
        ("localhost:8080", "localhost", True),
        ("LOCALHOST", "localhost", True),
        ("127.0.0.2:1", "127.0.0.2", True),
        ("[::1]:8080", "::1", True),
        ("[::1]", "::1", True),
        ("a.localhost:1", "a.localhost", True),
        ("localhost.evil.example", "localhost.evil.example", False),
        ("evil.example:80", "evil.example", False),
        ("0.0.0.0", "0.0.0.0", False),
    ],
)
def test_host_names(authority: str, name: str, loopback: bool) -> None:
    assert host_name(authority) == name
    assert is_loopback_name(name) is loopback


async def test_a_host_is_judged_the_same_once_known() -> None:
    """The Host check keeps what it found for each name: a rebound Host on /reach is refused
    again (not admitted from the table), and a loopback one passes again, each time."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        rebound = {"Host": f"evil.example:{router.port}"}
        local = {"Host": f"localhost:{router.port}"}
        for _ in range(3):
            refused = await http.post("/reach", json={"targetTask": "x"}, headers=rebound)
            assert (refused.status_code, refused.json()["status"]) == (403, "FORBIDDEN")
            passed = await http.post("/reach", json={"targetTask": "x"}, headers=local)
            assert passed.status_code != 403 and passed.json()["status"] != "FORBIDDEN"
