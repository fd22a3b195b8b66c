"""Learned negatives cannot be turned against other callers (issue 36, reproductions 1 and 2).

With auth on: a negative is learned only from a request that let the Router choose, it keeps the
phrase off the one registration that declined, for a TTL, and a task is set aside only while
every live agent of it declined. Declared limits likewise speak for their own agent alone.
"""

from __future__ import annotations

import asyncio

import pytest

from reachmesh.clock import ManualClock
from reachmesh.registry.base import LearnedRoute
from reachmesh.registry.memory import MemoryRegistry
from tests.trust.conftest import (
    ADMIN,
    AGENT_A,
    CALLER_A,
    CALLER_B,
    TRACK,
    bearer,
    learned,
    pricer,
    reach,
    router,
    secured,
    settled,
    sha,
    started,
    stop,
    tracker,
)

PHRASES = ["where is my order", "Where is  MY order", "WHERE IS MY ORDER ", "where  is my Order"]


async def test_a_narrowed_decline_teaches_nothing_and_every_caller_still_reaches_the_task() -> None:
    """Reproduction 1: caller B names only the agent that declines (filterAgentIds); afterwards
    caller A still gets 20 of 20 successes on that phrase, in any case or spacing, from the other
    agent of the task. Before: B's one request left a negative that set the task aside for all."""
    async with router(secured()) as (server, http):
        agents = await started(
            server, AGENT_A, tracker("a-eu-only", mode="decline"), tracker("a-anywhere"), pricer()
        )
        try:
            planted = await reach(
                http, CALLER_B, "where is my order", {"region": "us"}, filterAgentIds=["a-eu-only"]
            )
            assert planted["status"] == "NO_AVAILABLE_HANDLER", planted
            await settled(server)
            assert (await learned(http))["negatives"] == []
            answers = [await reach(http, CALLER_A, PHRASES[i % 4], {"region": "eu"}) for i in range(20)]
            assert [a["status"] for a in answers] == ["SUCCESS"] * 20, answers
            # targetAgent narrows too. (Caller A's own requests may have taught a-eu-only's own
            # negative meanwhile, when it was tried first: that one is caller A's, and legitimate.)
            pinned = await reach(http, CALLER_B, TRACK, {"region": "us"}, targetAgent="a-eu-only")
            assert pinned["status"] == "NO_AVAILABLE_HANDLER", pinned
            await settled(server)
            by_b = [n for n in (await learned(http))["negatives"] if n["by"] == "fp:" + sha(CALLER_B)[:8]]
            assert by_b == []
        finally:
            await stop(agents)


async def test_a_decline_keeps_the_phrase_off_that_registration_alone() -> None:
    """A request that let the Router choose: the decliner's own registration is kept off the
    phrase (with its TTL and the token whose request taught it), the other agent of the task
    takes it directly, and once the decliner registers afresh (fixed, restarted) it is offered
    the phrase again. An admin removes one agent's negative by name."""
    async with router(secured()) as (server, http):
        picky = tracker("a-picky", mode="decline", weight=100)
        agents = await started(server, AGENT_A, picky, tracker("a-taker"), pricer())
        try:
            for _ in range(50):  # bounded: the heavy agent is tried first nearly always
                answer = await reach(http, CALLER_B, "where is my order")
                assert answer["status"] == "SUCCESS", answer
                if picky.received:
                    break
            assert picky.received, "the weight-100 agent was never tried"
            await settled(server)
            (negative,) = (await learned(http))["negatives"]
            assert (negative["task"], negative["agent"], negative["applies"]) == (TRACK, "a-picky", True)
            assert negative["by"].startswith("fp:")  # caller B's token, by fingerprint
            assert "expires" in negative
            tried = len(picky.received)
            for _ in range(5):
                answer = await reach(http, CALLER_A, "Where is my ORDER")
                assert [a["agentId"] for a in answer["attempts"]] == ["a-taker"], answer
            assert len(picky.received) == tried
            picky.mode = "ok"  # fixed, and registered afresh: a new lease
            await picky.register(server.url, token=AGENT_A, admin_token=ADMIN)
            (negative,) = (await learned(http))["negatives"]
            assert negative["applies"] is False
            for _ in range(50):
                await reach(http, CALLER_A, "where is my order")
                if len(picky.received) > tried:
                    break
            assert len(picky.received) > tried, "the agent registered afresh was never offered the phrase"
            gone = await http.delete(
                "/admin/learned/negatives",
                params={"phrase": "where is my order", "task": TRACK, "agent": "a-picky"},
                headers=bearer(ADMIN),
            )
            assert gone.status_code == 204
        finally:
            await stop(agents)


