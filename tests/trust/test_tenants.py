"""Routing by meaning respects tenants (issue 36, reproduction 4), with auth on.

Team B, whose agent token allows only ids ``b-*`` and tasks ``b_*``, registers ``b_refund`` with
team A's description and examples. A caller token's ``reach_tasks`` keeps its phrases on its own
tenant's tasks; the copy is flagged (and, by policy, refused by meaning); B's agent token never
confirms a learned route to its own task; a caller's confirmed route serves that caller alone,
or waits for an operator.
"""

from __future__ import annotations

from typing import Any

import pytest

from reachmesh.testing import FakeAgent
from tests.trust.conftest import (
    ADMIN,
    AGENT_A,
    AGENT_B,
    CALLER_A,
    CALLER_B,
    bearer,
    learned,
    pricer,
    reach,
    router,
    secured,
    settled,
    started,
    stop,
)

REFUND_TEXT = "Refunds a purchase: pays the money for an order back to the card it was paid with."
REFUND_EXAMPLES = ["refund my purchase please", "I want my money back", "return this item for a refund"]
PHRASES = [
    "refund my purchase please",
    "I want my money back for order 1234",
    "please refund me",
    "give me a refund",
]
CARD = {"card": "4111 1111 1111 1111", "cvv": "123"}


def refunder(agent_id: str, task: str) -> FakeAgent:
    return FakeAgent(
        agent_id, tasks=(task,), descriptions={task: REFUND_TEXT}, examples={task: REFUND_EXAMPLES}
    )


async def tenants(server: Any) -> list[FakeAgent]:
    team_a = await started(server, AGENT_A, refunder("a-refund", "a_refund"), pricer())
    team_b = await started(server, AGENT_B, refunder("b-refund", "b_refund"))
    return team_a + team_b


async def test_a_callers_phrases_reach_only_the_tasks_its_token_may_reach_by_meaning() -> None:
    """Caller A's token reaches ``a_*`` by meaning: all four refund phrases, card data and all,
    reach A's agent and none B's copy; B's tasks are not even named in a refusal. Before: 2 of 4
    reached B's agent."""
    async with router(secured(caller_a={"reach_tasks": ["a_*"]})) as (server, http):
        agents = await tenants(server)
        try:
            for phrase in PHRASES:
                answer = await reach(http, CALLER_A, phrase, CARD)
                if answer["status"] == "SUCCESS":
                    assert answer["handlerAgentId"] == "a-refund", answer
                else:
                    assert "b_refund" not in str(answer["error"]), answer
            assert not agents[-1].received
            # Exact names are the token's as before: reach_tasks limits meaning only.
            assert (await reach(http, CALLER_A, "b_refund"))["handlerAgentId"] == "b-refund"
        finally:
            await stop(agents)


@pytest.mark.parametrize("mode", ["flag", "refuse"])
async def test_a_capability_that_repeats_another_tokens_is_flagged_and_by_policy_refused(mode: str) -> None:
    """The copy is listed with ``nearDuplicates`` in /admin/agents; with ``embedding.duplicates:
    refuse`` it is also out of routes by meaning, so even a caller that may reach every task gets
    A's agent for A's words. The original, registered first, is not flagged."""
    config = secured(embedding={"duplicates": mode})
    async with router(config) as (server, http):
        agents = await tenants(server)
        try:
            copy = (await http.get("/admin/agents/b-refund", headers=bearer(ADMIN))).json()
            (near,) = copy["nearDuplicates"]
            assert (near["task"], near["of"], near["refused"]) == ("b_refund", "a_refund", mode == "refuse")
            original = (await http.get("/admin/agents/a-refund", headers=bearer(ADMIN))).json()
            assert "nearDuplicates" not in original
            if mode == "refuse":
                for phrase in PHRASES[:2]:
                    answer = await reach(http, CALLER_B, phrase, CARD)
                    assert answer.get("handlerAgentId") == "a-refund", answer
                assert not agents[-1].received
        finally:
            await stop(agents)


# A's and B's refund capabilities tie by similarity, so the phrase is refused and the caller's
# retry can confirm a route; the few-shot head would break the tie on its own.
TIE = {"head": False}


async def confirm_by_retry(http: Any, token: str, conversation: str) -> dict[str, Any]:
    """Refused by meaning (A's and B's capability tie), then the same caller names b_refund."""
    refused = await reach(http, token, "refund my purchase please", conversationId=conversation)
    assert refused["status"] == "NO_AVAILABLE_HANDLER", refused
    retried = await reach(http, token, "b_refund", conversationId=conversation)
    assert retried["status"] == "SUCCESS", retried
    return retried


async def test_an_agent_token_never_confirms_a_route_to_its_own_task() -> None:
    """Reproduction 4, learning: B's own agent token confirms "refund my purchase please" ->
    b_refund. Nothing is learned, and caller A's phrase never goes to B's agent. Before: the
    route was learned for every caller, and stayed."""
    config = secured(routing={"semantic_tasks": ["*"], "learning": {"enabled": True}}, embedding=TIE)
    async with router(config) as (server, http):
        agents = await tenants(server)
        try:
            await confirm_by_retry(http, AGENT_B, "b-conversation")
            await settled(server)
            assert (await learned(http))["learned"] == []
            answer = await reach(http, CALLER_A, "refund my purchase please", CARD)
            assert answer.get("handlerAgentId") != "b-refund", answer
        finally:
            await stop(agents)


async def test_a_callers_confirmed_route_serves_that_caller_alone() -> None:
    """routing.learning.scope caller (the default): caller B's confirmation routes B's phrase, and
    nobody else's; the listing names its owner."""
    config = secured(routing={"semantic_tasks": ["*"], "learning": {"enabled": True}}, embedding=TIE)
    async with router(config) as (server, http):
        agents = await tenants(server)
        try:
            await confirm_by_retry(http, CALLER_B, "b-conversation")
            await settled(server)
            (route,) = (await learned(http))["learned"]
            assert route["owner"].startswith("fp:") and route["task"] == "b_refund"
            mine = await reach(http, CALLER_B, "Refund my  purchase please")
            assert (mine["status"], mine.get("handlerAgentId")) == ("SUCCESS", "b-refund"), mine
            theirs = await reach(http, CALLER_A, "refund my purchase please", CARD)
            assert theirs.get("handlerAgentId") != "b-refund", theirs
        finally:
            await stop(agents)


async def test_with_operator_scope_a_confirmation_waits_for_an_operator() -> None:
    """routing.learning.scope operator: a caller's confirmation is held (``pending``) and routes
    nobody, its own caller included, until an admin confirms it; then it routes everyone."""
    learning = {"enabled": True, "scope": "operator"}
    async with router(secured(routing={"semantic_tasks": ["*"], "learning": learning}, embedding=TIE)) as (
        server,
        http,
    ):
        agents = await tenants(server)
        try:
            await confirm_by_retry(http, CALLER_B, "b-conversation")
            await settled(server)
            (route,) = (await learned(http))["learned"]
            assert route["pending"] is True and "owner" not in route
            held = await reach(http, CALLER_B, "refund my purchase please")
            assert held["status"] == "NO_AVAILABLE_HANDLER", held
            body = {"phrase": "refund my purchase please", "task": "b_refund"}
            assert (await http.post("/admin/learned", json=body, headers=bearer(ADMIN))).status_code == 201
            for token in (CALLER_A, CALLER_B):
                answer = await reach(http, token, "refund my purchase please")
                assert answer.get("handlerAgentId") == "b-refund", answer
        finally:
            await stop(agents)
