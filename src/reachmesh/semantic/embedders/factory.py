"""The factory that picks an embedder implementation from the policy.

Implementations are imported only when chosen: sentence-transformers pulls in torch, and the
HTTP client needs no model at all.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from reachmesh.config import EmbeddingPolicy
from reachmesh.exceptions import ConfigError
from reachmesh.semantic.embedders.base import Embedder

if TYPE_CHECKING:
    from reachmesh.semantic.embedders.http import EmbedTimeouts


def build_embedder(policy: EmbeddingPolicy) -> Embedder:
    """The embedder the policy names; ``REACH_EMBEDDING_URL`` selects the HTTP client."""
    url = policy.url or os.environ.get("REACH_EMBEDDING_URL")
    backend = policy.backend
    if backend == "auto":
        backend = "http" if url else "local"
    if backend == "http":
        from reachmesh.semantic.embedders.http import HttpEmbedder

        if not url:
            raise ConfigError(
                "embedding.backend is http but no URL: set embedding.url or REACH_EMBEDDING_URL"
            )
        return HttpEmbedder(url, timeouts=_timeouts(policy))
    if backend == "openai":
        from reachmesh.semantic.embedders.http import ApiKey, OpenAIEmbedder

        if not url:
            raise ConfigError(
                "embedding.backend is openai but no URL: set embedding.url (the API base, e.g. "
                "http://gpu-box:8000/v1) or REACH_EMBEDDING_URL"
            )
        return OpenAIEmbedder(
            url,
            model=policy.model,
            api_key=ApiKey(policy.api_key_env, policy.api_key_header),
            query_prefix=policy.query_prefix,
            passage_prefix=policy.passage_prefix,
            send_input_type=policy.send_input_type,
            batch_size=policy.batch_size,
            timeouts=_timeouts(policy),
        )
    if backend == "sentence_transformers":
        from reachmesh.semantic.embedders.st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(policy.model_path)
    from reachmesh.semantic.embedders.local import LocalEmbedder

    return LocalEmbedder()


def _timeouts(policy: EmbeddingPolicy) -> EmbedTimeouts:
    from reachmesh.semantic.embedders.http import EmbedTimeouts

    return EmbedTimeouts(policy.timeout_ms, policy.batch_timeout_ms)
