"""Routers over an etcd that demands TLS and a login, as a production etcd does."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster, loopback_tls
from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError, RegistryUnavailable
from reachmesh.ports import free_port
from reachmesh.registry.etcd import EtcdRegistry
from reachmesh.registry.etcdclient import EtcdClient, prefix_end
from reachmesh.registry.factory import build_registry
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.test_shared_registry import eventually, listed
from tests.helpers import until

pytestmark = pytest.mark.etcd

PASSWORD = "reach-pw-7f3a9c"  # a test etcd's only
PW_ENV = "REACH_TEST_ETCD_PASSWORD"
PREFIX = "/agent-reach/v1"
TOKEN_TTL_S = 2


@dataclass
class SecuredEtcd:
    cluster: EtcdCluster
    ca_file: str

    @property
    def endpoint(self) -> str:
        return self.cluster.endpoints


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _as_root(etcd: SecuredEtcd, path: str, body: dict[str, Any]) -> None:
    """One call as etcd's root user (an operator at etcdctl)."""
    context = ssl.create_default_context(cafile=etcd.ca_file)
    with httpx.Client(base_url=etcd.cluster.members[0].client_url, verify=context, timeout=10) as http:
        login = http.post("/v3/auth/authenticate", json={"name": "root", "password": "root-pw"}).json()
        resp = http.post(path, json=body, headers={"Authorization": login["token"]})
        assert resp.status_code == 200 and "code" not in resp.json(), resp.text


def _secure(etcd: SecuredEtcd) -> None:
    """Users as an operator sets them up: ``reach`` with read-write on the prefix, ``stranger``
    with read-write elsewhere and ``reader`` with read only; then authentication on."""
    prefix = PREFIX + "/"
    etcd.cluster.secure(
        "root-pw",
        {
            "reach": (PASSWORD, prefix, "READWRITE"),
            "stranger": (PASSWORD, "/elsewhere/", "READWRITE"),
            "reader": (PASSWORD, prefix, "READ"),
        },
    )


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredEtcd]:
    """One etcd member serving clients over TLS only, with authentication on and short tokens."""
    with _tls_etcd(tmp_path) as etcd:
        _secure(etcd)
        yield etcd


@pytest.fixture
def tls_only(tmp_path: Path) -> Iterator[SecuredEtcd]:
    """The same member with authentication still off (a test turns it on)."""
    with _tls_etcd(tmp_path) as etcd:
        yield etcd


@contextmanager
def _tls_etcd(tmp_path: Path) -> Iterator[SecuredEtcd]:
    tls = loopback_tls(tmp_path, "etcd")
    cluster = EtcdCluster(tmp_path / "etcd", 1, tls=tls, extra_args=("--auth-token-ttl", str(TOKEN_TTL_S)))
    with cluster:
        yield SecuredEtcd(cluster, tls[2])


def policy(etcd: SecuredEtcd, **etcd_settings: Any) -> RouterConfig:
    settings: dict[str, Any] = {
        "endpoints": [etcd.endpoint],
        "ca_file": etcd.ca_file,
        "username": "reach",
        "password_env": PW_ENV,
        "request_timeout_seconds": 20,
        **etcd_settings,
    }
    return RouterConfig.model_validate(
        {
            "registry": {"etcd": settings},
            "embedding": {"backend": "none"},
            "limits": {"loop_lag_ms": 10_000},
        }
    )


async def test_routers_share_a_registry_over_tls_with_a_login(secured, monkeypatch, caplog):
    """A registration at A reaches B through a TLS, logged-in etcd; no log line holds a secret."""
    monkeypatch.setenv(PW_ENV, PASSWORD)
    caplog.set_level(logging.DEBUG)
    async with RouterServer(policy(secured)) as a, RouterServer(policy(secured)) as b:
        agent = await FakeAgent("echo-1", result={"ok": 1}).start()
        try:
            async with httpx.AsyncClient(timeout=15) as client:
                await agent.register(a.url)
                await eventually(lambda: listed(client, b, "echo-1"))
                resp = await client.post(f"{b.url}/reach", json={"targetTask": "echo", "payload": {}})
                assert resp.json()["status"] == "SUCCESS"
                assert (await client.get(f"{b.url}/readyz")).json() == {"status": "ready"}
            registry = a.app.parts.registry
            assert isinstance(registry, EtcdRegistry)
            token = registry.client._token
        finally:
            await agent.stop()
    assert token
    assert PASSWORD not in caplog.text
    assert token not in caplog.text


async def test_a_lapsed_token_is_replaced_and_no_call_fails(secured, monkeypatch):
    """etcd forgets an idle token after its TTL; the next registration logs in again and succeeds."""
    monkeypatch.setenv(PW_ENV, PASSWORD)
    # Pings seldom, and the look for orphaned async requests too: each one reads with the token,
    # which would keep it alive.
    config = policy(secured, ping_interval_seconds=30)
    idle = {"adopt_interval_seconds": 3600, "claim_ttl_seconds": 3600}
    config = config.model_copy(update={"async_mode": config.async_mode.model_copy(update=idle)})
    async with RouterServer(config) as a:
        first, second = await FakeAgent("echo-1").start(), await FakeAgent("echo-2").start()
        try:
            await first.register(a.url)
            registry = a.app.parts.registry
            assert isinstance(registry, EtcdRegistry)
            logins, token = registry.client.logins, registry.client._token
            # sleep-ok: time passing is the stimulus (any read with the token would renew it)
            await asyncio.sleep(TOKEN_TTL_S * 2)
            await second.register(a.url)  # raises unless 201
            assert registry.client.logins == logins + 1
            assert registry.client._token not in (None, token)
        finally:
            await first.stop()
            await second.stop()


