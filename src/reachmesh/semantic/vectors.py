"""Capability vectors: the bridge between the embedder (async, may fail) and the semantic index.

- At registration, each capability's texts are embedded as passages and put in the index. When
  the embedder is down the agent is still registered (exact match serves it) and its vectors are
  retried in the background.
- A request's text is embedded as a query only on a cache miss; the pipeline itself only ever
  reads the cache, so no model call sits on the decision.
- While learning is on (``routing.learning.enabled``), each learned phrase (from the registry,
  so from any Router) is embedded as a passage and indexed as one more example row of its task:
  paraphrases of a confirmed phrase benefit too, not only the phrase itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from reachmesh.config import EmbeddingPolicy
from reachmesh.exceptions import EmbeddingError, EmbeddingUnavailable
from reachmesh.lifecycle import Background
from reachmesh.registry.base import AgentEntry, LearnedRoute, Registry, RegistryEvent
from reachmesh.semantic.blocks import decode_block, encode_block
from reachmesh.semantic.duplicates import NearDuplicate, near_duplicate
from reachmesh.semantic.embedders.base import (
    DaemonWorker,
    Embedder,
    calibrated_head_confidence,
    calibrated_head_margin,
    calibrated_limit_margin,
)
from reachmesh.semantic.head import Head, query_rows, train
from reachmesh.semantic.headrows import HeadRows
from reachmesh.semantic.index import (
    BACKGROUND,
    LEARNED,
    LIMIT,
    HeadRule,
    QueryCache,
    SemanticIndex,
    Vector,
    capability_texts,
    language_means,
    limit_rows,
)
from reachmesh.semantic.queue import EmbeddingQueue, Job, VectorState

log = logging.getLogger("reachmesh.semantic")

# The head is trained on a daemon thread of its own: a retrain under way (up to
# embedding.head_budget_ms) does not hold up the process's exit, as asyncio.to_thread's did.
_HEAD_WORKER = DaemonWorker("reach-head")


def entry_groups(entry: AgentEntry) -> list[tuple[str, list[str]]]:
    """Every text ``entry`` brings to the index, grouped by the (pseudo-)task that holds them:
    each capability's texts, then its declared limits beside them."""
    groups = []
    for task, capability in entry.capabilities.items():
        groups.append((task, capability_texts(task, capability.description, list(capability.examples))))
        if capability.limits:
            groups.append(limit_rows(task, list(capability.limits)))
    return groups


def entry_rows(entry: AgentEntry) -> list[tuple[str, str]]:
    return [(task, text) for task, texts in entry_groups(entry) for text in texts]


