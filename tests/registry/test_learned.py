"""Learned routes in the in-memory registry, and the learner that pairs refusals with retries."""

from __future__ import annotations

import asyncio

from reachmesh.clock import ManualClock
from reachmesh.config import LearningPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.dispatch.learning import RouteLearner
from reachmesh.protocol import Status
from reachmesh.registry.base import LearnedRoute, normalize_phrase
from reachmesh.registry.memory import MemoryRegistry


def test_phrases_are_matched_normalized() -> None:
    """Width, case and runs of whitespace do not make another phrase."""
    assert normalize_phrase("  Where is\tMY  parcel ") == "where is my parcel"
    assert normalize_phrase("ＡＢＣ　１２３") == "abc 123"


async def test_the_registry_keeps_at_most_the_limit_oldest_out() -> None:
    """Past the limit the oldest confirmations go, and listeners hear each arrival and departure."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)
    heard: list[tuple[str, LearnedRoute | None]] = []
    registry.subscribe_learned(lambda key, route: heard.append((key, route)))
    for i in range(5):
        await registry.remember(LearnedRoute(f"Phrase {i}", "t", "operator", clock.time()), limit=3)
        clock.advance(1)
    assert list(registry.learned()) == ["phrase 2", "phrase 3", "phrase 4"]
    assert [key for key, route in heard if route is None] == ["phrase 0", "phrase 1"]
    # Confirmed again: the newest once more, so the next eviction takes another.
    await registry.remember(LearnedRoute("phrase 2", "u", "caller", clock.time()), limit=3)
    clock.advance(1)
    await registry.remember(LearnedRoute("phrase 5", "t", "caller", clock.time()), limit=3)
    assert set(registry.learned()) == {"phrase 2", "phrase 4", "phrase 5"}
    assert registry.learned()["phrase 2"].task == "u"
    assert await registry.forget("PHRASE   2")
    assert not await registry.forget("phrase 2")


def _record(
    status: Status,
    *,
    task: str,
    caller: str = "k1",
    refused: bool = False,
    source: str = "-",
    conversation_id: str | None = None,
) -> DecisionRecord:
    """A finished decision record as the dispatcher leaves it for observers."""
    record = DecisionRecord(
        trace_id="t", task=task, source=source, started=0.0, caller=caller, conversation_id=conversation_id
    )
    record.status = status
    record.semantic_refused = refused
    if status is Status.SUCCESS:
        record.rule = "exact_match"
        record.matched_task = task
    return record


async def test_a_retry_after_the_window_teaches_nothing() -> None:
    """A success later than window_seconds after the refusal is not a confirmation of it."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)
    learner = RouteLearner(registry, LearningPolicy(enabled=True, window_seconds=120), clock=clock)
    learner(_record(Status.NO_AVAILABLE_HANDLER, task="where is my stuff", refused=True, conversation_id="c"))
    clock.advance(120.5)
    learner(_record(Status.SUCCESS, task="track_parcel", conversation_id="c"))
    await learner.close()
    assert learner.learned == 0 and not registry.learned()


async def test_only_the_same_caller_in_the_same_thread_confirms() -> None:
    """Another principal, another sourceAgent, or no thread at all: nothing; the same one: learned."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)
    learner = RouteLearner(registry, LearningPolicy(enabled=True), clock=clock)
    learner(_record(Status.NO_AVAILABLE_HANDLER, task="where is my stuff", refused=True, source="bot-a"))
    learner(_record(Status.NO_AVAILABLE_HANDLER, task="no thread", refused=True))
    learner(_record(Status.SUCCESS, task="track_parcel", caller="k2", source="bot-a"))
    learner(_record(Status.SUCCESS, task="track_parcel", source="bot-b"))
    learner(_record(Status.SUCCESS, task="track_parcel"))
    learner(_record(Status.AGENT_ERROR, task="track_parcel", source="bot-a"))
    assert len(learner._background) == 0  # nothing was confirmed so far
    learner(_record(Status.SUCCESS, task="track_parcel", source="bot-a"))
    for _ in range(100):  # the registry write runs in the background: let it finish
        if not len(learner._background):
            break
        await asyncio.sleep(0)
    await learner.close()
    assert [(r.phrase, r.task, r.source) for r in registry.learned().values()] == [
        ("where is my stuff", "track_parcel", "caller")
    ]


async def test_learning_off_learns_nothing() -> None:
    """With routing.learning.enabled false (the default) the learner ignores every record."""
    registry = MemoryRegistry()
    learner = RouteLearner(registry, LearningPolicy(), clock=ManualClock())
    learner(_record(Status.NO_AVAILABLE_HANDLER, task="p", refused=True, source="a"))
    learner(_record(Status.SUCCESS, task="t", source="a"))
    assert len(learner._background) == 0
    await learner.close()