async def _is(read: Any, wanted: str) -> bool:
    return bool(await read() == wanted)


async def _start_refused(etcd: SecuredEtcd, environ: dict[str, str], **etcd_settings: Any) -> str:
    registry = build_registry(policy(etcd, **etcd_settings).registry, environ=environ)
    try:
        with pytest.raises(ConfigError) as err:
            await registry.start()
    finally:
        await registry.close()
    return err.value.message


async def test_a_wrong_password_stops_the_start_naming_the_settings(secured):
    """etcd refuses the login: a ConfigError that names the user's settings, not the password."""
    message = await _start_refused(secured, {PW_ENV: "not-the-password"})
    assert "authentication failed" in message
    assert PW_ENV in message and "registry.etcd.username" in message
    assert "not-the-password" not in message


async def test_no_login_against_an_etcd_that_wants_one_says_which_settings_to_add(secured):
    """Without a user, etcd says the user name is empty; the error says where to set one."""
    message = await _start_refused(secured, {}, username=None)
    assert "etcd has authentication on" in message
    assert PW_ENV in message  # the variable this policy reads the password from


async def test_a_user_without_the_prefix_is_told_which_permission_to_grant(secured):
    """A role that does not cover the prefix, or may only read it: the error names the grant."""
    for user in ("stranger", "reader"):
        message = await _start_refused(secured, {PW_ENV: PASSWORD}, username=user)
        assert "permission denied" in message
        assert f"readwrite {PREFIX}/" in message


async def _not_ready_reason(etcd: SecuredEtcd, **etcd_settings: Any) -> str | None:
    """Why a registry that cannot reach etcd is not ready after its start (short deadlines)."""
    config = policy(etcd, request_timeout_seconds=1, attempt_timeout_seconds=0.5, **etcd_settings)
    registry = build_registry(config.registry, environ={PW_ENV: PASSWORD})
    try:
        await registry.start()
        return registry.ready()
    finally:
        await registry.close()


async def test_an_untrusted_certificate_leaves_the_router_not_ready_saying_why(secured):
    """Without the CA the member's certificate is refused: not ready, and the reason says TLS."""
    reason = await _not_ready_reason(secured, ca_file=None)
    assert reason is not None and "TLS: its certificate was refused" in reason
    assert "registry.etcd.ca_file" in reason


