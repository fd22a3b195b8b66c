"""CORS for the origins server.allowed_origins admits, on a real Router on loopback: the
preflight a browser sends before a page's JSON call, and the headers on every answer to such a
page (success, errors, 429, streams, the lane and uvicorn's way), and nothing for anyone else."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from reachmesh.config import RouterConfig
from reachmesh.server.cors import ALLOW_HEADERS, EXPOSE_HEADERS, MAX_AGE_SECONDS
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import raw_post, scaled, until
from tests.streaming_agents import Conn, StreamAgent

PAGE = "http://page.example:8080"
EVIL = "http://evil.example"
CALLER = "cal-cors-1"
CORS_NAMES = ("access-control-allow-origin", "access-control-expose-headers", "vary")


def config(allowed: list[str], **extra: Any) -> RouterConfig:
    policy: dict[str, Any] = {
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
        "server": {"allowed_origins": allowed},
        **extra,
    }
    return RouterConfig.model_validate(policy)


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    async with RouterServer(config([PAGE.upper()])) as router:
        agent = await FakeAgent("echo-agent", result={"price": 12}).start()
        await agent.register(router.url, vectors=False)
        yield router
        await agent.stop()


def preflight(origin: str, method: str = "POST", **headers: str) -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": method, **headers}


def assert_cors(resp: httpx.Response, origin: str = PAGE) -> None:
    assert resp.headers.get("access-control-allow-origin") == origin, resp.headers
    assert resp.headers["vary"].lower() == "origin"
    assert resp.headers["access-control-expose-headers"] == EXPOSE_HEADERS.decode()


def assert_no_cors(resp: httpx.Response) -> None:
    assert not [name for name in resp.headers if name.startswith("access-control-")], resp.headers
    assert "vary" not in resp.headers


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/reach", "POST"),
        ("/reach/trace-1", "GET"),
        ("/agents", "POST"),
        ("/agents/a1/lease", "PUT"),
        ("/agents/a1", "DELETE"),
        ("/admin/agents", "GET"),
        ("/admin/learned", "DELETE, GET, POST"),
        ("/admin/reload", "POST"),
        ("/admin/summary", "GET"),
    ],
)
async def test_a_preflight_from_a_listed_origin_is_answered(
    router: RouterServer, path: str, methods: str
) -> None:
    """204, the origin echoed (case as the browser sent it), the methods of that path, the
    request headers a page may send, and how long to keep it."""
    async with httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http:
        ask = preflight(PAGE, "POST", **{"Access-Control-Request-Headers": "content-type,x-reach-trace-id"})
        resp = await http.options(path, headers=ask)
    assert resp.status_code == 204, resp.text
    assert resp.content == b""
    assert resp.headers["access-control-allow-origin"] == PAGE
    assert resp.headers["vary"].lower() == "origin"
    assert resp.headers["access-control-allow-methods"] == methods
    allowed = resp.headers["access-control-allow-headers"]
    assert allowed == ALLOW_HEADERS.decode()
    for name in ("content-type", "authorization", "traceparent", "x-reach-trace-id", "x-reach-lease"):
        assert name in allowed.split(", ")
    assert resp.headers["access-control-max-age"] == str(MAX_AGE_SECONDS)


async def test_a_preflight_from_another_origin_is_refused_and_a_plain_options_is_405(
    router: RouterServer,
) -> None:
    async with httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http:
        refused = await http.options("/reach", headers=preflight(EVIL))
        assert (refused.status_code, refused.json()["status"]) == (403, "FORBIDDEN")
        assert "server.allowed_origins" in refused.json()["error"]["message"]
        assert_no_cors(refused)
        refused = await http.options("/admin/agents", headers=preflight(EVIL, "GET"))
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "FORBIDDEN")
        assert_no_cors(refused)
        # An OPTIONS that is no preflight: 405 with Allow, as before.
        plain = await http.options("/reach", headers={"Origin": PAGE})
        assert (plain.status_code, plain.headers["allow"]) == (405, "POST")
        assert (await http.options("/reach")).status_code == 405
        # A preflight from the Router's own page (a browser sends none): no CORS, as before.
        own = await http.options("/reach", headers=preflight(router.url))
        assert own.status_code == 405
        assert_no_cors(own)


async def test_answers_to_a_listed_origin_carry_cors_and_others_do_not(router: RouterServer) -> None:
    """Success and errors on /reach (the lane and uvicorn's way), a registry endpoint and a poll;
    the same requests without an Origin, or from the Router's own origin, have no CORS headers."""
    call = orjson.dumps({"targetTask": "echo", "payload": {}})
    async with httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http:
        for origin in (PAGE, None, router.url):
            headers = {"Content-Type": "application/json"} | ({"Origin": origin} if origin else {})
            check = assert_cors if origin == PAGE else assert_no_cors
            ok = await http.post("/reach", content=call, headers=headers)
            assert (ok.status_code, ok.json()["result"]) == (200, {"price": 12})
            check(ok)
            # uvicorn's way: the lane takes no request with an Expect header.
            ok = await http.post("/reach", content=call, headers={**headers, "Expect": "100-continue"})
            assert (ok.status_code, ok.json()["status"]) == (200, "SUCCESS")
            check(ok)
            nobody = await http.post("/reach", json={"targetTask": "nobody"}, headers=headers)
            assert nobody.status_code == 503
            check(nobody)
            untyped = await http.post(
                "/reach", content=call, headers={**headers, "Content-Type": "text/plain"}
            )
            assert untyped.status_code == 415
            check(untyped)
            bad = await http.post("/agents", json={"id": "x"}, headers=headers)
            assert bad.status_code == 422
            check(bad)
            poll = await http.get("/reach/no-such-trace", headers=headers)
            assert poll.status_code == 404
            check(poll)
        # A refused origin: 403 as before, and nothing a browser would hand the page.
        evil = await http.post(
            "/reach", content=call, headers={"Origin": EVIL, "Content-Type": "application/json"}
        )
        assert evil.status_code == 403
        assert_no_cors(evil)


async def test_every_origin_listed_with_a_star_is_echoed() -> None:
    async with (
        RouterServer(config(["*"])) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http,
    ):
        resp = await http.options("/reach", headers=preflight(EVIL))
        assert (resp.status_code, resp.headers["access-control-allow-origin"]) == (204, EVIL)
        resp = await http.post("/reach", json={"targetTask": "x"}, headers={"Origin": EVIL})
        assert resp.status_code == 503
        assert_cors(resp, EVIL)


async def test_a_star_admits_no_null_origin() -> None:
    """``Origin: null`` (a sandboxed frame, a file:// page, a data: URL: no site an operator can
    name) is refused even under ``"*"``, as protocol §16 says; a star echoing ``null`` would hand
    every opaque page the answers."""
    async with (
        RouterServer(config(["*"])) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http,
    ):
        resp = await http.options("/reach", headers=preflight("null"))
        assert (resp.status_code, resp.json()["status"]) == (403, "FORBIDDEN")
        assert_no_cors(resp)
        resp = await http.post("/reach", json={"targetTask": "x"}, headers={"Origin": "null"})
        assert (resp.status_code, resp.json()["status"]) == (403, "FORBIDDEN")
        assert "opaque origin" in resp.json()["error"]["message"]
        assert_no_cors(resp)
        resp = await http.get("/admin/agents", headers={"Origin": "null"})
        assert (resp.status_code, resp.json()["error"]["code"]) == (403, "FORBIDDEN")
        assert_no_cors(resp)


async def test_the_lane_answer_carries_cors_on_the_wire() -> None:
    """A whole POST /reach in one write (the lane): the head of the answer names the origin;
    the same bytes without an Origin get no such line."""
    async with RouterServer(config([PAGE])) as router:
        for origin, expected in ((PAGE, True), (None, False)):
            extra = {"Origin": origin} if origin else {}
            request = raw_post("/reach", b'{"targetTask":"nobody"}', extra)
            answer = await asyncio.to_thread(_exchange, router.port, request)
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert head.startswith(b"http/1.1 503")
            assert (b"\r\naccess-control-allow-origin: " + PAGE.encode() + b"\r\n" in head) is expected
            assert (b"\r\nvary: origin\r\n" in head) is expected


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(10)) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


