"""Conversation affinity table."""

from __future__ import annotations

from reachmesh.clock import ManualClock
from reachmesh.config import AffinityPolicy
from reachmesh.resilience.affinity import AffinityTable


def test_binding_expires_after_ttl() -> None:
    """A binding holds for ttl_seconds, then is gone."""
    clock = ManualClock()
    table = AffinityTable(AffinityPolicy(ttl_seconds=5), clock=clock)
    table.bind("conv", "a")
    clock.advance(4.9)
    assert table.get("conv") == "a"
    clock.advance(0.1)
    assert table.get("conv") is None


def test_size_is_bounded() -> None:
    """Past max_conversations the least recently bound go first."""
    table = AffinityTable(AffinityPolicy(max_conversations=100), clock=ManualClock())
    for i in range(1000):
        table.bind(f"c{i}", "a")
    assert len(table) == 100
    assert table.get("c999") == "a" and table.get("c0") is None


def test_forget_agent() -> None:
    """An agent leaving the registry loses its bindings."""
    table = AffinityTable(clock=ManualClock())
    table.bind("c1", "a")
    table.bind("c2", "b")
    table.forget_agent("a")
    assert table.get("c1") is None and table.get("c2") == "b"
