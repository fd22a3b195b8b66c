"""A Router list (issue #38): parsing, which Router is tried when, and the SDK's use of it.

The processes-and-etcd half (a Router killed with -9) is tests/etcd/test_router_list.py.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from reachmesh.clock import ManualClock
from reachmesh.exceptions import ConfigError, RouterUnavailable
from reachmesh.sdk.client import ReachClient, SyncReachClient, router_url_from_env
from reachmesh.sdk.config import AgentConfig
from reachmesh.sdk.lease import LeaseKeeper
from reachmesh.sdk.routers import SKIP_CAP_S, RouterList, split_router_urls
from reachmesh.testing import RouterServer, free_port

A, B, C = "http://10.0.0.1:7200", "http://10.0.0.2:7200", "https://r3.example:7443"


def test_a_list_is_comma_separated_checked_and_deduplicated() -> None:
    assert split_router_urls(f" {A}/ , {B},,{A}") == [A, B]
    assert split_router_urls(A) == [A]
    with pytest.raises(ConfigError, match="'ftp://x'"):
        split_router_urls(f"{A},ftp://x")
    # The bad entry's position is named (docs/several-routers.md), so a typo in one of several
    # like-looking URLs is found at once.
    with pytest.raises(ConfigError, match=r"entry 3 of 3 is 'http://:7200'"):
        split_router_urls(f"{A},{B},http://:7200")
    with pytest.raises(ConfigError, match="empty"):
        split_router_urls(" , ")


def test_the_config_and_the_environment_take_a_list() -> None:
    profile = {
        "id": "a",
        "network": {"endpoint": "http://127.0.0.1:7301/reach"},
        "capabilities": [{"task": "t"}],
    }
    config = AgentConfig.from_mapping({"agent": profile, "router": {"url": f"{A}, {B}/"}}, env={})
    assert config.router_url == f"{A},{B}"
    assert config.router_urls == [A, B]
    # A YAML list is the same list (before: str() of it, refused as one URL "['http://…'").
    listed = AgentConfig.from_mapping({"agent": profile, "router": {"url": [A, f"{B}/"]}}, env={})
    assert listed.router_urls == [A, B]
    env = AgentConfig.from_mapping({"agent": profile}, env={"REACH_ROUTER_URL": f"{B},{C}"})
    assert env.router_urls == [B, C]
    with pytest.raises(ConfigError, match=r"router\.url"):
        AgentConfig.from_mapping({"agent": profile, "router": {"url": f"{A},nope"}}, env={})
    assert router_url_from_env(f"{A}/,{B}") == f"{A},{B}"


def test_reach_agent_takes_a_router_list_in_code() -> None:
    """ReachAgent(router_url=...) as a list or comma-separated, over the file and the environment."""
    from reachmesh.sdk.agent import ReachAgent

    profile = {
        "id": "a",
        "network": {"endpoint": "http://127.0.0.1:7301/reach"},
        "capabilities": [{"task": "t"}],
    }
    config = AgentConfig.from_mapping({"agent": profile, "router": {"url": A}}, env={})
    assert ReachAgent(config, router_url=[B, f"{C}/"]).config.router_urls == [B, C]
    assert ReachAgent(config, router_url=f"{C},{A}").config.router_urls == [C, A]
    assert ReachAgent(config).config.router_urls == [A]
    with pytest.raises(ConfigError, match="router_url"):
        ReachAgent(config, router_url=[A, "nope"])


@pytest.mark.parametrize("client_class", [ReachClient, SyncReachClient])
def test_the_clients_take_a_router_list_in_code_as_the_agent_does(
    client_class: type[ReachClient] | type[SyncReachClient],
) -> None:
    """ReachClient([...]) as ReachAgent(router_url=[...]): before, str() of the list was read as
    one URL and refused with a message quoting "['http://10.0.0.1:7200'"."""
    assert client_class([A, f"{B}/"]).routers.urls == (A, B)
    with pytest.raises(ConfigError, match="entry 2 of 2 is 'nope'"):
        client_class([A, "nope"])
    with pytest.raises(ConfigError, match="empty"):
        client_class([])


def test_a_failed_router_is_skipped_with_growing_pauses_then_tried_again() -> None:
    clock = ManualClock()
    routers = RouterList([A, B, C], clock=clock)
    assert routers.order() == [A, B, C]
    assert routers.failed(A) == B
    assert routers.order() == [B, C, A]  # A last, not gone: it is tried when all else fails
    assert routers.answered(B) is True
    assert routers.current == B
    clock.advance(0.6)  # the first pause is at most SKIP_FIRST_S
    assert routers.order()[:2] == [B, C] and A in routers.ready()
    # Failures in a row double the pause, up to the cap.
    for _ in range(12):
        routers.failed(A)
    clock.advance(SKIP_CAP_S * 0.74)
    assert A not in routers.ready()
    clock.advance(SKIP_CAP_S * 0.27)
    assert A in routers.ready()
    routers.answered(A)
    routers.failed(A)
    clock.advance(0.6)
    assert A in routers.ready()  # an answer reset the run of failures


def test_every_router_failing_leaves_none_ready_but_all_in_order() -> None:
    routers = RouterList([A, B], clock=ManualClock())
    assert routers.failed(A) == B
    assert routers.failed(B) is None
    assert sorted(routers.order()) == [A, B]


def test_the_lease_renews_at_the_next_router_when_its_own_refuses_the_connection() -> None:
    """Renewals go to B once A refuses: the same lease, no registering again."""
    seen: list[tuple[str, str]] = []
    renewed_at_b = threading.Event()

    def router(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        seen.append((request.method, host))
        if request.method == "POST":
            return httpx.Response(201, json={"agentId": "a", "leaseId": "0x1", "ttlSeconds": 0.6})
        if host == A:
            raise httpx.ConnectError("refused", request=request)
        assert request.read() == b'{"leaseId":"0x1"}'
        renewed_at_b.set()
        return httpx.Response(200, json={"agentId": "a", "leaseId": "0x1", "ttlSeconds": 0.6})

    keeper = LeaseKeeper(f"{A},{B}", {"id": "a"}, callback="http://a/reach", tasks=["t"])
    keeper._http = httpx.Client(transport=httpx.MockTransport(router))
    try:
        assert keeper.open()
        assert renewed_at_b.wait(10)
    finally:
        keeper.stop()
    assert seen[0] == ("POST", A)
    assert ("PUT", A) in seen and ("PUT", B) in seen
    assert [m for m, _ in seen].count("POST") == 1
    assert keeper.router_url == B
    keeper.close()


def test_a_registration_goes_to_the_next_router_when_one_is_down() -> None:
    """A refuses connections: the agent registers through B at once, without backing off."""
    down = f"http://127.0.0.1:{free_port()}"

    def router(request: httpx.Request) -> httpx.Response:
        if request.url.port != 7200:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(201, json={"agentId": "a", "leaseId": "0x1", "ttlSeconds": 60})

    keeper = LeaseKeeper(f"{down},{A}", {"id": "a"}, callback="http://a/reach", tasks=["t"])
    keeper._http = httpx.Client(transport=httpx.MockTransport(router))
    try:
        assert keeper.register_until_done()
        assert keeper.router_url == A
    finally:
        keeper.stop()
        keeper.close()


def test_a_sync_client_sends_a_call_that_never_reached_a_router_to_the_next() -> None:
    hosts: list[str] = []

    def router(request: httpx.Request) -> httpx.Response:
        hosts.append(str(request.url.host))
        if request.url.host == "10.0.0.1":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"status": "SUCCESS", "traceId": "t", "protocolVersion": "1.0"})

    with SyncReachClient(f"{A},{B}") as client:
        client._http = httpx.Client(transport=httpx.MockTransport(router))
        assert client.call("t").status == "SUCCESS"
        assert client.call("t").status == "SUCCESS"
    assert hosts == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]  # B from then on, A skipped


def test_a_call_that_reached_a_router_is_not_sent_again() -> None:
    """A read timeout may have reached an agent: it is the caller's, not the next Router's."""
    hosts: list[str] = []

    def router(request: httpx.Request) -> httpx.Response:
        hosts.append(str(request.url.host))
        raise httpx.ReadTimeout("slow", request=request)

    with SyncReachClient(f"{A},{B}") as client:
        client._http = httpx.Client(transport=httpx.MockTransport(router))
        with pytest.raises(RouterUnavailable, match=r"10\.0\.0\.1"):
            client.call("t")
    assert hosts == ["10.0.0.1"]


async def test_an_async_client_with_no_router_up_names_them_all() -> None:
    down = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    async with ReachClient(",".join(down)) as client:
        with pytest.raises(RouterUnavailable, match="cannot reach any Router of"):
            await client.call("t", timeout_ms=2000)


def test_a_read_through_a_list_goes_to_the_router_that_takes_the_connection() -> None:
    """What `reach agents`/`reach trace` and the bridges use: A refuses, B answers."""
    from reachmesh.sdk.routers import request_any_sync

    def router(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.1":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=[])

    routers = RouterList([A, B], clock=ManualClock())
    with httpx.Client(transport=httpx.MockTransport(router)) as http:
        used, resp = request_any_sync(http, routers, "GET", "/admin/agents")
    assert (used, resp.status_code, routers.current) == (B, 200, B)


async def test_a_stream_that_never_reached_a_router_goes_to_the_next(router: RouterServer) -> None:
    """client.stream() follows the list as call() does (this page's promise for every caller):
    the first Router refuses the connection, the second streams. It went to the first Router
    only and raised RouterUnavailable, async and sync alike."""
    import asyncio

    from reachmesh.testing import FakeAgent

    agent = await FakeAgent("streams-too", result={"ok": 1}).start()
    try:
        await agent.register(router.url, vectors=False)
        urls = f"http://127.0.0.1:{free_port()},{router.url}"
        async with ReachClient(urls) as client, client.stream("echo", {}, timeout_ms=10_000) as story:
            chunks = [chunk async for chunk in story]
        assert story.response.status == "SUCCESS" and chunks == [{"ok": 1}]

        def sync_stream() -> tuple[str, list[object]]:
            with SyncReachClient(urls) as client, client.stream("echo", {}, timeout_ms=10_000) as story:
                chunks = list(story)
            return story.response.status, chunks

        assert await asyncio.to_thread(sync_stream) == ("SUCCESS", [{"ok": 1}])
    finally:
        await agent.stop()
