"""Clients for embedding services over HTTP.

- ``HttpEmbedder``: this project's own ``POST {url}/embed`` (``reach embed-server``,
  ``REACH_EMBEDDING_URL``).
- ``OpenAIEmbedder``: any OpenAI-compatible ``POST {url}/embeddings`` (OpenAI, vLLM, Text
  Embeddings Inference, Ollama, LiteLLM, ``reach embed-server``): a larger model on a GPU is one
  line of policy away.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import numpy as np
import orjson

from agent_reach.exceptions import EmbeddingError, EmbeddingUnavailable
from agent_reach.semantic.embedders.base import Kind, Vectors, calibrated_thresholds, normalise

DEFAULT_API_KEY_ENV = "REACH_EMBEDDING_API_KEY"


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


class OpenAIEmbedder:
    """``POST {url}/embeddings {"model", "input": [...]}`` -> ``{"data": [{"index", "embedding"}]}``.

    ``url`` is the API base (``http://gpu-box:8000/v1``); a URL that already ends in
    ``/embeddings`` is used as it is. The bearer key is read from the environment variable
    ``api_key_env`` when set there, and never appears in a log line or an error. Query and passage
    texts get the model's prefixes (e5: ``"query: "`` and ``"passage: "``); with
    ``send_input_type`` the kind also goes as ``"input_type"`` (NVIDIA NIM, ``reach
    embed-server``). A model served this way has no built-in thresholds: ``reach calibrate``
    measures it and proposes ``embedding.threshold`` and ``embedding.margin``.
    """

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        query_prefix: str = "",
        passage_prefix: str = "",
        send_input_type: bool = False,
        batch_size: int = 32,
        timeout_ms: int = 2000,
    ) -> None:
        base = url.rstrip("/")
        self.endpoint = base if base.endswith("/embeddings") else f"{base}/embeddings"
        self.requested_model = model
        # Fixed from the start: it names the vectors shared through etcd and the thresholds.
        self.model = model or f"openai:{self.endpoint}"
        self.dim = 0
        self._api_key_env = api_key_env
        self._prefix: dict[str, str] = {"query": query_prefix, "passage": passage_prefix}
        self._send_input_type = send_input_type
        self._batch_size = batch_size
        self._timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self._session: aiohttp.ClientSession | None = None

    @property
    def thresholds(self) -> tuple[float, float] | None:
        # Served models are calibrated by their users: the built-in table only knows the bundled one.
        return None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self._api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        prefix = self._prefix[kind]
        inputs = [prefix + text for text in texts] if prefix else list(texts)
        rows: list[Any] = []
        for start in range(0, len(inputs), self._batch_size):
            rows.extend(await self._embed_batch(inputs[start : start + self._batch_size], kind))
        vectors = np.asarray(rows, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts) or vectors.shape[1] == 0:
            raise EmbeddingError(f"embedding service returned {vectors.shape} for {len(texts)} texts")
        self.dim = int(vectors.shape[1])
        return normalise(vectors)

    async def _embed_batch(self, inputs: list[str], kind: Kind) -> list[Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body: dict[str, Any] = {"input": inputs, "encoding_format": "float"}
        if self.requested_model:
            body["model"] = self.requested_model
        if self._send_input_type:
            body["input_type"] = kind
        try:
            async with self._session.post(
                self.endpoint, data=orjson.dumps(body), headers=self._headers(), timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EmbeddingUnavailable(
                f"embedding service at {self.endpoint} unreachable: {type(exc).__name__}"
            ) from exc
        if status in (401, 403):
            raise EmbeddingUnavailable(
                f"embedding service at {self.endpoint} answered HTTP {status}: "
                f"check the key in ${self._api_key_env}"
            )
        if status != 200:
            raise EmbeddingUnavailable(f"embedding service at {self.endpoint} answered HTTP {status}")
        try:
            answer = orjson.loads(raw)
            items = sorted(answer["data"], key=lambda item: int(item["index"]))
            rows = [item["embedding"] for item in items]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding service at {self.endpoint} answered something that is not embeddings"
            ) from exc
        if len(rows) != len(inputs):
            raise EmbeddingError(f"embedding service returned {len(rows)} embeddings for {len(inputs)} texts")
        return rows

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
