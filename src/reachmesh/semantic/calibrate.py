"""``reach calibrate``: measure semantic routing on labelled phrases and propose thresholds.

The input is YAML: ``capabilities`` (task, description, examples, as agents declare them) and
``phrases`` (``text`` and the task it should reach, or ``null`` when it must be refused). Every
phrase is scored the way the Router scores a request, and the threshold and margin are chosen
so that no in-scope phrase would reach a wrong task, with as many right routes and refusals as
possible; the threshold sits in the middle of the gap it was found in, not on its edge.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reachmesh.config import HEAD_CONFIDENCE, HEAD_MARGIN
from reachmesh.exceptions import ConfigError
from reachmesh.semantic.embedders.base import Embedder
from reachmesh.semantic.head import query_rows, train
from reachmesh.semantic.index import BACKGROUND, LEARNED, HeadRule, SemanticIndex, Vector, capability_texts

MARGINS = [round(float(x), 4) for x in np.arange(0.0, 0.0501, 0.0025)]
# Differences of probabilities the few-shot head's choice may be asked to clear.
HEAD_MARGINS = [round(float(x), 2) for x in np.arange(0.0, 0.951, 0.05)]
# Probabilities the head may be asked to give the task chosen.
HEAD_CONFIDENCES = [round(float(x), 2) for x in np.arange(0.0, 0.951, 0.05)]
# A calibration waits for its head to be trained, but not for ever.
HEAD_BUDGET_S = 60.0


@dataclass(slots=True)
class Scored:
    """One phrase: what it should reach, the best task, its score and the runner-up's."""

    text: str
    expect: str | None
    best: str | None
    score: float
    runner_up: float | None
    # When the few-shot head chose ``best``: its probability minus the runner-up's (the head
    # margin applies, not the similarity margin).
    head_gap: float | None = None
    # When the head covers ``best``: its probability for it, over all its classes (the head
    # confidence applies).
    head_p: float | None = None

    @property
    def gap(self) -> float:
        return self.score - self.runner_up if self.runner_up is not None else 1.0


@dataclass(slots=True)
class Outcome:
    """How a threshold and margin would have done."""

    threshold: float
    margin: float
    in_scope: int
    in_scope_right: int
    in_scope_wrong: int
    out_of_scope: int
    refused: int
    head_margin: float = HEAD_MARGIN
    head_confidence: float = HEAD_CONFIDENCE

    @property
    def accuracy(self) -> float:
        return self.in_scope_right / self.in_scope if self.in_scope else 1.0

    @property
    def refusal_rate(self) -> float:
        return self.refused / self.out_of_scope if self.out_of_scope else 1.0


@dataclass(slots=True)
class Calibration:
    model: str
    phrases: list[Scored]
    proposed: Outcome
    current: Outcome | None = None
    distributions: dict[str, list[float]] = field(default_factory=dict)


