"""Load-aware choice (PROTOCOL §15): room first, the lighter of two equals leads, and weighted
round robin keeps its shares while nobody is full."""

from __future__ import annotations

from collections import Counter

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy, RoutingPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.protocol import AgentProfile, ReachRequest
from reachmesh.registry import MemoryRegistry
from reachmesh.resilience.capacity import CapacityBoard
from reachmesh.routing import Pipeline


def profile(agent_id: str, weight: float = 1, capacity: int | None = None) -> AgentProfile:
    data: dict[str, object] = {
        "id": agent_id,
        "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
        "capabilities": [{"task": "echo", "routing_weight": weight}],
    }
    if capacity is not None:
        data["max_concurrency"] = capacity
    return AgentProfile.model_validate(data)


async def pipeline(*profiles: AgentProfile, strategy: str = "exact_match") -> Pipeline:
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=10), clock=ManualClock())
    for p in profiles:
        await registry.register(p)
    return Pipeline(registry, RoutingPolicy.model_validate({"default_strategy": strategy}))


def first(pipe: Pipeline) -> str:
    request = ReachRequest.model_validate({"targetTask": "echo"})
    return pipe.decide(request, DecisionRecord(trace_id="t", task="echo", source="-", started=0.0))[
        0
    ].entry.id


def occupy(capacity: CapacityBoard, agent_id: str, limit: int | None, n: int) -> None:
    slots = capacity._slots(agent_id, limit)
    slots.inflight += n


async def test_a_full_agent_goes_after_one_with_room() -> None:
    pipe = await pipeline(profile("small", capacity=2), profile("big", capacity=100))
    occupy(pipe.capacity, "small", 2, 2)
    assert {first(pipe) for _ in range(20)} == {"big"}


async def test_of_two_equals_the_one_with_fewer_in_flight_for_its_capacity_leads() -> None:
    """Equal weights, capacities 10 and 100: with 5 and 20 in flight (a half and a fifth full),
    the big one leads every time; idle, the rotation alternates them."""
    pipe = await pipeline(profile("small", capacity=10), profile("big", capacity=100))
    assert Counter(first(pipe) for _ in range(10)) == {"small": 5, "big": 5}
    occupy(pipe.capacity, "small", 10, 5)
    occupy(pipe.capacity, "big", 100, 20)
    assert {first(pipe) for _ in range(20)} == {"big"}


async def test_weighted_round_robin_keeps_its_shares_while_nobody_is_full() -> None:
    pipe = await pipeline(
        profile("a", weight=3, capacity=50),
        profile("b", weight=1, capacity=50),
        strategy="weighted_round_robin",
    )
    occupy(pipe.capacity, "a", 50, 10)  # busy, not full
    assert Counter(first(pipe) for _ in range(400)) == {"a": 300, "b": 100}
