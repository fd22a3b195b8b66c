"""exact_match: weighted rotation and the pipeline's filters."""

from __future__ import annotations

from collections import Counter

import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import NoAvailableHandler
from reachmesh.protocol import AgentProfile, AgentStatusValue, ReachRequest
from reachmesh.registry import MemoryRegistry
from reachmesh.routing import Pipeline
from reachmesh.routing.exact import SmoothWeighted


def test_smooth_weighted_shares_match_weights() -> None:
    """Over many picks each agent leads in proportion to its weight, interleaved."""
    rotation = SmoothWeighted()
    weighted = [("a", 5.0), ("b", 3.0), ("c", 2.0)]
    picks = [weighted[rotation.pick("t", weighted)][0] for _ in range(10_000)]
    shares = Counter(picks)
    assert shares == {"a": 5000, "b": 3000, "c": 2000}
    # Smooth: the heaviest never leads more than its share in a row.
    assert "aaaa" not in "".join(picks[:10])


def test_rotation_prunes_departed_agents() -> None:
    """State for agents that left is dropped, so memory follows the registry."""
    rotation = SmoothWeighted()
    rotation.pick("t", [("a", 1.0), ("b", 1.0), ("c", 1.0)])
    rotation.pick("t", [("a", 1.0)])
    assert set(rotation._tables["t"]) == {"a"}


def agent(agent_id: str, task: str = "echo", weight: float = 1) -> AgentProfile:
    return AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
            "capabilities": [{"task": task, "routing_weight": weight}],
        }
    )


def record() -> DecisionRecord:
    return DecisionRecord(trace_id="t", task="echo", source="-", started=0.0)


@pytest.fixture
async def registry() -> MemoryRegistry:
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=10), clock=ManualClock())
    for agent_id, weight in (("a", 3), ("b", 1), ("c", 1)):
        await registry.register(agent(agent_id, weight=weight))
    return registry


async def test_all_declaring_agents_are_ranked(registry: MemoryRegistry) -> None:
    """Every agent declaring the task is a candidate; the order spreads by weight."""
    pipeline = Pipeline(registry)
    leaders: Counter[str] = Counter()
    for _ in range(500):
        rec = record()
        choices = pipeline.decide(ReachRequest(target_task="echo"), rec)
        assert {c.entry.id for c in choices} == {"a", "b", "c"}
        leaders[choices[0].entry.id] += 1
        assert rec.candidates == ["a", "b", "c"]
    assert leaders == {"a": 300, "b": 100, "c": 100}


async def test_filter_allowlist_and_reasons(registry: MemoryRegistry) -> None:
    """filterAgentIds keeps only the listed agents and records the rest as filtered."""
    rec = record()
    request = ReachRequest.model_validate({"targetTask": "echo", "preferences": {"filterAgentIds": ["b"]}})
    choices = Pipeline(registry).decide(request, rec)
    assert [c.entry.id for c in choices] == ["b"]
    assert {"agentId": "a", "reason": "filtered", "task": "echo"} in rec.rejected


async def test_target_agent(registry: MemoryRegistry) -> None:
    """targetAgent picks only that agent; unknown or incapable targets are refused with reasons."""
    assert [
        c.entry.id
        for c in Pipeline(registry).decide(ReachRequest(target_task="echo", target_agent="c"), record())
    ] == ["c"]
    with pytest.raises(NoAvailableHandler) as info:
        Pipeline(registry).decide(ReachRequest(target_task="echo", target_agent="zz"), record())
    assert info.value.candidates == [{"agentId": "zz", "reason": "unknown_agent"}]
    await registry.register(agent("d", task="other"))
    with pytest.raises(NoAvailableHandler) as info:
        Pipeline(registry).decide(ReachRequest(target_task="echo", target_agent="d"), record())
    assert info.value.candidates == [{"agentId": "d", "reason": "no_capability", "task": "echo"}]