class CapabilityVectors:
    """Owns the embedder, the index and the query cache; keeps the index in step with the registry."""

    def __init__(self, embedder: Embedder, registry: Registry, policy: EmbeddingPolicy | None = None) -> None:
        self.embedder = embedder
        self.registry = registry
        self.policy = policy or EmbeddingPolicy()
        self.index = SemanticIndex(dim=embedder.dim or 384)
        self.background: Vector | None = None
        # One embedding of the background texts at a time, shared by whoever needs it first.
        self._background_job: asyncio.Future[None] | None = None
        # At least one slot: the request that embedded its text reads the vector back from here
        # (cache_size 0 means no reuse between requests, not no vector at all).
        self.cache = QueryCache(max(self.policy.cache_size, 1))
        self.up = True  # False after the embedder failed, until it answers again
        # From start() until the model is loaded, failed or abandoned (/admin/summary shows it).
        self.loading = False
        self._warming: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self._pending: dict[str, AgentEntry] = {}
        self._ready: set[str] = set()
        self.shared_hits = 0  # agents made ready from another Router's vectors, not embedded here
        # Capabilities that nearly repeat another token's, by agent (semantic/duplicates.py).
        self.duplicates: dict[str, list[NearDuplicate]] = {}
        self.queue = EmbeddingQueue(self._embed_passages, lambda e: self.registry.get(e.id) is e)
        self._background = Background("reach-vectors")
        registry.subscribe(self._on_registry)
        # Learned phrases waiting for their vector: phrase key -> (task, phrase).
        self.learning = False
        self._learned_todo: dict[str, tuple[str, str]] = {}
        self._learned_wake = asyncio.Event()
        registry.subscribe_learned(self._on_learned)
        # The few-shot head routes read (None until one is trained), the trainer (a test holds
        # it to prove requests go on meanwhile), and what wakes the retrain loop.
        self.head: Head | None = None
        self.trainer: Callable[[Mapping[str, Vector], int, float], Head | None] = _train
        self.retrains = 0
        self._head_wake = asyncio.Event()
        self._head_seen = (0, 0)  # the empty index needs no head
        # The capability texts embedded as queries too, after their passage rows: the head's.
        self.head_rows = HeadRows(
            embedder,
            self.index,
            lambda entry: [row for row in entry_rows(entry) if not row[0].startswith(LIMIT)],
            lambda e: self.registry.get(e.id) is e,
            self._head_wake.set,
            self._failed,
            self._recovered,
        )

    def thresholds(self) -> tuple[float, float] | None:
        """``(threshold, margin)`` for the model in use, or None when it has none (not calibrated)."""
        return self.policy.operating_point(self.embedder.model, self.embedder.thresholds)

    def limit_margin(self) -> float:
        """How well a text must match a declared limit, beyond what its capability explains, to
        be kept off it, for the model in use (``reach calibrate --limits`` fits it)."""
        return self.policy.limit_margin_for(self.embedder.model, calibrated_limit_margin(self.embedder.model))

    def head_rule(self) -> HeadRule | None:
        """The trained head, its margin and its confidence, when the policy uses one and one is
        trained."""
        if not self.policy.head or self.head is None:
            return None
        model = self.embedder.model
        return (
            self.head,
            self.policy.head_margin_for(model, calibrated_head_margin(model)),
            self.policy.head_confidence_for(model, calibrated_head_confidence(model)),
        )

    def head_state(self) -> str:
        """``current`` when the few-shot head was trained on the index (and its query rows) as
        they are now, ``training`` while a retrain is due or under way (routes use the previous
        head), ``off``."""
        return (
            "off"
            if not self.policy.head
            else "current"
            if self._head_seen == self._rows_generation()
            else "training"
        )

    def _rows_generation(self) -> tuple[int, int]:
        return self.index.generation, self.head_rows.generation

    def _on_registry(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED, RegistryEvent.REPLACED):
            self.index.remove_agent(entry.id)
            self._pending.pop(entry.id, None)
            self._ready.discard(entry.id)
            self.queue.drop(entry.id)
            self.head_rows.forget(entry.id)
            self.duplicates.pop(entry.id, None)
            self._head_wake.set()

    async def _head_loop(self) -> None:
        """Retrain the few-shot head whenever the index's rows changed, off the request path: a
        worker thread, bounded by ``embedding.head_budget_ms``; the previous head routes
        meanwhile and is replaced whole."""
        while True:
            await self._head_wake.wait()
            self._head_wake.clear()
            generation = self._rows_generation()
            if generation == self._head_seen or not self.policy.head:
                continue
            rows = query_rows(self.index.task_matrices(), self.head_rows.task_matrices())
            if rows is None:
                continue  # query rows on the way: their arrival wakes this loop again
            budget_s = self.policy.head_budget_ms / 1000
            head = await _trained(self.trainer, rows, generation[0], budget_s)
            self._head_seen = generation
            self.head = head
            self.retrains += 1
            if self._rows_generation() != generation:
                self._head_wake.set()  # rows changed during training: once more

    # -- learned phrases as example rows -----------------------------------------------------

    def apply(self, policy: EmbeddingPolicy, *, learning: bool) -> None:
        """A (reloaded) policy's thresholds; learned phrases indexed (``learning``) or dropped."""
        head_on = policy.head and not self.policy.head
        self.policy = policy
        if head_on:  # the head's query rows were not embedded while it was off
            self.head_rows.schedule_all(self.registry.get(a) for a in list(self._ready))
        if learning == self.learning and not (head_on and learning):
            return
        self.learning = enabled = learning
        for key, route in list(self.registry.learned().items()):
            self._on_learned(key, route if enabled else None)

    def learned_pending(self) -> int:
        """Learned phrases not in the index yet (their vectors are on the way)."""
        return len(self._learned_todo)

    def _on_learned(self, key: str, route: LearnedRoute | None) -> None:
        self.index.remove_agent(LEARNED + key)
        self.head_rows.forget(LEARNED + key)
        self._head_wake.set()
        self._learned_todo.pop(key, None)
        # Only a route that serves every caller (an operator's) becomes an example of its task: a
        # caller's own, or one held for an operator, must not move anyone else's routes.
        if route is not None and self.learning and route.owner is None and not route.pending:
            self._learned_todo[key] = (route.task, route.phrase)
            self._learned_wake.set()

    async def _learn_loop(self) -> None:
        """Embed learned phrases a few at a time, off the request path."""
        while True:
            await self._learned_wake.wait()
            self._learned_wake.clear()
            while self._learned_todo:
                batch = list(self._learned_todo.items())[:16]
                phrases = [phrase for _, (_, phrase) in batch]
                try:
                    vectors = await self.embedder.embed(phrases, "passage")
                    asked = await self.head_rows.embed(phrases) if self.policy.head else None
                except EmbeddingError as exc:
                    self._failed(exc)
                    break  # the retry tick wakes this loop again
                self._recovered()
                for i, ((key, wanted), vector) in enumerate(zip(batch, vectors, strict=True)):
                    if self._learned_todo.get(key) == wanted:  # not replaced or forgotten meanwhile
                        del self._learned_todo[key]
                        self.index.add(LEARNED + key, wanted[0], [wanted[1]], vector[None, :])
                        if asked is not None:
                            self.head_rows.add(LEARNED + key, wanted[0], [wanted[1]], asked[i][None, :])
                self._head_wake.set()

    def state(self, agent_id: str) -> VectorState | None:
        """Whether an agent is routable by meaning yet; None for an agent this never saw."""
        if agent_id in self._ready:
            return VectorState.READY
        if agent_id in self.queue:
            return VectorState.PENDING
        if agent_id in self._pending:
            return VectorState.UNAVAILABLE
        return None

    def schedule(self, entry: AgentEntry) -> None:
        """Queue ``entry``'s capability texts; it becomes routable by meaning once they are in.

        Texts another Router already embedded with this model (a shared registry) are taken from
        its block instead: a Router joining a large registry is ready without embedding it all.
        """
        self._ready.discard(entry.id)
        job = self._plan(entry)
        if job.texts and self._from_shared(entry, job.texts):
            self.shared_hits += 1
            return
        self.queue.put(job)

    def _from_shared(self, entry: AgentEntry, missing: list[tuple[str, str]]) -> bool:
        block = self.registry.vectors_for(self.embedder.model, entry.id)
        if block is None:
            return False
        rows = decode_block(block, self.embedder.model, self.index.dim)
        if not all(row in rows for row in missing):
            return False  # the profile changed since, or another model: embed here
        import numpy as np

        self._index(entry, missing, np.stack([rows[row] for row in missing]))
        return entry.id in self._ready

    def _share(self, entry: AgentEntry) -> None:
        """Publish every row of ``entry`` for the other Routers (a no-op on a private registry)."""
        rows = [(task, text) for task, text in entry_rows(entry) if self.index.has(task, text)]
        if rows:
            import numpy as np

            matrix = np.stack([self.index.vector(task, text) for task, text in rows])
            self.registry.publish_vectors(
                self.embedder.model, entry.id, encode_block(self.embedder.model, rows, matrix)
            )

    def _plan(self, entry: AgentEntry) -> Job:
        return Job(
            entry, [(task, text) for task, text in entry_rows(entry) if not self.index.has(task, text)]
        )

    async def _embed_passages(self, texts: list[str]) -> Vector:
        return await self.embedder.embed(texts, "passage")

    def _job_done(self, job: Job) -> None:
        self._index(job.entry, job.texts, job.vectors())
        self._recovered()
        if job.entry.id in self._ready and job.texts:
            self._share(job.entry)

    def _job_failed(self, job: Job, exc: EmbeddingError) -> None:
        self._failed(exc)
        self._pending[job.entry.id] = job.entry

    async def add(self, entry: AgentEntry) -> bool:
        """Embed and index an entry's capabilities now, in one model call (tools and benchmarks);
        False, and retried in the background, when the embedder failed."""
        job = self._plan(entry)
        try:
            fresh = await self._embed_passages([text for _, text in job.texts]) if job.texts else None
        except EmbeddingError as exc:
            self._job_failed(job, exc)
            return False
        self._index(entry, job.texts, fresh)
        self._recovered()
        return True

    def _index(self, entry: AgentEntry, fresh_texts: list[tuple[str, str]], fresh: Vector | None) -> None:
        """Put every capability text of ``entry`` in the index: new rows, and rows other agents
        already brought (a thousand agents declaring one capability share its rows)."""
        lost = [row for row in entry_rows(entry) if row not in fresh_texts and not self.index.has(*row)]
        if lost:
            # Rows another agent brought left with it while this job waited: embed them too.
            self.schedule(entry)
            return
        groups: list[tuple[str, list[str], Vector]] = []
        row = 0
        for task, texts in entry_groups(entry):
            todo = [text for t, text in fresh_texts if t == task]
            if todo and fresh is not None:
                groups.append((task, todo, fresh[row : row + len(todo)]))
                row += len(todo)
            known = [t for t in texts if t not in todo]
            if known:
                groups.append((task, known, self._rows_for(task, known)))
        self.duplicates.pop(entry.id, None)
        found = check_duplicates(self.policy, self.index, entry, groups, self._holder_of)
        if found:
            self.duplicates[entry.id] = found
        refused = {d.task for d in found if d.refused}
        for task, texts, rows in groups:
            if task.removeprefix(LIMIT) not in refused:
                self.index.add(entry.id, task, texts, rows)
        self._ready.add(entry.id)
        self._head_wake.set()
        if self.policy.head:
            self.head_rows.schedule(entry)

    def _holder_of(self, agent_id: str) -> str | None:
        entry = self.registry.get(agent_id)
        return None if entry is None else entry.holder

    def _rows_for(self, task: str, texts: list[str]) -> Vector:
        import numpy as np

        stacked: Vector = np.stack([self.index.vector(task, t) for t in texts])
        return stacked

    def cached(self, text: str) -> Vector | None:
        return self.cache.get(text)

    def baseline(self, query: Vector) -> float:
        """The query's mean similarity to the neutral background texts (0 until they are embedded)."""
        if self.background is None:
            return 0.0
        return float((self.background @ query).mean())

    def _background_embedding(self) -> asyncio.Future[None]:
        """The one embedding of the background texts under way, started if none is."""
        job = self._background_job
        if job is None or (job.done() and (job.cancelled() or job.exception() is not None)):
            job = self._background_job = asyncio.ensure_future(self._embed_background())
            job.add_done_callback(self._background_done)
        return job

    def _background_done(self, job: asyncio.Future[None]) -> None:
        # Read here, so a failure nobody awaited (a retry's) is reported, never left unretrieved.
        if not job.cancelled() and isinstance(job.exception(), EmbeddingError):
            self._failed(job.exception())  # type: ignore[arg-type]

    async def _embed_background(self) -> None:
        background = await self.embedder.embed(list(BACKGROUND), "passage")
        self.index.languages = language_means(background)
        self.background = background

    async def ensure_background(self) -> None:
        """Embed the background texts once (they calibrate every score)."""
        if self.background is None:
            # Shielded: the warm-up that waits here is cancelled at SIGTERM (stop_loading), and
            # the job is shared with callers waiting for it, who must not get its cancellation.
            await asyncio.shield(self._background_embedding())

    async def _background_for_query(self) -> None:
        """The background, waited for at most ``embedding.timeout_ms``: a caller is waiting. The
        embedding goes on (as a batch, with ``batch_timeout_ms``) for the callers after it."""
        if self.background is not None:
            return
        await _wait_for_background(self._background_embedding(), self.policy.timeout_ms / 1000)

    async def query_vector(self, text: str) -> Vector:
        """The query vector for ``text``: from the cache, else from the embedder (then cached)."""
        cached = self.cache.get(text)
        if cached is not None:
            return cached
        try:
            await self._background_for_query()
            vector: Vector = (await self.embedder.embed([text], "query"))[0]
        except EmbeddingError as exc:
            self._failed(exc)
            raise
        self._recovered()
        self.cache.put(text, vector)
        return vector

    def _failed(self, exc: EmbeddingError) -> None:
        if self.up:
            log.warning(
                "embedder %s failed (%s): semantic routes are refused, exact match goes on",
                self.embedder.model,
                exc.message,
            )
        self.up = False
        self.last_error = exc.message

    def _recovered(self) -> None:
        if not self.up:
            log.info("embedder %s answers again: semantic routing restored", self.embedder.model)
        self.up = True
        self.last_error = None

    async def start(self) -> None:
        if not self._background:
            self._background.every(lambda: self.policy.retry_seconds, self._retry_pending, "retry")
            self.loading = True
            self._warming = self._background.spawn(_warm_up(self), "warm-up")
            self._background.spawn(self.queue.run(self._job_done, self._job_failed), "queue")
            self._background.spawn(self._learn_loop(), "learned")
            self._background.spawn(self._head_loop(), "head")
            self._background.spawn(self.head_rows.run(), "head-rows")

    def stop_loading(self) -> None:
        """The Router is stopping: a load still under way is abandoned, not finished while it drains."""
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
            self.loading = False
            log.info("semantic routing: the embedder's load is abandoned, the Router is stopping")

    async def close(self) -> None:
        if self._background_job is not None and not self._background_job.done():
            self._background_job.cancel()
        await self._background.close()
        await self.embedder.close()

    async def _retry_pending(self) -> None:
        """Queue again every agent whose vectors failed; the queue drops those that left. A
        background that failed is embedded again too, off the request path."""
        if self.background is None:
            self._background_embedding()
        if self._learned_todo:
            self._learned_wake.set()
        self.head_rows.retry()
        for agent_id, entry in list(self._pending.items()):
            del self._pending[agent_id]
            if self.registry.get(agent_id) is entry:
                log.debug("retrying the capability vectors of %s", agent_id)
                self.schedule(entry)


