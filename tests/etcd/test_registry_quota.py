"""Expired entries count against the token that made them: the registry in etcd."""

from __future__ import annotations

import pytest

from reachmesh.testing import RouterServer
from tests.bounds.quota import one_token_cannot_fill_the_registry, tokens
from tests.etcd.conftest import etcd_policy

pytestmark = pytest.mark.etcd


async def test_a_token_that_lets_leases_lapse_cannot_fill_the_etcd_registry(etcd, client) -> None:
    """As with the memory registry: three rounds of three lapsed ids under a quota of three, in
    a registry of eight, and token B's agent is still taken."""
    policy = etcd_policy(
        etcd,
        auth=tokens(),
        health={"enabled": False},
        registry={"max_agents": 8, "max_agents_per_token": 3, "lease_ttl_seconds": 2},
    )
    async with RouterServer(policy) as router:
        await one_token_cannot_fill_the_registry(client, router.url, rounds=3, per_token=3)
