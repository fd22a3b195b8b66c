"""Fixtures for the shared registry: real etcd members on free loopback ports, own data dirs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.config import RouterConfig

pytestmark = pytest.mark.etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """One etcd member, started for the test and stopped after it."""
    with EtcdCluster(tmp_path / "etcd", 1) as cluster:
        yield cluster


def etcd_policy(cluster: EtcdCluster, **sections: Any) -> RouterConfig:
    """A Router policy on ``cluster``: no embedder (routes by task), no lag shedding on a busy box."""
    policy: dict[str, Any] = {
        # A loaded test machine can hold an etcd write (an fsync) for seconds: these tests are
        # about sharing, not deadlines; the degraded-mode tests set their own.
        "registry": {"etcd": {"endpoints": cluster.endpoints.split(","), "request_timeout_seconds": 20}},
        "embedding": {"backend": "none"},
        "limits": {"loop_lag_ms": 10_000},
    }
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(policy.get(name), dict):
            merged = {**policy[name], **values}
            if name == "registry" and "etcd" in values:
                merged["etcd"] = {**policy["registry"]["etcd"], **values["etcd"]}
            policy[name] = merged
        else:
            policy[name] = values
    return RouterConfig.model_validate(policy)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for talking to several Routers by absolute URL."""
    async with httpx.AsyncClient(timeout=15) as http:
        yield http