async def test_a_misspelt_target_agent_gets_a_did_you_mean(registry: MemoryRegistry) -> None:
    """An unknown targetAgent spelt like a registered id names it; one like nothing names none."""
    await registry.register(agent("price-query-agent"))
    with pytest.raises(NoAvailableHandler) as info:
        Pipeline(registry).decide(
            ReachRequest(target_task="echo", target_agent="price-qeury-agent"), record()
        )
    assert info.value.message == (
        "targetAgent 'price-qeury-agent' is not registered; did you mean 'price-query-agent'?"
    )
    with pytest.raises(NoAvailableHandler) as info:
        Pipeline(registry).decide(ReachRequest(target_task="echo", target_agent="weather-bot"), record())
    assert info.value.message == "targetAgent 'weather-bot' is not registered"


async def test_status_filters(registry: MemoryRegistry) -> None:
    """Offline agents are out with a reason; suspect agents go last, as a last resort."""
    for agent_id, status in (("a", AgentStatusValue.SUSPECT), ("b", AgentStatusValue.OFFLINE)):
        entry = registry.get(agent_id)
        assert entry is not None
        entry.status = status
    rec = record()
    choices = Pipeline(registry).decide(ReachRequest(target_task="echo"), rec)
    assert [c.entry.id for c in choices] == ["c", "a"]
    assert {"agentId": "b", "reason": "offline", "task": "echo"} in rec.rejected


async def test_unknown_task_has_no_candidates(registry: MemoryRegistry) -> None:
    """A task nobody declares answers NoAvailableHandler with an empty candidate list."""
    with pytest.raises(NoAvailableHandler, match="no agent declares task 'nope'") as info:
        Pipeline(registry).decide(ReachRequest(target_task="nope"), record())
    assert info.value.candidates == []


async def test_identifier_shaped_tasks_route_by_meaning_only_when_asked_or_widened(
    registry: MemoryRegistry,
) -> None:
    """Under semantic_tasks ["*"], a task-name-shaped targetTask nobody declares is not sent
    to the model (so it is refused, never rerouted), free text is; the request's own
    semantic_route or routing.semantic_identifiers widens it."""
    from typing import Any, cast

    from reachmesh.config import RoutingPolicy

    vectors = cast(Any, object())  # wants_semantic only asks whether there is one
    policy = RoutingPolicy(semantic_tasks=["*"])
    pipeline = Pipeline(registry, policy, vectors=vectors)
    assert not pipeline.wants_semantic(ReachRequest(target_task="update_order_address"))
    assert not pipeline.wants_semantic(ReachRequest(target_task="orders.v2/track-order"))
    assert pipeline.wants_semantic(ReachRequest(target_task="change my delivery address"))
    assert pipeline.wants_semantic(ReachRequest(target_task="改地址"))
    asked = ReachRequest.model_validate(
        {"targetTask": "update_order_address", "preferences": {"strategy": "semantic_route"}}
    )
    assert pipeline.wants_semantic(asked)
    # The operator's default strategy is not the caller asking.
    by_default = Pipeline(registry, RoutingPolicy(default_strategy="semantic_route"), vectors=vectors)
    assert not by_default.wants_semantic(ReachRequest(target_task="update_order_address"))
    widened = Pipeline(
        registry, RoutingPolicy(semantic_tasks=["*"], semantic_identifiers=True), vectors=vectors
    )
    assert widened.wants_semantic(ReachRequest(target_task="update_order_address"))


async def test_one_agents_choice_is_made_once_per_registration(registry: MemoryRegistry) -> None:
    """An exact match of one agent made a new Choice (two Python frames) on every call; it is
    now made once per registry entry and shared (nothing changes an exact match's Choice), and
    an agent registered afresh, a new entry, gets a new one: its capability as it declares it now."""
    await registry.register(agent("solo", task="alone", weight=1))
    pipeline = Pipeline(registry)
    first = pipeline.decide(ReachRequest(target_task="alone"), record())
    again = pipeline.decide(ReachRequest(target_task="alone"), record())
    assert [c.entry.id for c in first] == ["solo"] and first is not again
    assert first[0] is again[0]
    assert (first[0].score, first[0].on_decline) == (None, False)
    await registry.register(agent("solo", task="alone", weight=4))
    renewed = pipeline.decide(ReachRequest(target_task="alone"), record())
    assert renewed[0] is not first[0]
    assert renewed[0].entry is registry.get("solo")
    assert renewed[0].capability.routing_weight == 4
