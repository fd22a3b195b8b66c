"""Capability vectors: the bridge between the embedder (async, may fail) and the semantic index.

- At registration, each capability's texts are embedded as passages and put in the index. When
  the embedder is down the agent is still registered (exact match serves it) and its vectors are
  retried in the background.
- A request's text is embedded as a query only on a cache miss; the pipeline itself only ever
  reads the cache, so no model call sits on the decision.
"""

from __future__ import annotations

import logging

from agent_reach.config import EmbeddingPolicy
from agent_reach.exceptions import EmbeddingError
from agent_reach.lifecycle import Background
from agent_reach.registry.base import AgentEntry, Registry, RegistryEvent
from agent_reach.semantic.embedders.base import Embedder
from agent_reach.semantic.index import (
    BACKGROUND,
    QueryCache,
    SemanticIndex,
    Vector,
    capability_texts,
)

log = logging.getLogger("agent_reach.semantic")


class CapabilityVectors:
    """Owns the embedder, the index and the query cache; keeps the index in step with the registry."""

    def __init__(self, embedder: Embedder, registry: Registry, policy: EmbeddingPolicy | None = None) -> None:
        self.embedder = embedder
        self.registry = registry
        self.policy = policy or EmbeddingPolicy()
        self.index = SemanticIndex(dim=embedder.dim or 384)
        self.background: Vector | None = None
        self.cache = QueryCache(self.policy.cache_size)
        self.up = True  # False after the embedder failed, until it answers again
        self.last_error: str | None = None
        self._pending: dict[str, AgentEntry] = {}
        self._background = Background("reach-vectors")
        registry.subscribe(self._on_registry)

    def thresholds(self) -> tuple[float, float] | None:
        """``(threshold, margin)`` for the model in use, or None when it has none (not calibrated)."""
        default = self.embedder.thresholds
        threshold = self.policy.threshold if self.policy.threshold is not None else (default and default[0])
        margin = self.policy.margin if self.policy.margin is not None else (default[1] if default else 0.0)
        return None if threshold is None else (float(threshold), float(margin))

    def _on_registry(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED, RegistryEvent.REPLACED):
            self.index.remove_agent(entry.id)
            self._pending.pop(entry.id, None)

    async def add(self, entry: AgentEntry) -> bool:
        """Embed and index an entry's capabilities; False (and queued for retry) if the embedder failed."""
        plan = []
        for task, capability in entry.capabilities.items():
            texts = capability_texts(task, capability.description, list(capability.examples))
            plan.append((task, texts, [t for t in texts if not self.index.has(task, t)]))
        missing = [(task, text) for task, _, todo in plan for text in todo]
        try:
            # One model call for every new text of the profile; texts already indexed (another
            # agent declared the same capability) reuse their rows.
            fresh = await self.embedder.embed([text for _, text in missing], "passage") if missing else None
        except EmbeddingError as exc:
            self._failed(exc)
            self._pending[entry.id] = entry
            return False
        row = 0
        for task, texts, todo in plan:
            if todo and fresh is not None:
                self.index.add(entry.id, task, todo, fresh[row : row + len(todo)])
                row += len(todo)
            known = [t for t in texts if t not in todo]
            if known:
                self.index.add(entry.id, task, known, self._rows_for(task, known))
        self._recovered()
        return True

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

    async def ensure_background(self) -> None:
        """Embed the background texts once (they calibrate every score)."""
        if self.background is None:
            self.background = await self.embedder.embed(list(BACKGROUND), "passage")

    async def query_vector(self, text: str) -> Vector:
        """The query vector for ``text``: from the cache, else from the embedder (then cached)."""
        cached = self.cache.get(text)
        if cached is not None:
            return cached
        try:
            await self.ensure_background()
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
            self._background.spawn(self._warm_up(), "warm-up")

    async def _warm_up(self) -> None:
        # Load the model and embed the background texts before the first semantic request needs them.
        try:
            await self.ensure_background()
        except EmbeddingError as exc:
            self._failed(exc)

    async def close(self) -> None:
        await self._background.close()
        await self.embedder.close()

    async def _retry_pending(self) -> None:
        for agent_id, entry in list(self._pending.items()):
            if self.registry.get(agent_id) is not entry:
                self._pending.pop(agent_id, None)
            elif await self.add(entry):
                self._pending.pop(agent_id, None)
                log.info("capability vectors of %s indexed after the embedder came back", agent_id)
            else:
                break
