"""An attacker's probe (round 50): can a caller gain turns at a full agent (and slots of
``limits.max_inflight_per_client``) by posing as many clients?

The client is the caller's token with auth on, and its address with auth off. No header of the
request picks it, but for ``X-Forwarded-For`` from an address in ``server.trusted_proxies``
(default the loopback pair, where a reverse proxy on the Router's host connects from). Found:
that list was uvicorn's, read from the ``FORWARDED_ALLOW_IPS`` environment variable, not the
policy: an operator who set it to ``*`` (uvicorn's recipe for a container) let every caller name
itself a new client on each call, and so stand first in as many turns as it sent calls.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.server.app import RouterApp
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import peer_from_header, scaled, until

CALLS = 12
HOG = "identity-hog-token-0123456789"
FAIR = "identity-fair-token-0123456789"
AGENT = "identity-agent-token-0123456789"

# Every header a proxy (or a caller posing as one) may say the caller's address in.
POSING = ("X-Forwarded-For", "Forwarded", "X-Real-IP", "True-Client-IP", "CF-Connecting-IP")


def _posing(n: int) -> dict[str, str]:
    """The headers of a call posing as client number ``n``, in every form a proxy may use."""
    address = f"198.51.100.{n + 1}"
    return {name: (f"for={address}" if name == "Forwarded" else address) for name in POSING}


def _config(**sections: dict[str, Any]) -> RouterConfig:
    policy: dict[str, Any] = {
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
    }
    return RouterConfig.model_validate({**policy, **sections})


def _client(router: RouterServer, address: str, token: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=router.url,
        timeout=scaled(60),
        headers={"Authorization": f"Bearer {token}"} if token else {},
        transport=httpx.AsyncHTTPTransport(local_address=address),
    )


async def _fair_place(
    router: RouterServer,
    hog: list[tuple[httpx.AsyncClient, dict[str, str]]],
    fair: tuple[httpx.AsyncClient, dict[str, str]],
    agent_token: str | None = None,
    agent_id: str = "one-at-a-time",
) -> int:
    """Where the fair call is served at a full agent (capacity 1), sent after the hog's calls
    (each a client and headers of its own) have filled the line: 0-based."""
    release = asyncio.Event()
    agent = FakeAgent(agent_id, tasks=(agent_id,), hold=release, max_concurrency=1)
    await agent.start()
    board = router.app.parts.capacity
    try:
        headers = {"Authorization": f"Bearer {agent_token}"} if agent_token else {}
        async with httpx.AsyncClient(headers=headers) as http:
            assert (await http.post(f"{router.url}/agents", json=agent.profile())).status_code == 201
        # The first call is held at the agent while the others queue one by one: its read timeout
        # (3 s by default, not scaled) must not end it first on a busy machine.
        body = {"targetTask": agent_id, "preferences": {"timeoutMs": 60_000, "readTimeoutMs": 60_000}}
        calls = []
        for n, (client, extra) in enumerate(hog):
            who = {**body, "payload": {"who": n}}
            calls.append(asyncio.create_task(client.post("/reach", json=who, headers=extra)))
            await until(lambda: board.inflight(agent.agent_id) + board.queued(agent.agent_id) == len(calls))
        client, extra = fair
        who = {**body, "payload": {"who": "fair"}}
        calls.append(asyncio.create_task(client.post("/reach", json=who, headers=extra)))
        await until(lambda: board.queued(agent.agent_id) == len(hog))
        release.set()
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200] * len(calls)
        return [r["payload"]["who"] for r in agent.received].index("fair")
    finally:
        release.set()
        await agent.stop()


async def test_with_auth_off_no_header_of_an_untrusted_caller_makes_it_another_client() -> None:
    async with RouterServer(_config()) as router:
        hog, fair = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        try:
            place = await _fair_place(router, [(hog, _posing(n)) for n in range(CALLS)], (fair, {}))
        finally:
            await hog.aclose()
            await fair.aclose()
    assert place <= 2, place


async def test_forwarded_allow_ips_in_the_environment_trusts_no_caller(monkeypatch) -> None:
    """Before, uvicorn read FORWARDED_ALLOW_IPS=* and took every caller's X-Forwarded-For: the
    hog's twelve calls were twelve clients, each with a turn before the fair call (served 12th)."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    async with RouterServer(_config()) as router:
        hog, fair = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        try:
            place = await _fair_place(router, [(hog, _posing(n)) for n in range(CALLS)], (fair, {}))
        finally:
            await hog.aclose()
            await fair.aclose()
    assert place <= 2, place


