"""The embedding queue takes turns per token, then per agent (issue 36, reproduction 5).

Twelve maximum-size profiles from one agent token must not hold up a newcomer from another token:
its vectors are in after one batch of the other token's, not after one batch of each of its
agents (86 s against 1 s in the reproduction, with a real model)."""

from __future__ import annotations

import asyncio

import numpy as np

from reachmesh.exceptions import EmbeddingError
from reachmesh.protocol import AgentProfile
from reachmesh.registry.base import AgentEntry
from reachmesh.semantic.index import Vector
from reachmesh.semantic.queue import BATCH, EmbeddingQueue, Job


def entry(agent_id: str, holder: str | None) -> AgentEntry:
    profile = AgentProfile.model_validate(
        {"id": agent_id, "network": {"endpoint": "http://127.0.0.1:9/reach"}, "capabilities": [{"task": "t"}]}
    )
    return AgentEntry(profile, "lease-" + agent_id, 30, 0.0, 0.0, 30.0, holder=holder)


async def run_until_done(queue: EmbeddingQueue, wanted: str, calls: list[list[str]]) -> int:
    """Serve the queue until ``wanted``'s job is finished; the model calls made by then."""
    done = asyncio.Event()
    made: list[int] = []

    def finished(job: Job) -> None:
        if job.entry.id == wanted:
            made.append(len(calls))  # counted now: the worker goes on while the test wakes
            done.set()

    def failed(job: Job, exc: EmbeddingError) -> None:
        raise AssertionError(exc)

    worker = asyncio.create_task(queue.run(finished, failed))
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        worker.cancel()
    return made[0]


async def test_one_tokens_many_profiles_delay_another_tokens_agent_by_one_batch() -> None:
    calls: list[list[str]] = []

    async def embed(texts: list[str]) -> Vector:
        calls.append(texts)
        await asyncio.sleep(0)
        return np.zeros((len(texts), 4), dtype=np.float32)

    queue = EmbeddingQueue(embed, lambda e: True)
    for i in range(12):  # twelve big profiles from one token: ten batches each
        big = entry(f"bulk-{i}", "fp:bulk")
        queue.put(Job(big, [("t", f"text {i} {n}") for n in range(BATCH * 10)]))
    newcomer = entry("newcomer", "fp:new")
    queue.put(Job(newcomer, [("t", "where is my order")]))
    # Before: the newcomer waited for a batch of each of the twelve (13 calls).
    assert await run_until_done(queue, "newcomer", calls) <= 2
    assert ["where is my order"] in calls


async def test_within_one_token_its_agents_still_take_turns() -> None:
    calls: list[list[str]] = []

    async def embed(texts: list[str]) -> Vector:
        calls.append(texts)
        await asyncio.sleep(0)
        return np.zeros((len(texts), 4), dtype=np.float32)

    queue = EmbeddingQueue(embed, lambda e: True)
    queue.put(Job(entry("big", "fp:one"), [("t", f"text {n}") for n in range(BATCH * 10)]))
    queue.put(Job(entry("small", "fp:one"), [("t", "small one")]))
    assert await run_until_done(queue, "small", calls) <= 2
