"""Choosing the registry and the way to etcd from a policy: bad settings stop the start with a line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import yaml

from reachmesh.config import EtcdPolicy, RegistryPolicy, RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.registry.etcd import EtcdRegistry
from reachmesh.registry.factory import build_registry, etcd_credentials, etcd_tls
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.testing import RouterServer


def test_no_login_is_configured_by_default():
    """Neither a user nor a password: the Router talks to etcd without logging in."""
    assert etcd_credentials(EtcdPolicy(), environ={}) is None


def test_the_user_comes_from_the_policy_or_the_environment_and_the_password_from_its_variable():
    """registry.etcd.username wins over REACH_ETCD_USERNAME; the password is read from password_env."""
    env = {"REACH_ETCD_USERNAME": "from-env", "REACH_ETCD_PASSWORD": "pw1", "MY_PW": "pw2"}
    assert etcd_credentials(EtcdPolicy(), environ=env) == ("from-env", "pw1")
    policy = EtcdPolicy(username="from-policy", password_env="MY_PW")
    assert etcd_credentials(policy, environ=env) == ("from-policy", "pw2")


def test_a_password_without_a_user_and_a_user_without_a_password_are_refused():
    """A half-set login is a ConfigError naming what is missing, never the password itself."""
    with pytest.raises(ConfigError, match="no user is named") as err:
        etcd_credentials(EtcdPolicy(), environ={"REACH_ETCD_PASSWORD": "s3cret-value"})
    assert "s3cret-value" not in err.value.message
    with pytest.raises(ConfigError, match="REACH_ETCD_PASSWORD"):
        etcd_credentials(EtcdPolicy(username="reach"), environ={})


def test_plain_http_members_need_no_tls_context_and_refuse_tls_files(tmp_path: Path):
    """TLS files beside http:// members are a mistake the operator would not see: refused."""
    assert etcd_tls(EtcdPolicy(), ["127.0.0.1:2379"]) is None
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    with pytest.raises(ConfigError, match="no etcd endpoint is https://"):
        etcd_tls(EtcdPolicy(ca_file=str(ca)), ["http://10.0.0.5:2379"])


def test_https_members_are_verified_against_the_ca_file(tmp_path: Path):
    """An https:// member gets a verifying context; an unreadable CA file names its key."""
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    context = etcd_tls(EtcdPolicy(ca_file=str(ca)), ["https://etcd-1:2379"])
    assert context is not None and context.check_hostname
    with pytest.raises(ConfigError, match=r"registry\.etcd\.ca_file: cannot load"):
        etcd_tls(EtcdPolicy(ca_file=str(tmp_path / "missing.pem")), ["https://etcd-1:2379"])
    with pytest.raises(ConfigError, match=r"registry\.etcd\.client_cert_file: cannot load"):
        etcd_tls(EtcdPolicy(client_cert_file=str(ca)), ["https://etcd-1:2379"])


def test_a_client_key_without_its_certificate_is_an_invalid_policy():
    """The key alone means nothing: the policy does not load."""
    with pytest.raises(ValueError, match="client_key_file needs client_cert_file"):
        EtcdPolicy(client_key_file="/etc/reach/key.pem")


def test_https_endpoints_are_accepted_and_a_memory_registry_ignores_etcd_settings():
    """https://host:port passes the endpoint check; without endpoints the registry is in memory."""
    policy = RegistryPolicy(etcd=EtcdPolicy(username="reach"))
    assert isinstance(build_registry(policy, environ={}), MemoryRegistry)
    with pytest.raises(ConfigError, match="https://host:port"):
        build_registry(RegistryPolicy(etcd=EtcdPolicy(endpoints=["ftp://etcd:2379"])), environ={})


async def test_a_reload_that_changes_the_etcd_settings_says_it_needs_a_restart(tmp_path: Path, caplog):
    """The connection to etcd is set up at start: a reload names the changed key instead of
    seeming to apply it."""
    caplog.set_level(logging.WARNING)
    path = tmp_path / "router.yaml"
    policy: dict[str, Any] = {"health": {"enabled": False}, "embedding": {"backend": "none"}}
    path.write_text(yaml.safe_dump(policy))
    async with RouterServer(RouterConfig.load(path), config_path=path) as router:
        policy["registry"] = {"etcd": {"username": "reach"}}
        path.write_text(yaml.safe_dump(policy))
        async with httpx.AsyncClient(base_url=router.url) as http:
            assert (await http.post("/admin/reload")).status_code == 200
    assert any(
        "registry.etcd.username changed: the connection to etcd is set up at start; restart" in r.getMessage()
        for r in caplog.records
    )


def test_a_login_over_plain_http_beyond_loopback_is_warned_about(caplog):
    """The password would cross the network in clear: the start says so; loopback does not."""
    caplog.set_level(logging.WARNING)
    environ = {"REACH_ETCD_USERNAME": "reach", "REACH_ETCD_PASSWORD": "pw-9d1e"}
    for endpoint in ("127.0.0.1:2379", "https://etcd-1:2379", "http://10.20.0.5:2379"):
        policy = RegistryPolicy(etcd=EtcdPolicy(endpoints=[endpoint]))
        registry = build_registry(policy, environ=environ)
        assert isinstance(registry, EtcdRegistry)
        registry._warn_plain_login()
    warned = [r.getMessage() for r in caplog.records if "unencrypted" in r.getMessage()]
    assert warned == [
        "[registry] the etcd password for 'reach' goes unencrypted to http://10.20.0.5:2379: "
        "use https:// endpoints"
    ]
    assert "pw-9d1e" not in caplog.text


def test_members_that_mix_https_and_plain_http_are_refused():
    """One plain member among https ones would carry the registry, and the login, in clear."""
    with pytest.raises(ConfigError, match="mix https:// with plain ones"):
        etcd_tls(EtcdPolicy(), ["https://etcd-1:2379", "10.0.0.2:2379"])


def test_a_password_from_a_secret_file_loses_its_newline_and_a_user_its_spaces():
    """A mounted secret ends in a newline that is not part of the password; names are trimmed."""
    env = {"REACH_ETCD_PASSWORD": "pw with spaces \n"}
    assert etcd_credentials(EtcdPolicy(username=" reach "), environ=env) == ("reach", "pw with spaces ")