async def _wait_for_background(job: asyncio.Future[None], limit_s: float) -> None:
    """Wait for the shared background job for at most ``limit_s``, as a caller does: its end
    (a timeout, or the job stopped with the Router) is EmbeddingUnavailable, an answer."""
    try:
        await asyncio.wait_for(asyncio.shield(job), limit_s)
    except TimeoutError:
        raise EmbeddingUnavailable(
            "the embedder has not yet embedded the background texts every score is measured "
            "against (no answer within embedding.timeout_ms)"
        ) from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not job.cancelled() or (task is not None and task.cancelling()):
            raise  # this caller's own cancellation
        raise EmbeddingUnavailable("the embedder's load was stopped: the Router is stopping") from None


async def _warm_up(vectors: CapabilityVectors) -> None:
    """Load the model and embed the background texts before the first semantic request needs
    them. Loading takes seconds on a busy host while the Router already listens: said at once,
    or the log is silent until the "semantic routing:" line."""
    embedder = vectors.embedder
    log.info(
        "semantic routing: loading embedder %s; routes by meaning wait for it, exact task names "
        "and the rest of routing work meanwhile",
        embedder.model,
    )
    try:
        await vectors.ensure_background()
        await embedder.embed(["warm-up"], "query")  # loads the query lane's model too
    except EmbeddingError as exc:
        vectors._failed(exc)
        return
    finally:
        vectors.loading = False
    describe(embedder.model, vectors.thresholds(), sorted(vectors.policy.calibrations))


