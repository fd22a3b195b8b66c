"""The few-shot head's own rows: each capability text embedded a second time, as a query.

Similarity scores a request (embedded as a query) against capability texts embedded as passages,
as e5 is meant to be used. The head is a classifier, and it classifies better among vectors of
the request's own kind: trained on the same texts embedded as queries it chose right far more
often on Banking77's validation phrases (docs/semantic-eval.md). So every capability text is
embedded twice: as a passage at registration (routable by meaning once that is in), and then as
a query, here, in the background.

These embeddings are work no caller waits for: they go through a queue of their own (the same
fair, batched :class:`EmbeddingQueue` as registrations), after the agent is already routable,
and on the embedder's background lane when it has one (the bundled model's passage lane), so a
caller's question never queues behind them. On that lane they take turns with registrations'
passage rows, a batch each: a burst of registrations becomes routable at most about twice as
slowly, while a lane of their own would cost another copy of the model's weights.

The head is retrained once every task it covers has all its query rows
(:func:`reachmesh.semantic.head.query_rows`); until then the previous head routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from reachmesh.exceptions import EmbeddingError
from reachmesh.registry.base import AgentEntry
from reachmesh.semantic.embedders.base import Embedder
from reachmesh.semantic.index import SemanticIndex, Vector
from reachmesh.semantic.queue import EmbeddingQueue, Job


class HeadRows:
    """Query-kind vectors of the capability texts, kept beside the passage rows of ``index``
    (a head row is indexed only while its passage row is), for the head to train on."""

    def __init__(
        self,
        embedder: Embedder,
        index: SemanticIndex,
        rows_of: Callable[[AgentEntry], list[tuple[str, str]]],
        is_current: Callable[[AgentEntry], bool],
        on_change: Callable[[], None],
        on_failure: Callable[[EmbeddingError], None],
        on_success: Callable[[], None] = lambda: None,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.rows = SemanticIndex(dim=index.dim)
        self.queue = EmbeddingQueue(self.embed, is_current)
        self._rows_of = rows_of  # an entry's (task, text) capability rows, limits excluded
        self._is_current = is_current
        self._on_change = on_change
        self._on_failure = on_failure  # the embedder failed (it is reported down) ...
        self._on_success = on_success  # ... and answered again
        self._failed: dict[str, AgentEntry] = {}

    @property
    def generation(self) -> int:
        return self.rows.generation

    def pending(self) -> int:
        """Agents whose query rows are not in yet (queued, or failed and to be retried)."""
        return len(self.queue) + len(self._failed)

    async def embed(self, texts: list[str]) -> Vector:
        """``texts`` as queries, on the embedder's background lane when it has one."""
        background = getattr(self.embedder, "embed_in_background", None)
        if background is not None:
            vectors: Vector = await background(texts, "query")
        else:
            vectors = await self.embedder.embed(texts, "query")
        self._on_success()
        return vectors

    def schedule(self, entry: AgentEntry) -> None:
        """Embed as queries the rows of ``entry`` that have a passage row and no query row yet;
        the rows other agents brought are shared, as passage rows are."""
        self._failed.pop(entry.id, None)
        todo = [row for row in self._wanted(entry) if not self.rows.has(*row)]
        job = Job(entry, todo)
        if todo:
            self.queue.put(job)
        else:
            self._done(job)

    def schedule_all(self, entries: Iterable[AgentEntry | None]) -> None:
        for entry in entries:
            if entry is not None:
                self.schedule(entry)

    def _wanted(self, entry: AgentEntry) -> list[tuple[str, str]]:
        return [row for row in self._rows_of(entry) if self.index.has(*row)]

    def _done(self, job: Job) -> None:
        entry = job.entry
        done = job.vectors()
        fresh = dict(zip(job.texts, done, strict=True)) if done is not None else {}
        groups: dict[str, tuple[list[str], list[Vector]]] = {}
        for task, text in self._wanted(entry):
            vector = fresh.get((task, text))
            if vector is None:
                if not self.rows.has(task, text):
                    # Brought by an agent that left while this job waited: embed it too.
                    self.schedule(entry)
                    return
                vector = self.rows.vector(task, text)
            texts, vectors = groups.setdefault(task, ([], []))
            texts.append(text)
            vectors.append(vector)
        for task, (texts, vectors) in groups.items():
            self.rows.add(entry.id, task, texts, np.stack(vectors))
        self._on_change()

    def _fail(self, job: Job, exc: EmbeddingError) -> None:
        self._on_failure(exc)
        self._failed[job.entry.id] = job.entry

    def add(self, agent_id: str, task: str, texts: list[str], vectors: Vector) -> None:
        """Rows embedded by the caller (a learned phrase's, with its passage row)."""
        self.rows.add(agent_id, task, texts, vectors)

    def forget(self, agent_id: str) -> None:
        self.rows.remove_agent(agent_id)
        self.queue.drop(agent_id)
        self._failed.pop(agent_id, None)

    def retry(self) -> None:
        """Queue again the agents whose query rows failed (those still registered)."""
        for agent_id, entry in list(self._failed.items()):
            del self._failed[agent_id]
            if self._is_current(entry):
                self.schedule(entry)

    async def run(self) -> None:
        await self.queue.run(self._done, self._fail)

    def task_matrices(self) -> dict[str, Vector]:
        return self.rows.task_matrices()

    def memory_bytes(self) -> int:
        return self.rows.memory_bytes()
