"""Declines have a cost (issue 36, reproduction 3), with auth on.

A late decline is a failure of the decliner (breaker and merit), and its time is given back so
the next agent gets its own attempt; every decline after the first spends a retry-budget token;
declines past ``declines.free_in_a_row`` count as failures.
"""

from __future__ import annotations

import httpx

from reachmesh.testing import FakeAgent
from tests.helpers import scaled
from tests.trust.conftest import ADMIN, AGENT_A, CALLER_A, bearer, reach, router, secured, started, stop

ECHO = "a_echo"


async def agent_status(http: httpx.AsyncClient, agent_id: str) -> dict:
    status: dict = (await http.get(f"/admin/agents/{agent_id}", headers=bearer(ADMIN))).json()
    return status


async def test_a_late_decline_is_the_decliners_failure_and_never_the_next_agents() -> None:
    """Reproduction 3, first and third: an agent declines after most of the deadline. The honest
    agent then times out in what is left (the caller's timeoutMs bounds the whole request), but
    that timeout is not charged to it; the decliner's stats count its attempts as failures and
    its breaker opens: from then on the honest agent is called first and every call succeeds.
    Before: the honest agent's own breaker opened, the decliner's stayed closed with
    ``requests: 0``."""
    timeout_ms = int(scaled(1.0) * 1000)
    # The decliner stays ejected for the whole test: a half-open probe would start it over.
    async with router(secured(semantic=False, breaker={"open_seconds": 600})) as (server, http):
        stall = FakeAgent("a-stall", tasks=(ECHO,), mode="decline", delay_s=scaled(0.7), weight=100)
        honest = FakeAgent("a-honest", tasks=(ECHO,), delay_s=scaled(0.4))
        agents = await started(server, AGENT_A, stall, honest)
        try:
            answers = [await reach(http, CALLER_A, ECHO, timeoutMs=timeout_ms) for _ in range(10)]
            assert {a["status"] for a in answers} <= {"SUCCESS", "TIMEOUT"}, answers
            assert all(a["durationMs"] < timeout_ms + scaled(0.5) * 1000 for a in answers)
            assert [a["status"] for a in answers[-3:]] == ["SUCCESS"] * 3, answers
            assert {a["handlerAgentId"] for a in answers if a["status"] == "SUCCESS"} == {"a-honest"}
            honest_status, stall_status = (
                await agent_status(http, "a-honest"),
                await agent_status(http, "a-stall"),
            )
            assert honest_status["circuit"] == "closed"
            assert honest_status["stats"]["successRate"] == 1.0
            assert stall_status["stats"]["requests"] >= 5
            assert stall_status["stats"]["successRate"] == 0.0
            assert stall_status["circuit"] == "open"
            # Ejected: the last calls went to the honest agent alone, without waiting on the decliner.
            assert [a["agentId"] for a in answers[-1]["attempts"]] == ["a-honest"]
        finally:
            await stop(agents)


async def test_declines_after_the_first_spend_the_retry_budget() -> None:
    """Reproduction 3, second: eight decliners at weight 100 beside one honest agent. With a
    small retry budget (8 tokens over the test), a request stops failing over from decliner to
    decliner once the budget is spent: two calls per request (the second decline is the first
    that costs) and the budget's 8 more. Before: 8 POSTs for every request, whatever the budget."""
    config = secured(semantic=False, retry_budget={"ratio": 0.1, "min_per_second": 0.1, "window_seconds": 60})
    async with router(config) as (server, http):
        decliners = [FakeAgent(f"a-no-{i}", tasks=(ECHO,), mode="decline", weight=100) for i in range(8)]
        honest = FakeAgent("a-honest", tasks=(ECHO,))
        agents = await started(server, AGENT_A, *decliners, honest)
        try:
            for _ in range(20):
                await reach(http, CALLER_A, ECHO)
            posts = sum(len(a.received) for a in agents)
            assert posts <= 20 * 2 + 8, posts
        finally:
            await stop(agents)


async def test_repeated_declines_count_against_the_decliner() -> None:
    """Past ``declines.free_in_a_row`` declines in a row (10 by default), each is a failure:
    eight decliners at weight 100 trip their breakers in turn and the honest agent, at weight 1,
    takes the calls. Before: 199 of 200 calls ended NO_AVAILABLE_HANDLER."""
    async with router(secured(semantic=False)) as (server, http):
        decliners = [FakeAgent(f"a-no-{i}", tasks=(ECHO,), mode="decline", weight=100) for i in range(8)]
        honest = FakeAgent("a-honest", tasks=(ECHO,))
        agents = await started(server, AGENT_A, *decliners, honest)
        try:
            answers = [await reach(http, CALLER_A, ECHO) for _ in range(80)]
            tail = [a["status"] for a in answers[-20:]]
            assert tail == ["SUCCESS"] * 20, answers[-1]
            opened = [(await agent_status(http, d.agent_id))["circuit"] for d in decliners]
            assert opened.count("closed") == 0, opened
        finally:
            await stop(agents)