async def _trained(
    trainer: Callable[[Mapping[str, Vector], int, float], Head | None],
    rows: Mapping[str, Vector],
    generation: int,
    budget_s: float,
) -> Head | None:
    return await asyncio.get_running_loop().run_in_executor(_HEAD_WORKER, trainer, rows, generation, budget_s)


def describe(model: str, point: tuple[float, float] | None, calibrated: list[str]) -> None:
    """One line on what routes by meaning: the model and its operating point, or why not."""
    if point is None:
        log.warning(
            "semantic routing: embedder %s has no calibration, so routes by meaning are refused "
            "until `reach calibrate` has measured it and its calibration is in the policy "
            "(embedding.calibrations holds %s)",
            model,
            calibrated or "none",
        )
    else:
        log.info("semantic routing: embedder %s, threshold %.4f, margin %.4f", model, point[0], point[1])


def check_duplicates(
    policy: EmbeddingPolicy,
    index: SemanticIndex,
    entry: AgentEntry,
    groups: list[tuple[str, list[str], Vector]],
    holder_of: Callable[[str], str | None],
) -> list[NearDuplicate]:
    """Each capability of ``entry`` that nearly repeats another token's (logged); those with
    ``refused`` set are the ones the policy refuses by meaning for it."""
    import numpy as np

    mode = policy.duplicates
    if mode == "off" or entry.holder is None:
        return []
    found: list[NearDuplicate] = []
    for task in {t for t, _, _ in groups if not t.startswith(LIMIT)}:
        rows = np.concatenate([r for t, _, r in groups if t == task])
        hit = near_duplicate(index, task, rows, entry.holder, holder_of, policy.duplicate_similarity)
        if hit is not None:
            found.append(NearDuplicate(task, hit[0], hit[1], hit[2], refused=mode == "refuse"))
    if found:
        log.warning(
            "[semantic] %s: %s", entry.id, ", ".join(f"{d.task} nearly repeats {d.of}" for d in found)
        )
    return found


def _train(rows: Mapping[str, Vector], generation: int, budget_s: float) -> Head | None:
    return train(rows, generation, budget_s=budget_s)