def load_labelled(data: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Validate the YAML mapping; raises ConfigError naming what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError("calibration file: the top level must be a mapping with capabilities and phrases")
    caps, phrases = data.get("capabilities"), data.get("phrases")
    if not isinstance(caps, list) or not caps:
        raise ConfigError("calibration file: capabilities must be a non-empty list")
    if not isinstance(phrases, list) or not phrases:
        raise ConfigError("calibration file: phrases must be a non-empty list")
    tasks = set()
    for i, cap in enumerate(caps):
        if not isinstance(cap, dict) or not isinstance(cap.get("task"), str):
            raise ConfigError(f"calibration file: capabilities.{i}.task must be a string")
        tasks.add(cap["task"])
    for i, phrase in enumerate(phrases):
        if not isinstance(phrase, dict) or not isinstance(phrase.get("text"), str):
            raise ConfigError(f"calibration file: phrases.{i}.text must be a string")
        if phrase.get("expect") is not None and phrase["expect"] not in tasks:
            raise ConfigError(
                f"calibration file: phrases.{i}.expect {phrase['expect']!r} is not a capability"
            )
    return caps, phrases


def routes(p: Scored, threshold: float, margin: float, head_margin: float, head_confidence: float) -> bool:
    """Whether the Router would route ``p`` at this operating point (to ``p.best``)."""
    clear = p.gap >= margin if p.head_gap is None else p.head_gap >= head_margin
    sure = p.head_p is None or p.head_p >= head_confidence
    return p.best is not None and p.score >= threshold and clear and sure


def evaluate(
    phrases: list[Scored],
    threshold: float,
    margin: float,
    head_margin: float = HEAD_MARGIN,
    head_confidence: float = HEAD_CONFIDENCE,
) -> Outcome:
    right = wrong = refused = in_scope = out = 0
    for p in phrases:
        routed = routes(p, threshold, margin, head_margin, head_confidence)
        if p.expect is None:
            out += 1
            refused += not routed
        else:
            in_scope += 1
            right += routed and p.best == p.expect
            wrong += routed and p.best != p.expect
    right, wrong, refused = int(right), int(wrong), int(refused)
    return Outcome(threshold, margin, in_scope, right, wrong, out, refused, head_margin, head_confidence)


# One point of a sweep: margin, head margin, head confidence, and at every threshold the
# in-scope phrases routed right, routed wrong, and the out-of-scope ones refused.
SweepPoint = tuple[float, float, float, np.ndarray, np.ndarray, np.ndarray]


def _at_least(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """How many of ``scores`` are at or above each threshold."""
    ordered = np.sort(scores)
    return len(ordered) - np.searchsorted(ordered, thresholds, side="left")


@dataclass(frozen=True)
class PhraseColumns:
    """Scored phrases as columns, to judge every operating point at once."""

    score: np.ndarray
    by_head: np.ndarray  # the head decided (its gap counts), else the similarity margin
    gap: np.ndarray
    head_gap: np.ndarray
    head_p: np.ndarray  # the head's probability for the task chosen; NaN where it covers none
    inside: np.ndarray  # an in-scope phrase
    right_task: np.ndarray  # its best task is the expected one

    @classmethod
    def of(cls, phrases: list[Scored]) -> PhraseColumns:
        return cls(
            score=np.array([p.score if p.best is not None else -np.inf for p in phrases]),
            by_head=np.array([p.head_gap is not None for p in phrases], dtype=bool),
            gap=np.array([p.gap for p in phrases]),
            head_gap=np.array([p.head_gap if p.head_gap is not None else 0.0 for p in phrases]),
            head_p=np.array([p.head_p if p.head_p is not None else np.nan for p in phrases]),
            inside=np.array([p.expect is not None for p in phrases], dtype=bool),
            right_task=np.array([p.best is not None and p.best == p.expect for p in phrases], dtype=bool),
        )

    def _counts(self, kept: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, ...]:
        """Among the phrases ``kept`` (by the margins and the confidence), at every threshold:
        in-scope ones routed right, routed wrong, and out-of-scope ones routed."""
        inside, right_task, score = self.inside, self.right_task, self.score
        right = _at_least(score[kept & inside & right_task], thresholds)
        wrong = _at_least(score[kept & inside & ~right_task], thresholds)
        routed_out = _at_least(score[kept & ~inside], thresholds)
        return right, wrong, routed_out

    def sweep(
        self,
        thresholds: np.ndarray,
        margins: Sequence[float],
        head_margins: Sequence[float],
        head_confidences: Sequence[float] = (HEAD_CONFIDENCE,),
    ) -> Iterator[SweepPoint]:
        """Every margin, head margin and head confidence that can matter, with the counts at
        every threshold. The similarity margin judges the phrases the head did not decide, the
        head margin those it did: their counts add up, so each group is counted once per
        confidence and the pairs are sums."""
        by_head, covered = self.by_head, ~np.isnan(self.head_p)
        out_of_scope = int((~self.inside).sum())
        for confidence in head_confidences if covered.any() else [HEAD_CONFIDENCE]:
            sure = ~covered | (np.nan_to_num(self.head_p, nan=1.0) >= confidence)
            plain = [
                (m, self._counts(~by_head & sure & (self.gap >= m), thresholds))
                for m in (margins if (~by_head).any() else [0.0])
            ]
            headed = [
                (h, self._counts(by_head & sure & (self.head_gap >= h), thresholds))
                for h in (head_margins if by_head.any() else [HEAD_MARGIN])
            ]
            for margin, (r1, w1, o1) in plain:
                for head_margin, (r2, w2, o2) in headed:
                    yield margin, head_margin, confidence, r1 + r2, w1 + w2, out_of_scope - o1 - o2


def propose(
    phrases: list[Scored],
    max_wrong: float = 0.0,
    *,
    margins: Sequence[float] = MARGINS,
    head_margins: Sequence[float] = HEAD_MARGINS,
    head_confidences: Sequence[float] = HEAD_CONFIDENCES,
) -> Outcome:
    """The threshold, margin, head margin and head confidence with the most right routes plus
    refusals, among those sending at most ``max_wrong`` of the in-scope phrases to a wrong task
    (the error budget; 0: none)."""
    columns = PhraseColumns.of(phrases)
    # Candidates on the 4-decimal grid the proposal is printed in, just below and above each
    # score: the point proposed is judged exactly as it will be applied.
    scores = columns.score[np.isfinite(columns.score)]
    grid = np.floor(scores * 10_000) / 10_000 if len(scores) else np.zeros(1)
    thresholds = np.unique(np.concatenate([grid, grid + 0.0001, [grid.max() + 0.001]]))
    allowed = max_wrong * int(columns.inside.sum())
    best: tuple[tuple[float, ...], float, float, float, float] | None = None
    sweep = columns.sweep(thresholds, margins, head_margins, head_confidences)
    for margin, head_margin, confidence, right, wrong, refused in sweep:
        value = np.where(wrong <= allowed, right + refused, -1)
        i = int(np.argmax(value))  # the lowest threshold among the best: fewest refusals
        if value[i] < 0:
            continue
        key = (float(value[i]), -margin, -head_margin, -confidence)
        if best is None or key > best[0]:
            best = (key, float(thresholds[i]), margin, head_margin, confidence)
    assert best is not None  # the highest threshold refuses everything: always admissible
    return evaluate(phrases, round(best[1], 4), best[2], best[3], best[4])


def fit_head_margin(phrases: list[Scored], threshold: float, margin: float, max_wrong: float) -> Outcome:
    """The head margin and head confidence with the most right routes plus refusals within
    ``max_wrong``, the threshold and margin kept as they are (so capabilities the head does not
    cover, those with a description only, are routed exactly as before)."""
    inside = sum(1 for p in phrases if p.expect is not None)
    best: Outcome | None = None
    # Ties go to the larger margin and confidence: fewer guesses.
    for head_margin in reversed(HEAD_MARGINS):
        for confidence in reversed(HEAD_CONFIDENCES):
            outcome = evaluate(phrases, threshold, margin, head_margin, confidence)
            if outcome.in_scope_wrong > max_wrong * inside:
                continue
            if best is None or outcome.in_scope_right + outcome.refused > best.in_scope_right + best.refused:
                best = outcome
    return best if best is not None else evaluate(phrases, threshold, margin, 1.0, 1.0)


def score_index(
    index: SemanticIndex,
    background: Vector,
    phrases: Sequence[tuple[str, str | None]],
    queries: Vector,
    head: HeadRule | None,
) -> list[Scored]:
    """Score (text, expected task) phrases against ``index`` as the Router decides a request:
    the few-shot head ordering the nearest tasks where it covers them (its margin left for
    :func:`propose`), else similarity alone."""
    rule = None if head is None else (head[0], 0.0, 0.0)
    scored = []
    for (text, expect), query in zip(phrases, queries, strict=True):
        verdict = index.judge(query, -10.0, 0.0, float((background @ query).mean()), None, rule)
        best = verdict.best
        scored.append(
            Scored(
                text,
                expect,
                best[0][0] if best else None,
                best[0][1] if best else 0.0,
                best[1][1] if len(best) > 1 else None,
                verdict.head_gap,
                verdict.head_p,
            )
        )
    return scored


async def score_phrases(
    caps: list[dict[str, Any]],
    phrases: list[dict[str, Any]],
    embedder: Embedder,
    learned: Sequence[tuple[str, str]] = (),
    *,
    head: bool = True,
) -> list[Scored]:
    """Score every phrase against the capabilities exactly as the Router scores a request.

    ``learned``: (phrase, task) routes confirmed before, indexed as the Router indexes them (one
    more example row of their task), to measure what learning buys on phrases never seen.
    ``head``: with the few-shot head trained on them, as the Router routes by default.
    """
    index = SemanticIndex(dim=embedder.dim or 384)
    # The same texts embedded as queries: what the head trains on (semantic/headrows.py).
    asked = SemanticIndex(dim=embedder.dim or 384)
    for cap in caps:
        texts = capability_texts(
            cap["task"], str(cap.get("description") or ""), list(cap.get("examples") or [])
        )
        index.add(f"calibration:{cap['task']}", cap["task"], texts, await embedder.embed(texts, "passage"))
        if head:
            asked.add(f"calibration:{cap['task']}", cap["task"], texts, await embedder.embed(texts, "query"))
    if learned:
        texts = [text for text, _ in learned]
        rows = await embedder.embed(texts, "passage")
        again = await embedder.embed(texts, "query") if head else rows
        for i, ((text, task), row) in enumerate(zip(learned, rows, strict=True)):
            index.add(f"{LEARNED}{i}", task, [text], row[None, :])
            asked.add(f"{LEARNED}{i}", task, [text], again[i][None, :])
    background = await embedder.embed(list(BACKGROUND), "passage")
    queries = await embedder.embed([p["text"] for p in phrases], "query")
    rows_q = query_rows(index.task_matrices(), asked.task_matrices()) if head else None
    model = train(rows_q, index.generation, budget_s=HEAD_BUDGET_S) if rows_q is not None else None
    labelled = [(str(p["text"]), p.get("expect")) for p in phrases]
    return score_index(index, background, labelled, queries, None if model is None else (model, 0.0, 0.0))


async def calibrate(
    data: Any,
    embedder: Embedder,
    *,
    current: tuple[float, ...] | None = None,
    budget: float = 0.03,
) -> Calibration:
    """Score every phrase as the Router would, and propose the operating point with the most
    right routes within the wrong-route ``budget``."""
    caps, phrases = load_labelled(data)
    scored = await score_phrases(caps, phrases, embedder)
    result = Calibration(embedder.model, scored, propose(scored, budget))
    if current is not None:
        result.current = evaluate(scored, *current)
    result.distributions = {
        "in_scope_right_task": sorted(p.score for p in scored if p.expect and p.best == p.expect),
        "in_scope_wrong_task": sorted(p.score for p in scored if p.expect and p.best != p.expect),
        "out_of_scope": sorted(p.score for p in scored if p.expect is None),
    }
    return result
