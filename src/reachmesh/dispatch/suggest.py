"""What to say when a caller names a task no agent declares: the nearest declared tasks.

A typo and a phrase look the same to exact match. The refusal names the declared tasks nearest
by spelling (``difflib``) and, for text that reads like a phrase, by meaning, and says how free
text is routed by meaning. This runs only on that refusal, never on a routed request.

Suggesting by meaning costs a model call, so a stranger must not be able to buy one with every
random name: it is only tried for phrase-like text (a space, or CJK), and at most
``MEANING_PER_SECOND`` times a second; cached texts cost nothing.

Suggesting by spelling costs a comparison with every declared task, and one comparison of two
long names of few letters (``abba…`` against ``abab…``, 128 characters each) about 2 ms: forty
agents declaring 64 such tasks each held the Router's loop 5.8 s for one refused name, and any
caller could send one a request. So the search runs in slices of at most ``SPELLING_SLICE_S``,
the loop serving others between two, at most ``SPELLING_BUDGET_S`` for one refusal, and all
refusals together spend at most ``SPELLING_SHARE`` of a core over time; past that a refusal
suggests what its search found so far (nothing, once the share is spent).
"""

from __future__ import annotations

import asyncio
import difflib
import heapq
import time
from collections.abc import Iterator
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
# The spelling search's work, in seconds of the Router's loop (see the module's docstring).
SPELLING_SLICE_S = 0.002
SPELLING_BUDGET_S = 0.05
SPELLING_SHARE = 0.05
# Names judged by the cheap length and letter counts alone between two looks at the time.
_CHEAP_RUN = 64

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
        # Seconds of spelling search left to spend; may go below zero by the last slice's overrun.
        self._spelling_s = SPELLING_BUDGET_S
        self._spelling_refilled = self._refilled

    def _may_embed(self) -> bool:
        now = self._clock.monotonic()
        self._tokens = min(MEANING_PER_SECOND, self._tokens + (now - self._refilled) * MEANING_PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _spelling_left(self) -> float:
        """Seconds the spelling search may spend now, the share refilled by the time passed."""
        now = self._clock.monotonic()
        refill = (now - self._spelling_refilled) * SPELLING_SHARE
        self._spelling_s = min(SPELLING_BUDGET_S, self._spelling_s + refill)
        self._spelling_refilled = now
        return self._spelling_s

    async def by_spelling(self, text: str) -> list[str]:
        """Up to three declared tasks near ``text`` by spelling, best first (``difflib``'s
        choice and order), within the search's budget: it yields to the loop between slices and
        stops when this refusal's budget, or the refusals' share, is spent."""
        if self._spelling_left() <= 0:
            return []
        started = time.perf_counter()
        declared = iter(list(self.registry.tasks()))  # a copy: registrations go on between slices
        matcher = difflib.SequenceMatcher()
        matcher.set_seq2(text)
        hits: list[tuple[float, str]] = []
        while True:
            slice_started = time.perf_counter()
            done = _compare(matcher, declared, hits, slice_started + SPELLING_SLICE_S)
            self._spelling_s -= time.perf_counter() - slice_started
            if done or self._spelling_s <= 0 or time.perf_counter() - started >= SPELLING_BUDGET_S:
                break
            await asyncio.sleep(0)
        return [task for _, task in heapq.nlargest(3, hits)]

    async def nearest(self, text: str) -> tuple[list[dict[str, Any]], str]:
        """Up to four tasks near ``text``, by spelling then by meaning, and a hint on routing by meaning."""
        found: list[dict[str, Any]] = [
            {"task": task, "by": "spelling"} for task in await self.by_spelling(text)
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


def _compare(
    matcher: difflib.SequenceMatcher[str],
    declared: Iterator[str],
    hits: list[tuple[float, str]],
    until: float,
) -> bool:
    """Score the next of ``declared`` against the matcher's text, as ``difflib.get_close_matches``
    does (the cheap bounds first), adding those at the cutoff to ``hits``, until the
    ``time.perf_counter()`` moment ``until``. True when ``declared`` is spent."""
    cheap = 0
    for task in declared:
        matcher.set_seq1(task)
        if matcher.real_quick_ratio() >= SPELLING_CUTOFF and matcher.quick_ratio() >= SPELLING_CUTOFF:
            score = matcher.ratio()  # the dear one: the time is looked at after each
            if score >= SPELLING_CUTOFF:
                hits.append((score, task))
        else:
            cheap += 1
            if cheap % _CHEAP_RUN:
                continue
        if time.perf_counter() >= until:
            return False
    return True