async def test_a_task_is_set_aside_only_when_every_live_agent_of_it_declined() -> None:
    """Both agents of the task decline: the phrase then refuses at once by meaning, naming the
    task as declined before, and reaches no agent."""
    async with router(secured()) as (server, http):
        one, two = tracker("a-one", mode="decline"), tracker("a-two", mode="decline")
        agents = await started(server, AGENT_A, one, two, pricer())
        try:
            first = await reach(http, CALLER_B, "where is my order")
            assert first["status"] == "NO_AVAILABLE_HANDLER", first
            await settled(server)
            assert {n["agent"] for n in (await learned(http))["negatives"]} == {"a-one", "a-two"}
            sent = len(one.received) + len(two.received)
            again = await reach(http, CALLER_B, "where is my order")
            assert again["status"] == "NO_AVAILABLE_HANDLER"
            reasons = {
                c["agentId"]: c["reason"] for c in again["error"]["candidates"] if c.get("task") == TRACK
            }
            assert reasons == {"a-one": "declined", "a-two": "declined"}, again
            assert len(one.received) + len(two.received) == sent
        finally:
            await stop(agents)


async def test_a_negative_expires_after_its_ttl() -> None:
    """routing.learning.negative_ttl_seconds: after it, the decliner is offered the phrase again."""
    config = secured(routing={"semantic_tasks": ["*"], "learning": {"negative_ttl_seconds": 1}})
    async with router(config) as (server, http):
        picky = tracker("a-picky", mode="decline", weight=100)
        agents = await started(server, AGENT_A, picky, tracker("a-taker"), pricer())
        try:
            for _ in range(400):  # bounded by count; each round is one request (no sleeping)
                await reach(http, CALLER_B, "where is my order")
                if len(picky.received) >= 2:
                    break
                await asyncio.sleep(0.02)
            # Tried again although it declined before: only the TTL lets it be.
            assert len(picky.received) >= 2
        finally:
            await stop(agents)


async def test_negatives_are_quoted_per_token_and_one_token_never_evicts_anothers() -> None:
    """routing.learning.negatives_per_token: past it, the token's own oldest go first."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)

    def negative(phrase: str, by: str) -> LearnedRoute:
        clock.advance(1)
        return LearnedRoute(phrase, TRACK, "decline", clock.time(), agent="a-one", by=by)

    await registry.remember_negative(negative("kept", "fp:a"), limit=100, quota=2)
    for i in range(5):
        await registry.remember_negative(negative(f"flood {i}", "fp:b"), limit=100, quota=2)
    assert sorted(k[0] for k in registry.negatives()) == ["flood 3", "flood 4", "kept"]
    # The global bound still holds, oldest first, whoever's.
    await registry.remember_negative(negative("last", "fp:c"), limit=3, quota=2)
    assert sorted(k[0] for k in registry.negatives()) == ["flood 3", "flood 4", "last"]


@pytest.mark.parametrize("offline", [False, True])
async def test_one_agents_limits_set_aside_that_agent_alone_and_never_after_its_lease(offline: bool) -> None:
    """Reproduction 2: one agent of the task declares "cancel or change an order" as a limit, the
    other declares none: "cancel my order" goes to the other, by meaning. With the limited agent
    offline (its lease run out, in the grace period) its limits no longer count either. Before:
    one agent's limits set the whole task aside, and kept doing so offline."""
    async with router(secured()) as (server, http):
        limited = tracker("a-limited", limits={TRACK: ["cancel or change an order", "取消或修改订单"]})
        agents = await started(server, AGENT_A, limited, tracker("a-plain"), pricer())
        try:
            if offline:
                registry = server.app.parts.registry
                entry = registry.get("a-limited")
                assert entry is not None
                registry.snapshot.go_offline(entry, server.app.parts.clock.monotonic())
            for _ in range(6):
                answer = await reach(http, CALLER_A, "cancel my order")
                assert answer["status"] == "SUCCESS", answer
                assert [a["agentId"] for a in answer["attempts"]] == ["a-plain"], answer
            assert not limited.received
        finally:
            await stop(agents)


async def test_learned_routes_are_quoted_per_token_too() -> None:
    """routing.learning.phrases_per_token: a caller flooding confirmations loses its own oldest;
    another caller's route, and the route's owner scope, stay (a record round trip keeps both)."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)

    def route(phrase: str, owner: str) -> LearnedRoute:
        clock.advance(1)
        return LearnedRoute(phrase, "t", "caller", clock.time(), owner=owner, by=owner)

    await registry.remember(route("mine", "fp:a"), limit=100, quota=2)
    for i in range(5):
        await registry.remember(route(f"flood {i}", "fp:b"), limit=100, quota=2)
    assert sorted(r.phrase for r in registry.learned().values()) == ["flood 3", "flood 4", "mine"]
    kept = registry.learned()["fp:a\nmine"]
    assert LearnedRoute.from_json(kept.to_json()) == kept
    assert await registry.forget("MINE", "fp:a") and not await registry.forget("mine")
