"""reach_config.yaml: loading, environment overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from reachmesh.exceptions import ConfigError
from reachmesh.sdk.config import AgentConfig

GOOD = """
agent:
  id: price-query-agent
  network:
    endpoint: http://127.0.0.1:7301/reach
  capabilities:
    - task: query_product_price
      input_schema: {product_id: string}
  health_check: {port: 7302}
router:
  url: http://127.0.0.1:7200
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reach_config.yaml"
    path.write_text(text)
    return path


def test_loads_profile_router_and_bind(tmp_path: Path) -> None:
    """The file gives the profile, the Router URL, and the port to bind (from the endpoint)."""
    config = AgentConfig.load(write(tmp_path, GOOD), env={})
    assert config.profile.id == "price-query-agent"
    assert config.router_url == "http://127.0.0.1:7200"
    assert (config.host, config.port, config.callback_path) == ("127.0.0.1", 7301, "/reach")
    assert config.health_port == 7302


def test_environment_overrides(tmp_path: Path) -> None:
    """REACH_SELF_ID, REACH_ROUTER_URL and REACH_CALLBACK_URL win over the file."""
    env = {
        "REACH_SELF_ID": "price-2",
        "REACH_ROUTER_URL": "http://10.0.0.1:7200/",
        "REACH_CALLBACK_URL": "http://127.0.0.1:9999/cb",
    }
    config = AgentConfig.load(write(tmp_path, GOOD), env=env)
    assert config.profile.id == "price-2"
    assert config.router_url == "http://10.0.0.1:7200"
    assert config.profile.network.endpoint == "http://127.0.0.1:9999/cb"
    assert (config.port, config.callback_path) == (9999, "/cb")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (GOOD.replace("price-query-agent", "Price Agent"), "agent.id"),
        (
            GOOD.replace("input_schema: {product_id: string}", "input_schema: {product_id: strin}"),
            "agent.capabilities.0.input_schema",
        ),
        (
            GOOD.replace("    endpoint: http://127.0.0.1:7301/reach", "    endpoint: 7301"),
            "agent.network.endpoint",
        ),
        ("router: {url: http://x}\n", "agent: is required"),
        (GOOD + "extra: 1\n", "unknown top-level key(s) extra"),
        (GOOD.replace("url: http://127.0.0.1:7200", "url: localhost"), "router.url"),
        ("agent: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    """A reach_config.yaml with an error is refused with a message naming the field."""
    with pytest.raises(ConfigError) as info:
        AgentConfig.load(write(tmp_path, text), env={})
    assert needle in info.value.message
    assert "reach_config.yaml" in info.value.message


def test_registration_timeout_is_configurable(tmp_path: Path) -> None:
    """router.registration_timeout_seconds defaults to 5 s; a non-positive or non-number one is refused."""
    assert AgentConfig.load(write(tmp_path, GOOD), env={}).registration_timeout_seconds == 5.0
    config = AgentConfig.load(write(tmp_path, GOOD + "  registration_timeout_seconds: 0.5\n"), env={})
    assert config.registration_timeout_seconds == 0.5
    for bad in ("0", "-1", "soon", "true"):
        with pytest.raises(ConfigError, match="registration_timeout_seconds"):
            AgentConfig.load(write(tmp_path, GOOD + f"  registration_timeout_seconds: {bad}\n"), env={})


@pytest.mark.parametrize(
    ("typo", "said"),
    [
        (
            GOOD.replace("      input_schema:", "      exmaples: [how much]\n      input_schema:"),
            "agent.capabilities.0.exmaples is not a known key; did you mean 'examples'?",
        ),
        (
            GOOD.replace("  health_check: {port: 7302}", "  health_chek: {port: 7302}"),
            "agent.health_chek is not a known key; did you mean 'health_check'?",
        ),
        (
            GOOD.replace("  health_check: {port: 7302}", "  health_check: {port: 7302, intervl_seconds: 5}"),
            "agent.health_check.intervl_seconds is not a known key; did you mean 'interval_seconds'?",
        ),
        (
            GOOD.replace("    endpoint:", "    endpiont:"),
            "agent.network.endpiont is not a known key; did you mean 'endpoint'?",
        ),
        (GOOD + "server: {prot: 7301}\n", "server.prot is not a known key; did you mean 'port'?"),
        (GOOD + "routr: {url: http://x}\n", "unknown top-level key(s) routr; did you mean 'router'?"),
    ],
)
def test_a_misspelt_key_is_refused_with_did_you_mean(tmp_path: Path, typo: str, said: str) -> None:
    """A typo would silently drop what the author meant (examples, the health check): refused."""
    with pytest.raises(ConfigError) as info:
        AgentConfig.load(write(tmp_path, typo), env={})
    assert said in info.value.message


def test_a_key_of_its_own_is_kept_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A key like no known one (a team's own tag) loads, with one warning naming it."""
    text = GOOD.replace("  health_check: {port: 7302}", "  health_check: {port: 7302}\n  team: pricing")
    with caplog.at_level("WARNING", logger="reachmesh.sdk"):
        config = AgentConfig.load(write(tmp_path, text), env={})
    assert config.profile.id == "price-query-agent"
    where = tmp_path / "reach_config.yaml"
    assert [r.getMessage() for r in caplog.records] == [
        f"[reach-client] {where}: agent.team is not a key of reach_config.yaml; ignored"
    ]