async def test_a_shed_call_carries_cors_and_exposes_retry_after() -> None:
    """429 OVERLOADED (the client's in-flight limit) to a listed page: its Retry-After is one the
    page may read."""
    release = asyncio.Event()
    policy = config([PAGE], limits={"loop_lag_ms": 10_000, "max_inflight_per_client": 1})
    async with RouterServer(policy) as router:
        agent = await FakeAgent("slow-agent", tasks=("slow",), hold=release).start()
        try:
            await agent.register(router.url, vectors=False)
            async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
                held = asyncio.create_task(http.post("/reach", json={"targetTask": "slow"}))
                shedder = router.app.parts.shedder
                await until(lambda: shedder.inflight == 1, "the held call takes the client's one slot")
                for body in ({"targetTask": "slow"}, None):  # the lane, then uvicorn's way (a stream)
                    headers = {"Origin": PAGE}
                    if body is None:
                        body, headers = {"targetTask": "slow"}, {**headers, "Accept": "text/event-stream"}
                    shed = await http.post("/reach", json=body, headers=headers)
                    assert (shed.status_code, shed.json()["status"]) == (429, "OVERLOADED")
                    assert shed.headers["retry-after"] == "1"
                    assert_cors(shed)
                    assert "retry-after" in shed.headers["access-control-expose-headers"]
                release.set()
                assert (await held).status_code == 200
        finally:
            await agent.stop()


