"""The outbound-URL guard: endpoints and replyTo URLs the Router must not call are refused."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from reachmesh.config import OutboundPolicy, RouterConfig
from reachmesh.exceptions import OutboundRefused
from reachmesh.protocol import AgentProfile
from reachmesh.testing import FakeAgent, RouterServer, free_port
from reachmesh.transport.urlguard import UrlGuard
from tests.helpers import until

FORBIDDEN = [
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:169.254.169.254]/",
    "http://[fd00:ec2::254]/",
    "http://2852039166/",
    "http://0251.0376.0251.0376/",
    "http://0xa9fea9fe/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://0.0.0.0:8080/reach",
    "http://[::]/reach",
    "http://224.0.0.1/reach",
    "http://[fe80::1]/reach",
    "gopher://127.0.0.1:70/",
    "file:///etc/passwd",
    "http://user:secret@127.0.0.1/reach",
    "http://127.0.0.1/re\nach",
    # IPv6 spellings that carry 169.254.169.254: IPv4-compatible, NAT64, local NAT64, 6to4, Teredo.
    "http://[::169.254.169.254]/",
    "http://[::a9fe:a9fe]/",
    "http://[64:ff9b::169.254.169.254]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[64:ff9b:1::a9fe:a9fe]/",
    "http://[64:ff9b:1:a9fe:a9:fe00::]/",
    "http://[2002:a9fe:a9fe::1]/",
    "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
    "http://[64:ff9b::100.100.100.200]/",
    "http://[64:ff9b::224.0.0.1]/",
]


@pytest.mark.parametrize("url", FORBIDDEN)
def test_the_guard_refuses_every_form(url: str) -> None:
    """Metadata, link-local, unspecified, multicast, non-HTTP, credentials, control characters."""
    with pytest.raises(OutboundRefused):
        UrlGuard().check_url(url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:7301/reach", "http://10.1.2.3/reach", "http://price-agent:8081/reach"]
)
def test_loopback_private_and_names_are_allowed_by_default(url: str) -> None:
    """The demo and a compose network need loopback, private ranges and service names."""
    UrlGuard().check_url(url)


def test_embedded_ipv4_refusals_name_the_form_and_the_address() -> None:
    """The refusal says which IPv4 address the IPv6 spelling carries and why that one is refused."""
    with pytest.raises(OutboundRefused, match=r"6to4 form of 169\.254\.169\.254 is link-local"):
        UrlGuard().check_url("http://[2002:a9fe:a9fe::1]/")
    with pytest.raises(OutboundRefused, match=r"NAT64 form of 127\.0\.0\.1 is loopback"):
        UrlGuard(OutboundPolicy(allow_loopback=False)).check_url("http://[64:ff9b::7f00:1]/")


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::8.8.8.8]/r",
        "http://[2002:808:808::1]/r",
        "http://[::1]:7301/r",
        "http://[2001:db8::1]/r",
    ],
)
def test_ipv6_forms_of_allowed_addresses_stay_allowed(url: str) -> None:
    """Only the forms that carry a refused address are refused; ::1 is loopback, not 0.0.0.1."""
    UrlGuard().check_url(url)


def test_the_policy_can_allow_only_listed_networks_and_names() -> None:
    """outbound.allow: only those networks and names; everything else is refused, naming the rule."""
    guard = UrlGuard(OutboundPolicy(allow=["10.0.0.0/8", "*.agents.internal"]))
    guard.check_url("http://10.9.9.9/reach")
    guard.check_url("http://price.agents.internal/reach")
    for url in ("http://192.168.1.1/reach", "http://example.com/reach"):
        with pytest.raises(OutboundRefused, match=r"outbound\.allow"):
            guard.check_url(url)


@pytest.mark.parametrize("url", FORBIDDEN[:11] + FORBIDDEN[-10:])
async def test_registration_of_a_forbidden_endpoint_is_422(http, url: str) -> None:
    """Each forbidden form is refused at registration with INVALID_PROFILE naming network.endpoint."""
    profile = {"id": "evil", "network": {"endpoint": url}, "capabilities": [{"task": "steal"}]}
    resp = await http.post("/agents", json=profile)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "INVALID_PROFILE"
    assert error["details"][0]["field"] in ("network.endpoint", "network")


async def test_a_name_that_resolves_to_a_refused_address_is_refused(http) -> None:
    """localhost resolves to loopback: with loopback forbidden, its registration is refused."""
    config = RouterConfig.model_validate({"outbound": {"allow_loopback": False}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as client:
        profile = {
            "id": "sneaky",
            "network": {"endpoint": f"http://localhost:{free_port()}/reach"},
            "capabilities": [{"task": "t"}],
        }
        resp = await client.post("/agents", json=profile)
        assert resp.status_code == 422
        assert "loopback" in resp.json()["error"]["message"]


@pytest.mark.parametrize("url", FORBIDDEN)
async def test_a_forbidden_reply_to_is_400_and_nothing_is_sent(http, make_agent, url: str) -> None:
    """An async request whose replyTo is forbidden is refused at once; no work is started."""
    agent = await make_agent("a")
    body = {"targetTask": "echo", "preferences": {"mode": "async", "replyTo": url}}
    resp = await http.post("/reach", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["details"][0]["field"] == "preferences.replyTo"
    assert agent.received == []


async def test_a_listener_where_a_forbidden_target_would_be_sees_no_traffic() -> None:
    """With loopback forbidden, a replyTo on loopback and an agent on loopback get no request;
    the control: once loopback is allowed, the same listener does get the Router's call."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"status": "SUCCESS", "result": {}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        config = RouterConfig.model_validate(
            {"outbound": {"allow_loopback": False}, "health": {"enabled": False}}
        )
        async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as client:
            victim = f"http://127.0.0.1:{port}/internal/admin"
            body = {"targetTask": "x", "preferences": {"mode": "async", "replyTo": victim}}
            assert (await client.post("/reach", json=body)).status_code == 400
            profile = {"id": "v", "network": {"endpoint": victim}, "capabilities": [{"task": "x"}]}
            assert (await client.post("/agents", json=profile)).status_code == 422
            router.app.parts.url_guard.policy = OutboundPolicy(allow_loopback=True)
            control = f"http://127.0.0.1:{port}/control/reach"
            profile = {"id": "c", "network": {"endpoint": control}, "capabilities": [{"task": "c"}]}
            assert (await client.post("/agents", json=profile)).status_code == 201
            assert (await client.post("/reach", json={"targetTask": "c"})).json()["status"] == "SUCCESS"
            await until(lambda: "/control/reach" in seen, "the control call to reach the listener")
    finally:
        await runner.cleanup()
    # The listener works and heard the Router's later call, and nothing before it.
    assert seen == ["/control/reach"]


