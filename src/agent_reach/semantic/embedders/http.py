"""A client for an embedding service (``REACH_EMBEDDING_URL``), such as ``reach embed-server``."""

from __future__ import annotations

import aiohttp
import numpy as np
import orjson

from agent_reach.exceptions import EmbeddingError, EmbeddingUnavailable
from agent_reach.semantic.embedders.base import Kind, Vectors, calibrated_thresholds, normalise


class HttpEmbedder:
    """``POST {url}/embed {"texts", "kind"}`` -> ``{"model", "dim", "vectors"}``."""

    def __init__(self, url: str, *, timeout_ms: int = 2000) -> None:
        self.url = url.rstrip("/")
        self.model = f"http:{self.url}"
        self.dim = 0
        self._timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self._session: aiohttp.ClientSession | None = None

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return calibrated_thresholds(self.model)

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                f"{self.url}/embed",
                data=orjson.dumps({"texts": texts, "kind": kind}),
                headers={"Content-Type": "application/json"},
                timeout=self._timeout,
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EmbeddingUnavailable(
                f"embedding service at {self.url} unreachable: {type(exc).__name__}"
            ) from exc
        if status != 200:
            raise EmbeddingUnavailable(f"embedding service at {self.url} answered HTTP {status}")
        try:
            answer = orjson.loads(raw)
            vectors = np.asarray(answer["vectors"], dtype=np.float32)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding service at {self.url} answered something that is not vectors"
            ) from exc
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise EmbeddingError(f"embedding service returned {vectors.shape} for {len(texts)} texts")
        self.model = str(answer.get("model") or self.model)
        self.dim = int(vectors.shape[1])
        return normalise(vectors)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
