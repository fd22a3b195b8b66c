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