async def test_a_listed_proxy_passes_on_its_callers_and_no_one_else_is_trusted() -> None:
    """server.trusted_proxies names the proxy at 127.0.0.2: the twelve calls it forwards for one
    address are that one client, and the fair call it forwards for another is served in its turn.
    The loopback default is gone with the list: 127.0.0.1 posing as twelve is one client."""
    async with RouterServer(_config(server={"trusted_proxies": ["127.0.0.2"]})) as router:
        proxy, direct = _client(router, "127.0.0.2"), _client(router, "127.0.0.1")
        try:
            hog = [(proxy, {"X-Forwarded-For": "203.0.113.5"}) for _ in range(CALLS)]
            assert await _fair_place(router, hog, (proxy, {"X-Forwarded-For": "203.0.113.9"})) <= 2
            posing = [(direct, _posing(n)) for n in range(CALLS)]
            fair = (proxy, {"X-Forwarded-For": "203.0.113.9"})
            place = await _fair_place(router, posing, fair, agent_id="second")
        finally:
            await proxy.aclose()
            await direct.aclose()
    assert place <= 2, place


async def test_a_proxy_network_written_with_its_host_bits_is_trusted_as_the_policy_accepts_it() -> None:
    """Found by round 50's second probe: the policy took ``127.0.0.9/24`` (an address of the
    proxy and its network's length, as ``ip addr`` shows it) but handed uvicorn the text, which
    it read as no network at all and trusted nobody: every caller behind the proxy was the
    proxy, one client, and the fair call was served behind the hog's twelve. The network is
    handed on as the policy read it, ``127.0.0.0/24``."""
    async with RouterServer(_config(server={"trusted_proxies": ["127.0.0.9/24"]})) as router:
        proxy = _client(router, "127.0.0.2")
        try:
            hog = [(proxy, {"X-Forwarded-For": "203.0.113.5"}) for _ in range(CALLS)]
            place = await _fair_place(router, hog, (proxy, {"X-Forwarded-For": "203.0.113.9"}))
        finally:
            await proxy.aclose()
    assert place <= 2, place


async def test_no_trusted_proxy_takes_the_header_from_no_one() -> None:
    """``trusted_proxies: []``: a caller on the Router's own host posing as twelve is one client."""
    async with RouterServer(_config(server={"trusted_proxies": []})) as router:
        hog, fair = _client(router, "127.0.0.1"), _client(router, "127.0.0.3")
        try:
            place = await _fair_place(router, [(hog, _posing(n)) for n in range(CALLS)], (fair, {}))
        finally:
            await hog.aclose()
            await fair.aclose()
    assert place <= 2, place


async def test_with_auth_on_the_token_is_the_client_whatever_the_address_or_headers() -> None:
    """One token from two addresses, even the trusted loopback one, each call posing as another
    address: one client. The fair token's call is served in its turn."""
    tokens = [
        {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest()}
        for token, role in ((HOG, "caller"), (FAIR, "caller"), (AGENT, "agent"))
    ]
    async with RouterServer(_config(auth={"tokens": tokens})) as router:
        hogs = [_client(router, "127.0.0.1", HOG), _client(router, "127.0.0.2", HOG)]
        fair = _client(router, "127.0.0.3", FAIR)
        try:
            hog = [(hogs[n % 2], _posing(n)) for n in range(CALLS)]
            place = await _fair_place(router, hog, (fair, {}), agent_token=AGENT)
        finally:
            for client in (*hogs, fair):
                await client.aclose()
    assert place <= 2, place


@pytest.mark.parametrize("entry", ["*", "0.0.0.0/0", "::/0", "example.com", "10.0.0.300", "unix:/x.sock"])
def test_a_trusted_proxy_is_an_address_or_a_network(entry: str) -> None:
    with pytest.raises((ConfigError, ValueError)):
        _config(server={"trusted_proxies": [entry]})


