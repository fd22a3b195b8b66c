"""The embedding work of registrations: off the request path, bounded, and fair.

A registration answers at once; its capability texts wait here. One worker embeds them a few at a
time, taking turns first between tokens (the agent token that registered, ``AgentEntry.holder``)
and then between that token's agents, so the profiles of one token, however many and however
long, delay another token's agent by one batch per turn at most, and never a registration or a question
(queries have their own lane in the embedder). The agent is routable by its exact task names at
once, and by meaning as soon as its vectors are in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from reachmesh.exceptions import EmbeddingError
from reachmesh.registry.base import AgentEntry
from reachmesh.semantic.index import Vector

log = logging.getLogger("reachmesh.semantic")

# Texts per model call: small enough that a turn is short, big enough to batch well.
BATCH = 8


class VectorState(StrEnum):
    """Where an agent's capability vectors stand (``vectors`` in ``GET /admin/agents``)."""

    PENDING = "pending"  # queued or being embedded: routable by exact task only
    READY = "ready"  # routable by meaning too
    UNAVAILABLE = "unavailable"  # the embedder failed; retried in the background


@dataclass
class Job:
    """One registration's texts still to embed, and the vectors embedded so far."""

    entry: AgentEntry
    texts: list[tuple[str, str]]  # (task, text) pairs not yet in the index
    done: list[Vector] = field(default_factory=list)
    taken: int = 0

    def next_batch(self) -> list[str]:
        return [text for _, text in self.texts[self.taken : self.taken + BATCH]]

    def got(self, vectors: Vector) -> None:
        self.done.append(vectors)
        self.taken += len(vectors)

    @property
    def finished(self) -> bool:
        return self.taken >= len(self.texts)

    def vectors(self) -> Vector | None:
        return np.concatenate(self.done) if self.done else None


Embed = Callable[[list[str]], Awaitable[Vector]]


class EmbeddingQueue:
    """Jobs by agent, served one batch at a time by :meth:`run`: round robin between the tokens
    that registered them, and between each token's agents."""

    def __init__(self, embed: Embed, is_current: Callable[[AgentEntry], bool]) -> None:
        self._embed = embed
        self._is_current = is_current
        self._jobs: dict[str, Job] = {}
        self._turns: deque[str] = deque()  # tokens with agents waiting, in turn
        self._waiting: dict[str, deque[str]] = {}  # token -> its agents, in turn
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._jobs

    def put(self, job: Job) -> None:
        """Queue ``job``, replacing any older job of the same agent."""
        if job.entry.id not in self._jobs:
            self._queue(_token(job.entry), job.entry.id)
        self._jobs[job.entry.id] = job
        self._wake.set()

    def _queue(self, token: str, agent_id: str) -> None:
        waiting = self._waiting.get(token)
        if waiting is None:
            waiting = self._waiting[token] = deque()
            self._turns.append(token)
        waiting.append(agent_id)

    def drop(self, agent_id: str) -> None:
        self._jobs.pop(agent_id, None)

    async def run(
        self, finished: Callable[[Job], None], failed: Callable[[Job, EmbeddingError], None]
    ) -> None:
        """Serve jobs forever: ``finished(job)`` when its texts are in, ``failed`` on an error."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._turns:
                await self._turn(finished, failed)

    async def _turn(
        self, finished: Callable[[Job], None], failed: Callable[[Job, EmbeddingError], None]
    ) -> None:
        token = self._turns.popleft()
        waiting = self._waiting[token]
        agent_id = waiting.popleft()
        if waiting:
            self._turns.append(token)  # the token's next agent, at the token's next turn
        else:
            del self._waiting[token]
        job = self._jobs.get(agent_id)
        if job is None or not self._is_current(job.entry):
            self._jobs.pop(agent_id, None)
            return
        if not job.finished:
            try:
                job.got(await self._embed(job.next_batch()))
            except EmbeddingError as exc:
                self._jobs.pop(agent_id, None)
                failed(job, exc)
                return
            except Exception as exc:
                # An embedder's bug must not end this loop for good: the job fails like any
                # embedding failure (and is retried), and the traceback is logged once here.
                log.exception("embedding %s failed unexpectedly", agent_id)
                self._jobs.pop(agent_id, None)
                failed(job, EmbeddingError(f"the embedder failed: {type(exc).__name__}"))
                return
        if self._jobs.get(agent_id) is not job:
            return  # replaced or dropped while its batch was embedded
        if job.finished:
            del self._jobs[agent_id]
            finished(job)
        else:
            self._queue(token, agent_id)


def _token(entry: AgentEntry) -> str:
    """Who takes turns for ``entry``: the token that registered it ("-" while auth is off)."""
    return entry.holder or "-"
