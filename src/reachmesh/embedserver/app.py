"""``reach embed-server``: the local model as a small HTTP service.

- ``POST /embed`` ``{"texts": [...], "kind": "query"|"passage"}`` -> ``{"model", "dim", "vectors"}``
- ``POST /v1/embeddings`` (OpenAI-compatible): ``{"input": str | [str], "model"?}`` ->
  ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}``
  (texts are embedded as passages unless ``"input_type": "query"``)
- ``GET /healthz``

Bad input is answered 400 with ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reachmesh.exceptions import EmbeddingError
from reachmesh.semantic.embedders.base import Embedder, Kind

MAX_TEXTS = 256
MAX_CHARS = 8192
MAX_BODY = 4 * 1024 * 1024


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _bad(message: str, status: int = 400, code: str = "INVALID_REQUEST") -> Response:
    return _json({"error": {"code": code, "message": message}}, status)


def _texts(value: Any, field: str) -> list[str] | str:
    """The texts, or an error message naming what is wrong."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        return f"{field} must be a non-empty list of strings"
    if len(value) > MAX_TEXTS:
        return f"{field} has {len(value)} texts; at most {MAX_TEXTS} per request"
    for i, text in enumerate(value):
        if not isinstance(text, str) or not text.strip():
            return f"{field}[{i}] must be a non-empty string"
        if len(text) > MAX_CHARS:
            return f"{field}[{i}] is {len(text)} characters; at most {MAX_CHARS}"
    return value


class EmbedService:
    """The embedding service around one embedder: ``/embed``, ``/v1/embeddings``, ``/healthz``."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.app = Starlette(
            routes=[
                Route("/embed", self.embed, methods=["POST"]),
                Route("/v1/embeddings", self.openai_embeddings, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
            ]
        )

    @staticmethod
    async def _read(request: Request) -> Any:
        body = await request.body()
        if len(body) > MAX_BODY:
            return _bad(f"body over {MAX_BODY} bytes", 413, "PAYLOAD_TOO_LARGE")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _bad("body is not JSON")
        if not isinstance(data, dict):
            return _bad("body must be a JSON object")
        return data

    async def embed(self, request: Request) -> Response:
        data = await self._read(request)
        if isinstance(data, Response):
            return data
        kind = data.get("kind", "passage")
        if kind not in ("query", "passage"):
            return _bad("kind must be 'query' or 'passage'")
        texts = _texts(data.get("texts"), "texts")
        if isinstance(texts, str):
            return _bad(texts)
        try:
            vectors = await self.embedder.embed(texts, kind)
        except EmbeddingError as exc:
            return _bad(exc.message, 503, exc.code)
        body = {"model": self.embedder.model, "dim": int(vectors.shape[1]), "vectors": vectors}
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    async def openai_embeddings(self, request: Request) -> Response:
        data = await self._read(request)
        if isinstance(data, Response):
            return data
        texts = _texts(data.get("input"), "input")
        if isinstance(texts, str):
            return _bad(texts)
        kind: Kind = "query" if data.get("input_type") == "query" else "passage"
        try:
            vectors = await self.embedder.embed(texts, kind)
        except EmbeddingError as exc:
            return _bad(exc.message, 503, exc.code)
        tokens = sum(len(t.split()) for t in texts)
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)],
            "model": self.embedder.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok", "model": self.embedder.model})


def build_embed_app(embedder: Embedder) -> Starlette:
    """The embedding service around ``embedder``, as a Starlette app."""
    return EmbedService(embedder).app