async def test_an_ipv6_caller_is_one_client_for_its_whole_64() -> None:
    """Found by the probe: with auth off each IPv6 address was a client, and a caller holds a whole
    /64 (SLAAC and privacy addresses): twelve calls from twelve addresses of one /64 were twelve
    clients, each with a turn before another caller's call. The /64 is the client now."""
    async with RouterServer(_config(), middleware=peer_from_header) as router:
        hog, fair = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        try:
            calls = [(hog, {"X-Test-Peer": f"2001:db8:1:2::{n + 1:x}"}) for n in range(CALLS)]
            place = await _fair_place(router, calls, (fair, {"X-Test-Peer": "2001:db8:1:3::1"}))
        finally:
            await hog.aclose()
            await fair.aclose()
    assert place <= 2, place


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("2001:db8:1:2::1", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", True),
        ("2001:db8:1:2::1", "2001:db8:1:3::1", False),
        ("::ffff:192.0.2.1", "::ffff:192.0.2.2", False),  # IPv4 on a dual-stack socket: per address
        ("::ffff:192.0.2.1", "192.0.2.1", True),
        ("::1", "::1", True),
        ("192.0.2.1", "192.0.2.2", False),
    ],
)
def test_which_peer_addresses_are_one_client(one: str, other: str, same: bool) -> None:
    app = RouterApp(_config())

    def key(address: str) -> str:
        return app.client_key({"type": "http", "client": (address, 1)})

    assert (key(one) == key(other)) is same, (key(one), key(other))


def test_a_long_name_a_header_gives_the_client_is_not_kept_after_its_call() -> None:
    """Found by round 50's second probe: the /64 of an IPv6 peer is cached (4096 names), and a
    name with a colon went in whole whatever its length. X-Forwarded-For from a trusted proxy
    (by default any process on the Router's host) names the peer, up to the 64 KiB of a request's
    head: 4096 such names pinned 256 MiB of the Router's memory for good. A name longer than any
    address is not an address, and is the client as it is, not cached."""
    app = RouterApp(_config())
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        names = [f"{n}:" + "x" * 60_000 for n in range(100)]  # 6 MB of names, each its own client
        assert [app.client_key({"type": "http", "client": (name, 0)}) for name in names] == names
        del names
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 512 * 1024, f"{kept} bytes kept"
    assert app.client_key({"type": "http", "client": ("fe80::1%enp0s31f6abcdefg", 0)}) == "fe80::/64"


async def test_a_reload_that_changes_the_trusted_proxies_says_it_needs_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by round 50's second probe: uvicorn takes the proxies at start, and a reload that
    emptied the list (to stop local processes naming themselves clients) answered 200 and
    changed nothing, without a word. It says so now, as for the TLS files and etcd's settings."""
    caplog.set_level(logging.WARNING)
    path = tmp_path / "router.yaml"
    policy: dict[str, Any] = {"health": {"enabled": False}, "embedding": {"backend": "none"}}
    path.write_text(yaml.safe_dump(policy))
    async with RouterServer(RouterConfig.load(path), config_path=path) as router:
        policy["server"] = {"trusted_proxies": []}
        path.write_text(yaml.safe_dump(policy))
        async with httpx.AsyncClient(base_url=router.url) as http:
            assert (await http.post("/admin/reload")).status_code == 200
    said = [r.getMessage() for r in caplog.records]
    assert any("server.trusted_proxies changed" in m and "restart" in m for m in said), said


async def test_a_long_name_on_the_reach_path_is_not_cached_either() -> None:
    """The /reach path works the client key out in line (it runs on every call): round 50's merge
    left it without the length guard, so a long peer name with a colon still went into the /64
    cache there. One guard now serves both."""
    from reachmesh.server.app import _ipv6_network

    async with RouterServer(_config(), middleware=peer_from_header) as router:
        caller = _client(router, "127.0.0.2")
        try:
            cached = _ipv6_network.cache_info().currsize
            names = [f"{n}:" + "x" * 2_000 for n in range(5)]
            for name in names:
                answer = await caller.post("/reach", json={"targetTask": "t"}, headers={"X-Test-Peer": name})
                assert answer.status_code in (200, 404, 503), answer.text
            assert _ipv6_network.cache_info().currsize == cached
        finally:
            await caller.aclose()