async def test_connect_time_check_catches_a_name_registered_before_it_turned_bad() -> None:
    """A name accepted while loopback was allowed is not connected to once the policy forbids it."""
    async with RouterServer(RouterConfig.model_validate({"health": {"enabled": False}})) as router:
        agent = await FakeAgent("a").start()
        try:
            profile = agent.profile()
            profile["network"]["endpoint"] = f"http://localhost:{agent.port}/reach"
            async with httpx.AsyncClient(base_url=router.url) as client:
                assert (await client.post("/agents", json=profile)).status_code == 201
                assert (await client.post("/reach", json={"targetTask": "echo"})).status_code == 200
                router.app.parts.url_guard.policy = OutboundPolicy(allow_loopback=False)
                before = len(agent.received)
                # A fresh connection must resolve the name again (the pool's is closed first).
                await router.app.parts.transport.close()
                await router.app.parts.transport.open()
                answer = (await client.post("/reach", json={"targetTask": "echo"})).json()
            assert answer["status"] != "SUCCESS"
            assert len(agent.received) == before
        finally:
            await agent.stop()


async def test_an_endpoint_aiohttp_cannot_parse_fails_over_not_500(http, make_agent) -> None:
    """An endpoint the URL parser took but aiohttp refuses is a connect error; the call fails over."""
    good = await make_agent("good")
    bad = {"id": "bad", "network": {"endpoint": "http://[::1]]:9/reach"}, "capabilities": [{"task": "echo"}]}
    assert (await http.post("/agents", json=bad)).status_code == 201
    for _ in range(4):
        resp = await http.post("/reach", json={"targetTask": "echo"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["handlerAgentId"] == "good"
    assert good.received
    rows = {r["id"]: r for r in (await http.get("/admin/agents")).json()}
    assert rows["bad"]["stats"]["inflight"] == 0


@pytest.mark.parametrize("host", ["a..b", "é" + "a" * 70])
async def test_an_invalid_host_name_is_422_not_500(http, host: str) -> None:
    """A host name no resolver takes (an empty or over-long label) is INVALID_PROFILE."""
    profile = {
        "id": "odd",
        "network": {"endpoint": f"http://{host}:9/reach"},
        "capabilities": [{"task": "t"}],
    }
    resp = await http.post("/agents", json=profile)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "INVALID_PROFILE"


def test_full_width_metadata_names_are_refused() -> None:
    """A metadata host name spelled in full-width letters is the same name."""
    with pytest.raises(OutboundRefused):
        UrlGuard().check_url("http://\uff4detadata.google.internal/")


async def test_no_redirect_echoes_the_host_header(http) -> None:
    """A trailing slash is a 404, not a redirect to whatever Host the client sent."""
    # A loopback name (any other is refused on loopback before routing): the redirect would echo it.
    resp = await http.get("/metrics/", headers={"Host": "evil.localhost"}, follow_redirects=False)
    assert resp.status_code == 404
    assert "location" not in resp.headers


async def test_connect_time_check_catches_a_literal_address_that_bypassed_the_api() -> None:
    """A literal loopback endpoint put straight into the registry (as from a shared store) is not called."""
    config = RouterConfig.model_validate(
        {"health": {"enabled": False}, "outbound": {"allow_loopback": False}}
    )
    async with RouterServer(config) as router:
        agent = await FakeAgent("sneaky").start()
        try:
            # Past the API's check: written into the registry directly, as etcd's watch would.
            await router.app.parts.registry.register(AgentProfile.model_validate(agent.profile()))
            async with httpx.AsyncClient(base_url=router.url) as client:
                answer = (await client.post("/reach", json={"targetTask": "echo"})).json()
            assert answer["status"] != "SUCCESS"
            assert agent.received == []
        finally:
            await agent.stop()


async def test_health_probes_skip_a_refused_literal_address() -> None:
    """The probe client checks literal addresses too: a refused one is never probed."""
    config = RouterConfig.model_validate({"outbound": {"allow_loopback": False}})
    async with RouterServer(config) as router:
        agent = await FakeAgent("probed").start()
        try:
            transport = router.app.parts.transport
            assert await transport.probe(f"http://127.0.0.1:{agent.port}/healthz", 2.0) is False
            assert agent.health_probes == 0
        finally:
            await agent.stop()
