"""TLS: the Router serves HTTPS, and calls HTTPS agents with verification (a test CA made here)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from reachmesh import AgentConfig, ReachAgent, ReachClient, SyncReachClient
from reachmesh.config import OutboundPolicy, RouterConfig, ServerPolicy
from reachmesh.exceptions import ConfigError, ConnectFailed, RouterUnavailable
from reachmesh.sdk.tls import router_verify
from reachmesh.server.serve import tls_settings
from reachmesh.testing import FakeAgent, RouterServer, free_port
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.http import HttpTransport

LIMITS = AttemptLimits(connect_s=2, read_s=5, total_s=10)
REQUEST = {"targetTask": "echo", "payload": {"x": 1}}


@dataclass(frozen=True)
class Pki:
    """A test CA and PEM files for a server certificate (127.0.0.1, localhost) and a client one."""

    ca: trustme.CA
    server: trustme.LeafCert
    ca_file: str
    cert_file: str
    key_file: str
    client_cert_file: str
    client_key_file: str

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts only the test CA."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server context with the 127.0.0.1 certificate; optionally demanding a client certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server.configure_cert(context)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            self.ca.configure_trust(context)
        return context


def _write(path: Path, leaf: trustme.LeafCert) -> tuple[str, str]:
    cert, key = path.with_suffix(".crt"), path.with_suffix(".key")
    cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One CA for the module: making keys is the slow part, and no test changes them."""
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert_file, key_file = _write(folder / "server", server)
    client_cert, client_key = _write(folder / "client", ca.issue_cert("reach-router.test"))
    return Pki(ca, server, str(ca_file), cert_file, key_file, client_cert, client_key)


def policy(**sections: dict[str, Any]) -> RouterConfig:
    # Health probes are off unless a test wants them: each test says what it calls.
    return RouterConfig.model_validate({"health": {"enabled": False}, **sections})


async def reach_through(config: RouterConfig, agent: FakeAgent) -> httpx.Response:
    """Start ``agent``, register it with a plain-HTTP Router under ``config``, and call it once."""
    await agent.start()
    try:
        async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as client:
            await agent.register(router.url, vectors=False)
            return await client.post("/reach", json=REQUEST, timeout=15)
    finally:
        await agent.stop()


