"""What to say when a caller names a task no agent declares: the nearest declared tasks.

A typo and a phrase look the same to exact match. The refusal names the declared tasks nearest
by spelling (``difflib``) and, for text that reads like a phrase, by meaning, and says how free
text is routed by meaning. This runs only on that refusal, never on a routed request.

Suggesting by meaning costs a model call, so a stranger must not be able to buy one with every
random name: it is only tried for phrase-like text (a space, or CJK), and at most
``MEANING_PER_SECOND`` times a second; cached texts cost nothing.
"""

from __future__ import annotations

import asyncio
import difflib
from typing import Any

from reachmesh.clock import Clock
from reachmesh.exceptions import EmbeddingError
from reachmesh.registry.base import Registry
from reachmesh.semantic.vectors import CapabilityVectors

SPELLING_CUTOFF = 0.6
# A suggestion by meaning must beat neutral text by this much (background-relative score).
MEANING_FLOOR = 0.02
# The refusal waits at most this long for a query vector.
EMBED_WAIT_S = 1.0
MEANING_PER_SECOND = 5.0

HINT = (
    "Free text is routed by meaning only when asked: send preferences.strategy semantic_route, "
    "or list the task pattern in the Router's routing.semantic_tasks."
)


def looks_like_a_phrase(text: str) -> bool:
    """Words with spaces, or Chinese, Japanese or Korean script: something a person wrote."""
    return any(ch.isspace() for ch in text.strip()) or any(ord(ch) >= 0x2E80 for ch in text)


class Suggester:
    """Finds the declared tasks nearest an unknown one."""

    def __init__(self, registry: Registry, vectors: CapabilityVectors | None, clock: Clock) -> None:
        self.registry = registry
        self.vectors = vectors
        self._clock = clock
        self._tokens = MEANING_PER_SECOND
        self._refilled = clock.monotonic()

    def _may_embed(self) -> bool:
        now = self._clock.monotonic()
        self._tokens = min(MEANING_PER_SECOND, self._tokens + (now - self._refilled) * MEANING_PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def nearest(self, text: str) -> tuple[list[dict[str, Any]], str]:
        """Up to four tasks near ``text``, by spelling then by meaning, and a hint on routing by meaning."""
        declared = sorted(self.registry.tasks())
        found: list[dict[str, Any]] = [
            {"task": task, "by": "spelling"}
            for task in difflib.get_close_matches(text, declared, n=3, cutoff=SPELLING_CUTOFF)
        ]
        vectors = self.vectors
        if vectors is None or not vectors.up or not looks_like_a_phrase(text) or len(text) > 512:
            return found, ""
        query = vectors.cached(text)
        if query is None and self._may_embed():
            try:
                async with asyncio.timeout(EMBED_WAIT_S):
                    query = await vectors.query_vector(text)
            except (EmbeddingError, TimeoutError):
                query = None
        if query is not None:
            named = {s["task"] for s in found}
            for task, score in vectors.index.nearest(query, k=3, baseline=vectors.baseline(query)):
                if task not in named and score >= MEANING_FLOOR and len(found) < 4:
                    found.append({"task": task, "by": "meaning", "score": round(score, 4)})
        return found, HINT
