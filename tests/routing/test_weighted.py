"""weighted_round_robin: shares by weight, and by merit when an agent turns slow or starts failing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy, RoutingPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.protocol import AgentProfile, ReachRequest
from reachmesh.registry import MemoryRegistry
from reachmesh.routing import Pipeline
from reachmesh.routing.stats import StatsBook

WRR = ReachRequest.model_validate({"targetTask": "t", "preferences": {"strategy": "weighted_round_robin"}})


async def setup(weights: dict[str, float]) -> tuple[Pipeline, StatsBook, ManualClock]:
    clock = ManualClock()
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=3600), clock=clock)
    for agent_id, weight in weights.items():
        await registry.register(
            AgentProfile.model_validate(
                {
                    "id": agent_id,
                    "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
                    "capabilities": [{"task": "t", "routing_weight": weight}],
                }
            )
        )
    stats = StatsBook(clock=clock, tau_seconds=2.0)
    return Pipeline(registry, RoutingPolicy(), stats=stats), stats, clock


def first(pipeline: Pipeline) -> str:
    record = DecisionRecord(trace_id="x", task="t", source="-", started=0.0)
    return pipeline.decide(WRR, record)[0].entry.id


async def test_shares_match_weights() -> None:
    """Over 10,000 decisions with equal merit, each agent's share is its weight's share within 2%."""
    pipeline, _, _ = await setup({"a": 5, "b": 3, "c": 2})
    counts = Counter(first(pipeline) for _ in range(10_000))
    for agent_id, weight in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        assert abs(counts[agent_id] / 10_000 - weight) <= 0.02


def simulate(
    pipeline: Pipeline,
    stats: StatsBook,
    clock: ManualClock,
    seconds: float,
    *,
    rate: int,
    latency: dict[str, float],
    failing: Collection[str] = frozenset(),
) -> Counter[str]:
    """``rate`` decisions per second for ``seconds``, each followed by its outcome."""
    counts: Counter[str] = Counter()
    for _ in range(int(seconds * rate)):
        clock.advance(1 / rate)
        agent_id = first(pipeline)
        counts[agent_id] += 1
        stats.started(agent_id)
        stats.finished(agent_id, ok=agent_id not in failing, latency_ms=latency[agent_id])
    return counts


async def test_slow_agent_loses_share_within_seconds_and_recovers() -> None:
    """One agent +500 ms: its share drops within 5 s; once healed it climbs back."""
    pipeline, stats, clock = await setup({"a": 1, "b": 1, "c": 1})
    fast = {"a": 5.0, "b": 5.0, "c": 5.0}
    simulate(pipeline, stats, clock, 5, rate=100, latency=fast)
    slow = {**fast, "c": 505.0}
    simulate(pipeline, stats, clock, 4, rate=100, latency=slow)
    after = simulate(pipeline, stats, clock, 1, rate=100, latency=slow)
    print(f"\nshare of the slow agent in second 5 after it slowed: {after['c'] / 100:.2%}")
    assert after["c"] / 100 < 0.10
    simulate(pipeline, stats, clock, 9, rate=100, latency=fast)
    healed = simulate(pipeline, stats, clock, 1, rate=100, latency=fast)
    print(f"share 10 s after it healed: {healed['c'] / 100:.2%}")
    assert healed["c"] / 100 > 0.28


async def test_failing_agent_loses_share_and_recovers() -> None:
    """An agent that starts failing drops to a trickle within 5 s, and returns once it succeeds."""
    pipeline, stats, clock = await setup({"a": 1, "b": 1})
    latency = {"a": 5.0, "b": 5.0}
    simulate(pipeline, stats, clock, 3, rate=100, latency=latency)
    simulate(pipeline, stats, clock, 4, rate=100, latency=latency, failing={"b"})
    after = simulate(pipeline, stats, clock, 1, rate=100, latency=latency, failing={"b"})
    assert after["b"] / 100 < 0.10
    simulate(pipeline, stats, clock, 14, rate=100, latency=latency)
    healed = simulate(pipeline, stats, clock, 1, rate=100, latency=latency)
    assert healed["b"] / 100 > 0.40


# Through a real Router under load, the slow agent's share is a figure: bench/resilience_drills.py weighted.
