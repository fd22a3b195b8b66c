"""Fixtures of the registry tests: a manual clock and an in-memory registry on it."""

from __future__ import annotations

import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy
from reachmesh.registry.memory import MemoryRegistry


@pytest.fixture
def clock() -> ManualClock:
    """Time that moves only when a test advances it."""
    return ManualClock()


@pytest.fixture
def registry(clock: ManualClock) -> MemoryRegistry:
    """A 2 s lease, 5 s offline grace, on the test's clock."""
    return MemoryRegistry(RegistryPolicy(lease_ttl_seconds=2, offline_grace_seconds=5), clock=clock)
