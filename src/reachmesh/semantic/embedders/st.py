"""sentence-transformers, for users who bring their own model folder (loaded offline)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from reachmesh.exceptions import EmbeddingUnavailable
from reachmesh.semantic.embedders.base import (
    DaemonWorker,
    Kind,
    Vectors,
    calibrated_thresholds,
    normalise,
)


class SentenceTransformerEmbedder:
    """A ``SentenceTransformer`` from a local folder; e5-style prefixes are added when configured."""

    def __init__(self, model_path: str | None, *, query_prefix: str = "", passage_prefix: str = "") -> None:
        if not model_path:
            raise EmbeddingUnavailable("embedding.backend sentence_transformers needs embedding.model_path")
        self.model = os.path.basename(model_path.rstrip("/")) or model_path
        self._path = model_path
        self._prefixes = {"query": query_prefix, "passage": passage_prefix}
        self._model: Any = None
        self.dim = 0
        self._pool = DaemonWorker("reach-embed")

    def _load(self) -> Any:
        if self._model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise EmbeddingUnavailable(
                    "pip install sentence-transformers (with torch) to use it"
                ) from exc
            try:
                self._model = SentenceTransformer(self._path, device="cpu", local_files_only=True)
            except (OSError, ValueError) as exc:
                raise EmbeddingUnavailable(f"cannot load the model at {self._path!r}: {exc}") from exc
            self.dim = int(self._model.get_sentence_embedding_dimension() or 0)
        return self._model

    def embed_sync(self, texts: list[str], kind: Kind) -> Vectors:
        model = self._load()
        prefix = self._prefixes[kind]
        raw = model.encode([prefix + t for t in texts], normalize_embeddings=True, convert_to_numpy=True)
        return normalise(raw)

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return calibrated_thresholds(self.model)

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.embed_sync, texts, kind)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
