"""An unknown task's refusal suggests the declared tasks nearest by spelling, within a bound.

The spelling search compares the caller's name with every declared task; two long names of few
letters cost about 2 ms a comparison. Forty agents declaring 64 such tasks each (well within
every registration bound) made one refused name hold the Router's loop 5.8 s, `/healthz` with
it, and any caller could send such a name. The search now runs in short slices within a budget
per refusal and a share of a core for all refusals (dispatch/suggest.py).
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from reachmesh.config import RouterConfig
from reachmesh.dispatch.suggest import SPELLING_BUDGET_S, Suggester
from reachmesh.protocol import AgentProfile
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.testing import ManualClock, RouterServer
from tests.helpers import scaled

AGENTS, TASKS_EACH, LETTERS = 40, 64, 128


def few_letter_tasks(rnd: random.Random) -> list[dict[str, str]]:
    return [{"task": "".join(rnd.choice("ab") for _ in range(LETTERS))} for _ in range(TASKS_EACH)]


async def register_few_letter_agents(http: httpx.AsyncClient, dead_port: int) -> None:
    rnd = random.Random(57)
    for i in range(AGENTS):
        profile = {
            "id": f"few-letters-{i}",
            "network": {"endpoint": f"http://127.0.0.1:{dead_port}/reach"},
            "capabilities": few_letter_tasks(rnd),
        }
        assert (await http.post("/agents", json=profile)).status_code in (200, 201)


async def test_a_refused_name_does_not_hold_the_loop_against_many_long_tasks() -> None:
    config = RouterConfig.from_mapping({"health": {"enabled": False}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=60) as http:
        await register_few_letter_agents(http, router.port)
        started = time.perf_counter()
        refusal = asyncio.ensure_future(http.post("/reach", json={"targetTask": "ab" * (LETTERS // 2)}))
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as other:
            health = await other.get("/healthz")
            health_s = time.perf_counter() - started
            answer = await refusal
        refusal_s = time.perf_counter() - started
        assert health.status_code == 200
        body = answer.json()
        assert (answer.status_code, body["status"]) == (503, "NO_AVAILABLE_HANDLER"), body
        # Before: 5.8 s for both on a quiet machine. Now the refusal spends its budget (50 ms).
        assert health_s < scaled(0.5), f"/healthz waited {health_s:.2f} s behind a refused name"
        assert refusal_s < scaled(1.0), f"the refusal took {refusal_s:.2f} s"


async def test_refusals_share_a_bounded_part_of_a_core() -> None:
    """Once the refusals' share is spent, a refusal suggests nothing until the clock refills it,
    and what every refusal spends in all is bounded by the share, not by how many there are."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)
    suggester = Suggester(registry, None, clock)
    rnd = random.Random(57)
    for i in range(AGENTS):
        profile = {
            "id": f"few-letters-{i}",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": few_letter_tasks(rnd),
        }
        await registry.register(AgentProfile.model_validate(profile))
    started = time.perf_counter()
    for _ in range(20):
        await suggester.nearest("ab" * (LETTERS // 2))
    spent = time.perf_counter() - started
    # The budget and one slice's overrun (one comparison of long names, a few ms), not 20 scans.
    assert spent < scaled(SPELLING_BUDGET_S + 0.1), f"20 refusals spent {spent:.2f} s"
    await registry.register(
        AgentProfile.model_validate(
            {
                "id": "typo",
                "network": {"endpoint": "http://127.0.0.1:9/reach"},
                "capabilities": [{"task": "zz"}],
            }
        )
    )
    assert (await suggester.nearest("zzz"))[0] == []  # the share is spent: nothing suggested
    clock.advance(10)
    found, _ = await suggester.nearest("zzz")
    assert {"task": "zz", "by": "spelling"} in found