async def test_a_streamed_answer_carries_cors() -> None:
    """An event stream (uvicorn's way, its head written when the first chunk comes) to a listed
    page names the origin; without an Origin it does not."""

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk({"text": "hi"})
        await conn.done({"status": "SUCCESS", "result": {"n": 1}})

    async with RouterServer(config([PAGE])) as router:
        agent = await StreamAgent("talker", script).start()
        try:
            await agent.register(router.url)
            body = {"targetTask": "talk", "payload": {}}
            async with httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http:
                for origin in (PAGE, None):
                    headers = {"Accept": "text/event-stream"} | ({"Origin": origin} if origin else {})
                    resp = await http.post("/reach", json=body, headers=headers)
                    assert resp.status_code == 200
                    assert resp.headers["content-type"].startswith("text/event-stream")
                    assert b"event: chunk" in resp.content and b"event: done" in resp.content
                    (assert_cors if origin else assert_no_cors)(resp)
        finally:
            await agent.stop()


async def test_with_auth_the_preflight_needs_no_token_and_a_401_carries_cors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A browser sends a preflight without the page's Authorization: it is answered all the same;
    the call without a token is 401 with CORS (the page can read why), with one it is served."""
    token_hash = hashlib.sha256(CALLER.encode()).hexdigest()
    policy = config([PAGE], auth={"tokens": [{"role": "caller", "sha256": token_hash}]})
    async with (
        RouterServer(policy) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http,
    ):
        ask = preflight(PAGE, **{"Access-Control-Request-Headers": "authorization,content-type"})
        resp = await http.options("/reach", headers=ask)
        assert resp.status_code == 204
        assert "authorization" in resp.headers["access-control-allow-headers"]
        for path in ("/reach", "/admin/agents"):
            resp = await http.options(path, headers=preflight(PAGE, "GET"))
            assert resp.status_code == 204, path
        anonymous = await http.post("/reach", json={"targetTask": "x"}, headers={"Origin": PAGE})
        assert anonymous.status_code == 401
        assert_cors(anonymous)
        assert "www-authenticate" in anonymous.headers["access-control-expose-headers"]
        listing = await http.get("/admin/agents", headers={"Origin": PAGE})
        assert listing.status_code == 401
        assert_cors(listing)
        token = {"Origin": PAGE, "Authorization": f"Bearer {CALLER}"}
        served = await http.post("/reach", json={"targetTask": "x"}, headers=token)
        assert (served.status_code, served.json()["status"]) == (503, "NO_AVAILABLE_HANDLER")
        assert_cors(served)


def test_a_reload_that_opens_the_router_to_every_page_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reach router` warns at start when allowed_origins is "*" with auth off; the same policy
    reached by a reload said nothing. A reload into that state warns now, once per change into
    it: not again while it lasts, again after it was left, and not with a token configured."""
    from reachmesh.server.components import RouterParts
    from reachmesh.testing import FakeTransport, ManualClock

    for name in ("REACH_ADMIN_TOKEN", "REACH_AGENT_TOKEN", "REACH_CALLER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.WARNING, logger="reachmesh")
    path = tmp_path / "router.yaml"
    base: dict[str, Any] = {"embedding": {"backend": "none"}, "health": {"enabled": False}}
    path.write_text(yaml.safe_dump(base))
    clock = ManualClock()
    parts = RouterParts.build(
        RouterConfig.load(path), transport=FakeTransport(clock), clock=clock, config_path=path
    )
    token = {"role": "admin", "sha256": hashlib.sha256(b"t").hexdigest()}
    warned = []
    for origins, tokens in ((["*"], []), (["*"], []), ([PAGE], []), (["*"], []), (["*"], [token])):
        caplog.clear()
        path.write_text(
            yaml.safe_dump({**base, "server": {"allowed_origins": origins}, "auth": {"tokens": tokens}})
        )
        assert parts.policy_file.reload(), parts.policy_file.last_error
        warned.append(
            any('admits every origin ("*") with auth off' in r.getMessage() for r in caplog.records)
        )
    assert warned == [True, False, False, True, False], warned
