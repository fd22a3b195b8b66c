"""The embedder contract and the factory that picks an implementation from the policy."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from agent_reach.config import EmbeddingPolicy

Kind = Literal["query", "passage"]
Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns texts into L2-normalised vectors; cosine similarity is then a dot product."""

    model: str
    dim: int

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        """``(len(texts), dim)`` float32 unit vectors. Raises EmbeddingError subclasses."""
        ...

    async def close(self) -> None:
        """Release threads, sessions or model memory."""
        ...


def normalise(vectors: npt.NDArray[np.floating]) -> Vectors:
    """Rows scaled to unit length (zero rows stay zero)."""
    out = np.asarray(vectors, dtype=np.float32)
    if out.ndim == 1:
        out = out[None, :]
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(out / norms, dtype=np.float32)


def build_embedder(policy: EmbeddingPolicy) -> Embedder:
    """The embedder the policy names; ``REACH_EMBEDDING_URL`` selects the HTTP client."""
    url = policy.url or os.environ.get("REACH_EMBEDDING_URL")
    backend = policy.backend
    if backend == "auto":
        backend = "http" if url else "local"
    if backend == "http":
        from agent_reach.embedding.http import HttpEmbedder

        if not url:
            from agent_reach.exceptions import ConfigError

            raise ConfigError(
                "embedding.backend is http but no URL: set embedding.url or REACH_EMBEDDING_URL"
            )
        return HttpEmbedder(url, timeout_ms=policy.timeout_ms)
    if backend == "sentence_transformers":
        from agent_reach.embedding.st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(policy.model_path)
    from agent_reach.embedding.local import LocalEmbedder

    return LocalEmbedder()