def test_the_router_command_stops_with_one_line_on_a_wrong_password(secured, tmp_path: Path):
    """`reach router` against a refusing etcd exits non-zero with a line and no traceback."""
    config = tmp_path / "router.yaml"
    config.write_text(
        "registry:\n  etcd:\n"
        f"    endpoints: ['{secured.endpoint}']\n    ca_file: {secured.ca_file}\n"
        f"    username: reach\n    password_env: {PW_ENV}\n"
        "embedding:\n  backend: none\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "reachmesh", "router", "--port", str(free_port()), "--config", str(config)],
        env={"PATH": "/usr/bin:/bin", PW_ENV: "wrong-password-123"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "authentication failed" in output
    assert "Traceback" not in output
    assert "wrong-password-123" not in output


async def test_a_password_changed_under_a_running_router_is_503_and_degraded_until_restored(
    secured, monkeypatch
):
    """A refused login while running: registrations get 503 saying why, /readyz says degraded;
    when the password is back, both recover without a restart."""
    monkeypatch.setenv(PW_ENV, PASSWORD)
    async with RouterServer(policy(secured)) as a, httpx.AsyncClient(timeout=15) as client:
        first, second = await FakeAgent("echo-1").start(), await FakeAgent("echo-2").start()
        try:
            await first.register(a.url)
            _as_root(secured, "/v3/auth/user/changepw", {"name": "reach", "password": "changed-pw"})

            async def readiness() -> str:
                return str((await client.get(f"{a.url}/readyz")).json()["status"])

            # Noticed without any registration: the Router checks its access as it pings.
            await eventually(lambda: _is(readiness, "degraded"), limit_s=45)
            resp = await client.post(f"{a.url}/agents", json=second.profile())
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "REGISTRY_UNAVAILABLE"
            assert "authentication failed" in error["message"] and PW_ENV in error["message"]
            ready = (await client.get(f"{a.url}/readyz")).json()
            assert ready["status"] == "degraded" and "authentication failed" in ready["reason"]
            _as_root(secured, "/v3/auth/user/changepw", {"name": "reach", "password": PASSWORD})
            await eventually(lambda: _is(readiness, "ready"), limit_s=45)  # again with no call
            await second.register(a.url)
        finally:
            await first.stop()
            await second.stop()


async def test_authentication_turned_on_under_a_router_without_a_login_names_the_settings(tls_only):
    """etcd starts demanding a login: the Router without one says which settings to add."""
    async with RouterServer(policy(tls_only, username=None)) as a, httpx.AsyncClient(timeout=15) as client:
        agent = await FakeAgent("echo-1").start()
        try:
            _secure(tls_only)
            resp = await client.post(f"{a.url}/agents", json=agent.profile())
            assert resp.status_code == 503, resp.text
            assert "etcd has authentication on" in resp.json()["error"]["message"]
            ready = (await client.get(f"{a.url}/readyz")).json()
            assert ready["status"] == "degraded" and "registry.etcd.username" in ready["reason"]
        finally:
            await agent.stop()


async def test_waiting_for_another_calls_login_keeps_to_the_callers_deadline(secured):
    """A short call queued behind a long call's login to a hung member gives up on its own
    deadline, before the long call ends."""
    member = secured.cluster.members[0]
    tls = ssl.create_default_context(cafile=secured.ca_file)
    client = EtcdClient([secured.endpoint], tls=tls, credentials=("reach", PASSWORD), attempt_timeout=10)
    await client.open()
    member.freeze()
    try:
        long = asyncio.ensure_future(client.get("/agent-reach/v1/x", deadline=10))
        await until(lambda: client._login.locked(), "the long call to hold the login")
        with pytest.raises(RegistryUnavailable, match=r"within 0\.5 s \(waiting for another call's login\)"):
            await client.get("/agent-reach/v1/x", deadline=0.5)
        assert not long.done()
    finally:
        member.thaw()
        await asyncio.gather(long, return_exceptions=True)
        await client.close()


async def test_plain_http_to_a_tls_member_is_not_ready_and_says_to_write_https(secured):
    """etcd drops a plain-HTTP client on its TLS port; the reason says to write https://."""
    plain = secured.endpoint.removeprefix("https://")
    reason = await _not_ready_reason(secured, endpoints=[plain], ca_file=None)
    assert reason is not None and "write it as https://" in reason


async def test_a_role_cut_to_read_only_stays_degraded_until_it_may_write_again(secured, monkeypatch):
    """Reads still work for a read-only role, so only a write may clear the refusal: /readyz
    stays degraded across pings, and turns ready once the role may write again."""
    monkeypatch.setenv(PW_ENV, PASSWORD)
    prefix = PREFIX + "/"
    span = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
    async with (
        RouterServer(policy(secured, ping_interval_seconds=0.2)) as a,
        httpx.AsyncClient(timeout=15) as client,
    ):
        agent = await FakeAgent("echo-1").start()
        try:

            async def readiness() -> str:
                return str((await client.get(f"{a.url}/readyz")).json()["status"])

            _as_root(secured, "/v3/auth/role/revoke", {"role": "reach", **span})
            _as_root(secured, "/v3/auth/role/grant", {"name": "reach", "perm": {"permType": "READ", **span}})
            resp = await client.post(f"{a.url}/agents", json=agent.profile())
            assert resp.status_code == 503 and "permission denied" in resp.json()["error"]["message"]
            registry = a.app.parts.registry
            assert isinstance(registry, EtcdRegistry)
            pings = registry._pings
            await eventually(lambda: _more_pings(registry, pings + 12), limit_s=30)
            assert await readiness() == "degraded"  # many pings later, reads succeeding throughout
            write = {"permType": "READWRITE", **span}
            _as_root(secured, "/v3/auth/role/grant", {"name": "reach", "perm": write})
            await eventually(lambda: _is(readiness, "ready"), limit_s=45)
            await agent.register(a.url)
        finally:
            await agent.stop()


async def _more_pings(registry: EtcdRegistry, wanted: int) -> bool:
    return registry._pings >= wanted


async def test_a_late_etcd_that_refuses_the_login_keeps_the_router_not_ready_saying_why(tmp_path: Path):
    """etcd down at start: the start goes on (it listens at once). When etcd comes up and
    refuses the password, the Router says so, naming the setting to fix."""
    tls = loopback_tls(tmp_path, "etcd")
    cluster = EtcdCluster(tmp_path / "etcd", 1, tls=tls)
    etcd = SecuredEtcd(cluster, tls[2])
    registry = build_registry(policy(etcd).registry, environ={PW_ENV: "not-the-password"})
    try:
        await registry.start()
        assert "connection refused" in (registry.ready() or "")
        await asyncio.to_thread(cluster.start)
        await asyncio.to_thread(_secure, etcd)

        def refused() -> str | None:
            # Not ready (etcd came up refusing), or degraded (its watch read etcd in the moment
            # before authentication went on): either way the reason says what to fix.
            reason = registry.ready() or registry.degraded()
            return reason if reason is not None and "authentication failed" in reason else None

        reason = await until(refused, "the refusal in the reason", within=10)
        assert PW_ENV in reason and "registry.etcd.username" in reason, reason
        assert "not-the-password" not in reason
    finally:
        await registry.close()
        cluster.stop()
