"""Clients for embedding services over HTTP.

- ``HttpEmbedder``: this project's own ``POST {url}/embed`` (``reach embed-server``,
  ``REACH_EMBEDDING_URL``).
- ``OpenAIEmbedder``: any OpenAI-compatible ``POST {url}/embeddings`` (OpenAI, vLLM, Text
  Embeddings Inference, Ollama, LiteLLM, ``reach embed-server``): a larger model on a GPU is one
  line of policy away.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np
import orjson

from reachmesh.exceptions import EmbeddingError, EmbeddingUnavailable
from reachmesh.redaction import loggable_url
from reachmesh.semantic.embedders.base import Kind, Vectors, calibrated_thresholds, normalise

DEFAULT_API_KEY_ENV = "REACH_EMBEDDING_API_KEY"
# An answer larger than this is refused: 32 texts of 16,384 floats as JSON stay well below it.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_DIM = 16_384
# A batch the service turns away as busy (429, 503) is asked again this many times, after the
# wait its Retry-After names (at most RETRY_WAIT_CAP_S), else after 1, 2, 4 ... s. A caller's
# query is never retried: it is on the request path, and its answer says the service is busy.
BUSY_RETRIES = 4
RETRY_WAIT_CAP_S = 30.0
_BUSY = (429, 503)
QUERY_SETTING = "embedding.timeout_ms"
_SECRETS = re.compile(
    r"(?i)(bearer\s+\S+|\bsk-[\w-]{6,}|\b(?:api[_-]?key|token)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]+)"
)


class EmbedTimeouts:
    """A caller's one query waits ``timeout_ms`` (embedding.timeout_ms); anything else is a batch
    off the request path (capability texts, calibration) and waits ``batch_timeout_ms``."""

    __slots__ = ("_batch", "_query")

    def __init__(self, timeout_ms: int = 2000, batch_timeout_ms: int = 60_000) -> None:
        self._query = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self._batch = aiohttp.ClientTimeout(total=batch_timeout_ms / 1000)

    def of(self, texts: list[str], kind: Kind) -> tuple[aiohttp.ClientTimeout, str]:
        """The timeout for embedding ``texts``, and the setting that holds it."""
        if kind == "query" and len(texts) == 1:
            return self._query, QUERY_SETTING
        return self._batch, "embedding.batch_timeout_ms"


class HttpEmbedder:
    """``POST {url}/embed {"texts", "kind"}`` -> ``{"model", "dim", "vectors"}``."""

    def __init__(self, url: str, *, timeouts: EmbedTimeouts | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown = loggable_url(self.url)  # for logs and errors: no credentials, no query
        self.model = f"http:{self.shown}"
        self.dim = 0
        self._timeouts = timeouts or EmbedTimeouts()
        self._session: aiohttp.ClientSession | None = None

    @property
    def thresholds(self) -> tuple[float, float] | None:
        return calibrated_thresholds(self.model)

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout, setting = self._timeouts.of(texts, kind)
        try:
            async with self._session.post(
                f"{self.url}/embed",
                data=orjson.dumps({"texts": texts, "kind": kind}),
                headers={"Content-Type": "application/json"},
                timeout=timeout,
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EmbeddingUnavailable(
                f"embedding service at {self.shown} unreachable: {_why(exc, setting)}"
            ) from exc
        if status != 200:
            raise EmbeddingUnavailable(f"embedding service at {self.shown} answered HTTP {status}")
        try:
            answer = orjson.loads(raw)
            vectors = np.asarray(answer["vectors"], dtype=np.float32)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding service at {self.shown} answered something that is not vectors"
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


@dataclass(frozen=True, slots=True)
class ApiKey:
    """Where a service's key is read (an environment variable, at each call) and how it is sent:
    ``Authorization: Bearer <key>``, or the key alone in another header (Azure: ``api-key``)."""

    env: str = DEFAULT_API_KEY_ENV
    header: str = "Authorization"

    def read(self) -> str:
        # Secrets mounted from files often end in a newline; a header cannot carry one.
        key = os.environ.get(self.env, "").strip()
        if any(ord(c) < 32 or ord(c) == 127 for c in key):
            raise EmbeddingUnavailable(f"the key in ${self.env} contains control characters")
        return key

    def headers(self, key: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers[self.header] = f"Bearer {key}" if self.header.lower() == "authorization" else key
        return headers


class OpenAIEmbedder:
    """``POST {url}/embeddings {"model", "input": [...]}`` -> ``{"data": [{"index", "embedding"}]}``.

    ``url`` is the API base (``http://gpu-box:8000/v1``); a URL that already ends in
    ``/embeddings`` is used as it is (a query string, such as Azure's ``?api-version=``, is kept).
    The key (see :class:`ApiKey`) never appears in a log line or an error. A batch of capability
    texts the service turns away as busy (429, 503) is sent again after its ``Retry-After``.
    Query and passage texts get the model's prefixes (e5: ``"query: "`` and ``"passage: "``);
    with ``send_input_type`` the kind also goes as ``"input_type"`` (NVIDIA NIM, ``reach
    embed-server``). A model served this way has no built-in thresholds: ``reach calibrate``
    measures it and prints its operating point as an ``embedding.calibrations`` entry under
    :attr:`model`.

    Whatever the service answers, the Router gets unit vectors of one width or an
    ``EmbeddingError``: rows of mixed widths, strings, NaN, missing or repeated indices, a width
    that changes between answers, or an answer over ``MAX_ANSWER_BYTES`` are refused, so a
    misbehaving service marks the embedder down instead of breaking the index.
    """

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: ApiKey | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        send_input_type: bool = False,
        batch_size: int = 32,
        timeouts: EmbedTimeouts | None = None,
    ) -> None:
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        if not path.endswith("/embeddings"):
            path = f"{path}/embeddings"
        self.endpoint = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
        # What logs, errors and the model's name show: no user:password@, no query string.
        self.shown = loggable_url(self.endpoint)
        self.requested_model = model
        # Fixed from the start: it names the vectors shared through etcd, so whatever changes
        # the vectors (the prefixes, input_type) is part of it.
        name = model or f"openai:{self.shown}"
        variant = [
            f"{kind} prefix {p!r}" for kind, p in (("query", query_prefix), ("passage", passage_prefix)) if p
        ]
        if send_input_type:
            variant.append("input_type")
        self.model = f"{name} ({', '.join(variant)})" if variant else name
        self.dim = 0
        self._api_key = api_key or ApiKey()
        self.busy_retries = 0  # batches asked again after a 429 or 503, since start
        # Until then (monotonic seconds) the service asked not to be sent queries: one caller's
        # 429 is not followed by every other caller's.
        self._busy_until = 0.0
        self._busy_status = 429
        self._prefix: dict[str, str] = {"query": query_prefix, "passage": passage_prefix}
        self._send_input_type = send_input_type
        self._batch_size = batch_size
        self._timeouts = timeouts or EmbedTimeouts()
        self._session: aiohttp.ClientSession | None = None

    @property
    def thresholds(self) -> tuple[float, float] | None:
        # Served models are calibrated by their users: the built-in table only knows the bundled one.
        return None

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        prefix = self._prefix[kind]
        inputs = [prefix + text for text in texts] if prefix else list(texts)
        key = self._api_key.read()
        # Chosen for the whole call: a one-text remainder of a long call is still a batch.
        limit = self._timeouts.of(inputs, kind)
        parts: list[Vectors] = []
        for start in range(0, len(inputs), self._batch_size):
            chunk = inputs[start : start + self._batch_size]
            parts.append(await self._embed_batch(chunk, kind, key, limit))
        if not parts:
            raise EmbeddingError("nothing to embed")
        vectors = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.dim = int(vectors.shape[1])
        return normalise(vectors)

    async def _embed_batch(
        self, inputs: list[str], kind: Kind, key: str, limit: tuple[aiohttp.ClientTimeout, str]
    ) -> Vectors:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        client_timeout, setting = limit
        body: dict[str, Any] = {"input": inputs, "encoding_format": "float"}
        if self.requested_model:
            body["model"] = self.requested_model
        if self._send_input_type:
            body["input_type"] = kind
        status, raw = await self._post_patiently(orjson.dumps(body), key, client_timeout, setting)
        if raw is None:
            raise EmbeddingError(f"embedding service at {self.shown} answered over {MAX_ANSWER_BYTES} bytes")
        if status in (401, 403):
            raise EmbeddingUnavailable(
                f"embedding service at {self.shown} answered HTTP {status}: "
                f"check the key in ${self._api_key.env}"
            )
        if status != 200:
            hint = " (embedding.url is the API base, usually ending in /v1)" if status == 404 else ""
            raise EmbeddingUnavailable(
                f"embedding service at {self.shown} answered HTTP {status}: {_excerpt(raw, key)}{hint}"
            )
        return self._vectors(raw, len(inputs))

    async def _post_patiently(
        self, payload: bytes, key: str, client_timeout: aiohttp.ClientTimeout, setting: str
    ) -> tuple[int, bytes | None]:
        """Post, and post a batch again while the service says it is busy (429, 503) and the
        retries last; a query goes once, and not at all while the service asked to wait."""
        query = setting == QUERY_SETTING
        wait_s = self._busy_until - time.monotonic()
        if query and wait_s > 0:
            self._still_busy(wait_s)
        retries = 0 if query else BUSY_RETRIES
        for attempt in range(retries + 1):
            status, raw, retry_after = await self._post(payload, key, client_timeout, setting)
            if status not in _BUSY:
                self._busy_until = 0.0  # it answered: whatever wait it asked for is over
                return status, raw
            if retry_after is not None:
                self._busy_until = time.monotonic() + min(retry_after, RETRY_WAIT_CAP_S)
                self._busy_status = status
            if attempt == retries:
                raise self._busy(status, retry_after, f" {retries + 1} times" if retries else "")
            self.busy_retries += 1
            wait = retry_after if retry_after is not None else float(2**attempt)
            await asyncio.sleep(min(wait, RETRY_WAIT_CAP_S))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _still_busy(self, wait_s: float) -> NoReturn:
        raise EmbeddingUnavailable(
            f"embedding service at {self.shown} is busy (it answered HTTP {self._busy_status} and "
            f"asked for a pause; retry after {math.ceil(wait_s)} s)",
            retry_after_s=math.ceil(wait_s),
        )

    def _busy(self, status: int, retry_after: float | None, times: str) -> EmbeddingUnavailable:
        later = f"; it asked to retry after {math.ceil(retry_after)} s" if retry_after is not None else ""
        return EmbeddingUnavailable(
            f"embedding service at {self.shown} answered HTTP {status} (busy or rate limited){times}{later}",
            retry_after_s=math.ceil(retry_after) if retry_after is not None else None,
        )

    async def _post(
        self, payload: bytes, key: str, client_timeout: aiohttp.ClientTimeout, setting: str
    ) -> tuple[int, bytes | None, float | None]:
        """One request: the status, the body (None past MAX_ANSWER_BYTES), and Retry-After."""
        assert self._session is not None
        try:
            async with self._session.post(
                self.endpoint, data=payload, headers=self._api_key.headers(key), timeout=client_timeout
            ) as resp:
                raw = await _read_capped(resp, MAX_ANSWER_BYTES)
                return resp.status, raw, _retry_after(resp.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise EmbeddingUnavailable(
                f"embedding service at {self.shown} unreachable: {_why(exc, setting)}"
            ) from exc

    def _vectors(self, raw: bytes, count: int) -> Vectors:
        """The answer's rows in input order, checked: one width, finite numbers, indices 0..n-1."""
        try:
            data = orjson.loads(raw)["data"]
            by_index = {int(item["index"]): item["embedding"] for item in data}
            if len(data) != count:
                raise EmbeddingError(
                    f"embedding service at {self.shown} returned {len(data)} embeddings for {count} texts"
                )
            if sorted(by_index) != list(range(count)):
                raise EmbeddingError(
                    f"embedding service at {self.shown} returned indices {sorted(by_index)[:8]} "
                    f"for {count} texts (wanted 0 to {count - 1}, once each)"
                )
            vectors = np.asarray([by_index[i] for i in range(count)], dtype=np.float32)
        except EmbeddingError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding service at {self.shown} answered something that is not embeddings "
                "(a list of float vectors under data[].embedding)"
            ) from exc
        if vectors.ndim != 2 or not 0 < vectors.shape[1] <= MAX_DIM:
            raise EmbeddingError(
                f"embedding service at {self.shown} returned vectors of shape {vectors.shape}"
            )
        if self.dim and vectors.shape[1] != self.dim:
            raise EmbeddingError(
                f"embedding service at {self.shown} returned {vectors.shape[1]}-dimensional vectors; "
                f"the index holds {self.dim}-dimensional ones (a changed model needs a Router restart)"
            )
        if not np.isfinite(vectors).all():
            raise EmbeddingError(f"embedding service at {self.shown} returned non-finite numbers")
        return vectors

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None when absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _why(exc: Exception, setting: str) -> str:
    """A few words on a failed connection, without the request (and so without its headers);
    ``setting`` names the timeout that applied."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer within {setting}"
    return type(exc).__name__


def _excerpt(raw: bytes, key: str) -> str:
    """A short, printable piece of an error answer, with anything like a key masked."""
    text = raw[:300].decode("utf-8", "replace")
    if key:
        text = text.replace(key, "***")
    text = _SECRETS.sub("***", text)
    return " ".join(text.split())[:200] or "(empty answer)"