async def test_the_router_serves_https_and_calls_an_https_agent(pki: Pki) -> None:
    """Acceptance: an HTTPS Router (test CA) answers /healthz and routes POST /reach to an HTTPS agent."""
    config = policy(
        server={"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file},
        outbound={"ca_file": pki.ca_file},
    )
    agent = await FakeAgent("secure", ssl_context=pki.server_context()).start()
    try:
        async with (
            RouterServer(config) as router,
            httpx.AsyncClient(base_url=router.url, verify=pki.client_context(), timeout=15) as client,
        ):
            assert router.url.startswith("https://")
            assert (await client.get("/healthz")).status_code == 200
            await agent.register(router.url, vectors=False, router_tls=pki.client_context())
            resp = await client.post("/reach", json=REQUEST)
    finally:
        await agent.stop()
    body = resp.json()
    assert resp.status_code == 200, body
    assert body["status"] == "SUCCESS"
    assert body["result"] == {"agent": "secure", "echo": {"x": 1}}


async def test_plain_http_to_the_https_router_gets_no_answer(pki: Pki) -> None:
    """An HTTPS Router does not also answer cleartext HTTP on the same port."""
    config = policy(server={"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file})
    async with RouterServer(config) as router:
        plain = router.url.replace("https://", "http://")
        async with httpx.AsyncClient(timeout=5) as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(f"{plain}/healthz")


async def test_request_head_limits_hold_over_https(pki: Pki) -> None:
    """GuardedHttpTools still bounds the request head behind TLS: an oversized header is 431."""
    config = policy(
        server={"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file, "max_header_bytes": 4096}
    )
    async with (
        RouterServer(config) as router,
        httpx.AsyncClient(base_url=router.url, verify=pki.client_context(), timeout=10) as client,
    ):
        resp = await client.get("/healthz", headers={"X-Big": "a" * 8192})
    assert resp.status_code == 431


async def test_the_router_calls_an_https_agent_it_trusts(pki: Pki) -> None:
    """With outbound.ca_file naming the test CA, a call to an HTTPS agent succeeds."""
    agent = FakeAgent("secure", ssl_context=pki.server_context())
    resp = await reach_through(policy(outbound={"ca_file": pki.ca_file}), agent)
    body = resp.json()
    assert body["status"] == "SUCCESS", body
    assert agent.received[0]["payload"] == {"x": 1}


async def test_health_probes_use_tls_too(pki: Pki) -> None:
    """Health probes go over the same verified session: an HTTPS agent is probed and stays healthy."""
    config = RouterConfig.model_validate(
        {"outbound": {"ca_file": pki.ca_file}, "health": {"interval_seconds": 0.05, "jitter": 0}}
    )
    agent = await FakeAgent("secure", ssl_context=pki.server_context()).start()
    try:
        async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as client:
            await agent.register(router.url, vectors=False)
            # Probes come every 50 ms; the deadline only bounds a broken run. A probe that failed
            # its handshake never reaches the agent, so each one counted went over verified TLS.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while loop.time() < deadline:
                if agent.health_probes >= 2:
                    break
                await asyncio.sleep(0.02)
            status = (await client.get("/admin/agents/secure")).json()
    finally:
        await agent.stop()
    assert agent.health_probes >= 2
    assert status["status"] == "available", status


async def test_an_untrusted_agent_is_a_connect_error_not_a_500(pki: Pki) -> None:
    """Without the test CA configured, the call fails cleanly: NO_AVAILABLE_HANDLER, reason connect_error."""
    resp = await reach_through(policy(), FakeAgent("secure", ssl_context=pki.server_context()))
    body = resp.json()
    assert resp.status_code == 503, body
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    assert [(c["agentId"], c["reason"]) for c in body["error"]["candidates"]] == [("secure", "connect_error")]
    assert {a["outcome"] for a in body["attempts"]} == {"connect_error"}


async def test_a_certificate_failure_is_connect_failed_naming_tls(pki: Pki) -> None:
    """The transport turns an untrusted certificate into ConnectFailed that says TLS and why."""
    agent = await FakeAgent("secure", ssl_context=pki.server_context()).start()
    transport = HttpTransport()  # the system store, which does not hold the test CA
    await transport.open()
    try:
        with pytest.raises(ConnectFailed, match=r"TLS: the agent's certificate was refused") as caught:
            await transport.send(agent.endpoint, b"{}", {}, LIMITS)
    finally:
        await transport.close()
        await agent.stop()
    assert "outbound.ca_file" in caught.value.message
    assert not caught.value.refused


async def test_a_certificate_for_another_host_is_refused(pki: Pki) -> None:
    """Verification checks the name: a trusted certificate for another host is ConnectFailed."""
    other = pki.ca.issue_cert("agent.elsewhere.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    other.configure_cert(context)
    agent = await FakeAgent("impostor", ssl_context=context).start()
    transport = HttpTransport(tls=OutboundPolicy(ca_file=pki.ca_file))
    await transport.open()
    try:
        with pytest.raises(ConnectFailed, match=r"TLS: .*(mismatch|not valid for)"):
            await transport.send(agent.endpoint, b"{}", {}, LIMITS)
    finally:
        await transport.close()
        await agent.stop()


async def test_mutual_tls_with_a_client_certificate(pki: Pki) -> None:
    """An agent that demands a client certificate takes the Router's; without one it is a connect_error."""
    outbound = {
        "ca_file": pki.ca_file,
        "client_cert_file": pki.client_cert_file,
        "client_key_file": pki.client_key_file,
    }
    demanding = pki.server_context(require_client_cert=True)
    with_cert = await reach_through(policy(outbound=outbound), FakeAgent("strict", ssl_context=demanding))
    assert with_cert.json()["status"] == "SUCCESS", with_cert.json()
    without = await reach_through(
        policy(outbound={"ca_file": pki.ca_file}), FakeAgent("strict", ssl_context=demanding)
    )
    body = without.json()
    assert without.status_code == 503, body
    assert [(c["agentId"], c["reason"]) for c in body["error"]["candidates"]] == [("strict", "connect_error")]


def test_certificate_and_key_go_together() -> None:
    """server.tls_cert_file without tls_key_file (or the reverse) is a ConfigError naming both."""
    for half in ({"tls_cert_file": "a.pem"}, {"tls_key_file": "a.key"}):
        with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
            RouterConfig.from_mapping({"server": half})
    with pytest.raises(ConfigError, match="client_key_file needs client_cert_file"):
        RouterConfig.from_mapping({"outbound": {"client_key_file": "a.key"}})


def test_unreadable_tls_files_stop_the_router_at_start(tmp_path: Path, pki: Pki) -> None:
    """A missing CA bundle, certificate or mismatched key is a ConfigError naming the key, not a traceback."""
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"outbound\.ca_file"):
        HttpTransport(tls=OutboundPolicy(ca_file=missing))
    with pytest.raises(ConfigError, match=r"outbound\.client_cert_file"):
        HttpTransport(tls=OutboundPolicy(client_cert_file=missing))
    with pytest.raises(ConfigError, match=r"server\.tls_cert_file"):
        tls_settings(ServerPolicy(tls_cert_file=missing, tls_key_file=pki.key_file))
    with pytest.raises(ConfigError, match=r"server\.tls_cert_file"):
        tls_settings(ServerPolicy(tls_cert_file=pki.cert_file, tls_key_file=pki.client_key_file))
    assert tls_settings(ServerPolicy()) == {}


def https_router(pki: Pki) -> RouterServer:
    """A Router serving HTTPS with the test certificate, trusting the test CA for its agents."""
    return RouterServer(
        policy(
            server={"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file},
            outbound={"ca_file": pki.ca_file},
        )
    )


async def test_an_sdk_agent_registers_and_serves_over_https(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With REACH_CA_FILE the SDK registers with and calls an HTTPS Router; its callback is HTTPS too."""
    monkeypatch.setenv("REACH_CA_FILE", pki.ca_file)
    async with https_router(pki) as router:
        config = AgentConfig.from_mapping(
            {
                "agent": {
                    "id": "sdk-secure",
                    "network": {"endpoint": f"https://127.0.0.1:{free_port()}/reach"},
                    "capabilities": [{"task": "echo"}],
                },
                "router": {"url": router.url},
                "server": {"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file},
            },
            env={},
        )
        agent = ReachAgent(config)
        agent.capability("echo")(lambda payload: payload)
        await agent.start()
        try:
            async with ReachClient(router.url) as client:
                answer = await client.call("echo", {"x": 1})
            # The sync client blocks: off the loop that serves the Router.
            with SyncReachClient(router.url) as sync_client:
                sync_answer = await asyncio.to_thread(sync_client.call, "echo", {"x": 2})
        finally:
            await agent.stop()
    assert answer.status == "SUCCESS", answer
    assert answer.result == {"x": 1}
    assert sync_answer.result == {"x": 2}


async def test_sdk_clients_refuse_an_https_router_they_do_not_trust(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without REACH_CA_FILE the test CA is unknown: both clients raise RouterUnavailable, nothing worse."""
    monkeypatch.delenv("REACH_CA_FILE", raising=False)
    async with https_router(pki) as router:
        async with ReachClient(router.url) as client:
            with pytest.raises(RouterUnavailable):
                await client.call("echo", {})
        with SyncReachClient(router.url) as sync_client, pytest.raises(RouterUnavailable):
            await asyncio.to_thread(sync_client.call, "echo", {})


def test_reach_ca_file_must_be_readable(tmp_path: Path, pki: Pki) -> None:
    """An unloadable REACH_CA_FILE is a ConfigError naming it; unset means the default store."""
    assert router_verify({}) is True
    assert isinstance(router_verify({"REACH_CA_FILE": pki.ca_file}), ssl.SSLContext)
    with pytest.raises(ConfigError, match="REACH_CA_FILE"):
        router_verify({"REACH_CA_FILE": str(tmp_path / "missing.pem")})


@pytest.mark.parametrize(
    ("endpoint", "server", "health", "message"),
    [
        ("https://127.0.0.1:9/reach", {"tls_cert_file": "a.crt"}, {}, "go together"),
        ("http://127.0.0.1:9/reach", {"tls_cert_file": "a.crt", "tls_key_file": "a.key"}, {}, "https://"),
        (
            "https://127.0.0.1:9/reach",
            {"tls_cert_file": "a.crt", "tls_key_file": "a.key"},
            {"port": 9001},
            "health_check.port",
        ),
    ],
)
def test_an_agents_tls_settings_are_checked(
    endpoint: str, server: dict[str, str], health: dict[str, int], message: str
) -> None:
    """The agent's server.tls_* pair: both or neither, an https endpoint, no plain health port."""
    data = {
        "agent": {
            "id": "a",
            "network": {"endpoint": endpoint},
            "capabilities": [{"task": "t"}],
            "health_check": health,
        },
        "server": server,
    }
    with pytest.raises(ConfigError, match=message):
        AgentConfig.from_mapping(data, env={})


async def test_a_streamed_answer_over_https_both_ways(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream runs its own protocol on a pooled connection: over TLS too, chunk by chunk, and
    the connection serves the next call once the stream is read to its end."""
    monkeypatch.setenv("REACH_CA_FILE", pki.ca_file)
    async with https_router(pki) as router:
        config = AgentConfig.from_mapping(
            {
                "agent": {
                    "id": "sdk-streamer",
                    "network": {"endpoint": f"https://127.0.0.1:{free_port()}/reach"},
                    "capabilities": [{"task": "talk"}],
                },
                "router": {"url": router.url},
                "server": {"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file},
            },
            env={},
        )
        agent = ReachAgent(config)

        @agent.capability("talk")
        async def talk(payload: dict[str, Any]) -> Any:
            for n in range(int(payload["n"])):
                yield {"n": n, "text": "x" * 70_000}

        await agent.start()
        try:
            async with ReachClient(router.url) as client:
                for _ in range(2):
                    async with client.stream("talk", {"n": 5}) as stream:
                        chunks = [chunk async for chunk in stream]
                    assert [c["n"] for c in chunks] == list(range(5))
                    assert stream.response.status == "SUCCESS"
        finally:
            await agent.stop()
