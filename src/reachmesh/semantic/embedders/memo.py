"""An embedder in front of another that embeds each (kind, text) once and counts its work.

``reach calibrate --corpus`` scores the same questions under three profile conditions, and the
same descriptions recur across them: without this, the model embeds 2,380 texts where 720 are
distinct (EmbeddingGemma-300M served on this machine's CPU: about 4 minutes, 45 s with it). The
count is what the CLI shows as progress. Used for calibration only: the Router keeps its own
query cache.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reachmesh.semantic.embedders.base import Embedder, Kind, Vectors


class MemoEmbedder:
    """``inner``'s vectors, each (kind, text) asked of it once; ``on_embedded(total)`` after
    each call that reached it, with the number of texts it has embedded so far."""

    def __init__(self, inner: Embedder, on_embedded: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.embedded = 0
        self._on_embedded = on_embedded
        self._seen: dict[tuple[Kind, str], Vectors] = {}

    # The inner embedder's own, read each time: an HTTP embedder takes the name the service
    # reports with its first answer, and calibrations are keyed by that name.
    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return self.inner.thresholds

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        if not texts:
            return await self.inner.embed(texts, kind)  # the inner embedder's own answer to nothing
        missing = list(dict.fromkeys(text for text in texts if (kind, text) not in self._seen))
        if missing:
            rows = await self.inner.embed(missing, kind)
            for text, row in zip(missing, rows, strict=True):
                self._seen[(kind, text)] = row
            self.embedded += len(missing)
            if self._on_embedded is not None:
                self._on_embedded(self.embedded)
        return np.stack([self._seen[(kind, text)] for text in texts])

    async def close(self) -> None:
        await self.inner.close()
