"""The Router's policy file."""

from __future__ import annotations

from pathlib import Path

import pytest

from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError


def test_defaults_match_the_protocol() -> None:
    """No file means PROTOCOL.md §5's defaults."""
    config = RouterConfig.load(None)
    assert config.registry.lease_ttl_seconds == 60
    assert config.retries.max_per_request == 2
    assert config.retries.same_agent == 1
    assert config.timeouts.connect_ms == 1000
    assert config.server.body_limit_bytes == 1024 * 1024


def test_file_is_read(tmp_path: Path) -> None:
    """Keys in the file override the defaults; suspect_after defaults to half the TTL."""
    path = tmp_path / "router.yaml"
    path.write_text("registry:\n  lease_ttl_seconds: 2\n")
    config = RouterConfig.load(path)
    assert config.registry.lease_ttl_seconds == 2
    assert config.registry.suspect_after == 1


def test_env_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REACH_CONFIG is used when no path is given."""
    path = tmp_path / "r.yaml"
    path.write_text("timeouts: {read_ms: 1234}\n")
    monkeypatch.setenv("REACH_CONFIG", str(path))
    assert RouterConfig.load().timeouts.read_ms == 1234


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("registry:\n  lease_ttl_seconds: -1\n", "registry.lease_ttl_seconds"),
        ("registry:\n  lease_ttl: 5\n", "registry.lease_ttl"),
        ("timeouts: [1, 2]\n", "timeouts"),
        ("- just a list\n", "top level must be a mapping"),
        ("registry: {lease_ttl_seconds: 2, suspect_after_seconds: 3}\n", "suspect_after_seconds"),
        ("a: [unclosed\n", "not valid YAML (line"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    """A bad policy file is refused with a message naming the field or the YAML position."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        RouterConfig.load(path)
    assert needle in info.value.message


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    """A missing file names itself."""
    with pytest.raises(ConfigError, match="cannot read"):
        RouterConfig.load(tmp_path / "nope.yaml")


def test_operating_point_by_model() -> None:
    """threshold/margin win; else the model's own calibration; else the built-in pair; else none."""
    policy = RouterConfig.from_mapping(
        {"embedding": {"calibrations": {"big-e5": {"threshold": 0.21, "margin": 0.03}}}}
    ).embedding
    assert policy.operating_point("big-e5", (0.08, 0.015)) == (0.21, 0.03)
    assert policy.operating_point("other", (0.08, 0.015)) == (0.08, 0.015)
    assert policy.operating_point("other", None) is None
    pinned = RouterConfig.from_mapping(
        {"embedding": {"threshold": 0.5, "calibrations": {"big-e5": {"threshold": 0.21, "margin": 0.03}}}}
    ).embedding
    assert pinned.operating_point("big-e5", None) == (0.5, 0.03)
    with pytest.raises(ConfigError, match="calibrations"):
        RouterConfig.from_mapping({"embedding": {"calibrations": {"m": {"threshold": 3}}}})


@pytest.mark.parametrize(
    ("mapping", "hint"),
    [
        ({"registry": {"etcd": {"ping_interval": 2}}}, "did you mean registry.etcd.ping_interval_seconds?"),
        ({"registry": {"etcd": {"endpoint": ["127.0.0.1:2379"]}}}, "did you mean registry.etcd.endpoints?"),
        ({"async_mode": {"claim_ttl": 3}}, "did you mean async_mode.claim_ttl_seconds?"),
        ({"regsitry": {}}, "did you mean registry?"),
        # Under maps keyed by name and under lists, the name or index is passed over (before,
        # a typo in a per-task override got no guess at all).
        ({"tasks": {"search": {"read_mss": 900}}}, "did you mean tasks.search.read_ms?"),
        ({"tasks": {"search": {"max_retry": 1}}}, "did you mean tasks.search.max_retries?"),
        (
            {"embedding": {"calibrations": {"e5": {"treshold": 0.2}}}},
            "did you mean embedding.calibrations.e5.threshold?",
        ),
        (
            {"auth": {"tokens": [{"role": "caller", "sha256": "a" * 64, "agent_id": ["x"]}]}},
            "did you mean auth.tokens.0.agent_ids?",
        ),
    ],
)
def test_a_misspelt_key_is_refused_with_the_key_it_is_close_to(mapping: dict, hint: str) -> None:
    """A typo in a policy key (walk 48: `registry.etcd.ping_interval`) is refused naming it, and
    the known key it is close to; one close to none gets no guess."""
    with pytest.raises(ConfigError) as caught:
        RouterConfig.from_mapping(mapping)
    assert "Extra inputs are not permitted" in str(caught.value)
    assert hint in str(caught.value)
    with pytest.raises(ConfigError) as far:
        RouterConfig.from_mapping({"registry": {"etcd": {"zzz": 1}}})
    assert "did you mean" not in str(far.value)
