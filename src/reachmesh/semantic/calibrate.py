"""``reach calibrate``: measure semantic routing on labelled phrases and propose thresholds.

The input is YAML: ``capabilities`` (task, description, examples, as agents declare them) and
``phrases`` (``text`` and the task it should reach, or ``null`` when it must be refused). Every
phrase is scored the way the Router scores a request, and the threshold and margin are chosen
so that no in-scope phrase would reach a wrong task, with as many right routes and refusals as
possible; the threshold sits in the middle of the gap it was found in, not on its edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reachmesh.exceptions import ConfigError
from reachmesh.semantic.embedders.base import Embedder
from reachmesh.semantic.index import BACKGROUND, LEARNED, SemanticIndex, capability_texts

MARGINS = [round(float(x), 4) for x in np.arange(0.0, 0.0501, 0.0025)]


@dataclass(slots=True)
class Scored:
    """One phrase: what it should reach, the best task, its score and the runner-up's."""

    text: str
    expect: str | None
    best: str | None
    score: float
    runner_up: float | None

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


def evaluate(phrases: list[Scored], threshold: float, margin: float) -> Outcome:
    right = wrong = refused = in_scope = out = 0
    for p in phrases:
        routed = p.best is not None and p.score >= threshold and p.gap >= margin
        if p.expect is None:
            out += 1
            refused += not routed
        else:
            in_scope += 1
            right += routed and p.best == p.expect
            wrong += routed and p.best != p.expect
    right, wrong, refused = int(right), int(wrong), int(refused)
    return Outcome(threshold, margin, in_scope, right, wrong, out, refused)


def propose(phrases: list[Scored], max_wrong: float = 0.0) -> Outcome:
    """The threshold and margin with the most right routes plus refusals, among those sending at
    most ``max_wrong`` of the in-scope phrases to a wrong task (0: none)."""
    score = np.array([p.score for p in phrases])
    gap = np.array([p.gap for p in phrases])
    inside = np.array([p.expect is not None for p in phrases])
    right_task = np.array([p.best is not None and p.best == p.expect for p in phrases])
    levels = np.unique(np.round(score, 6))
    thresholds = np.concatenate([[levels[0] - 0.001], (levels[:-1] + levels[1:]) / 2, [levels[-1] + 0.001]])
    allowed = max_wrong * int(inside.sum())
    best: tuple[tuple[float, float], float, float] | None = None
    for margin in MARGINS:
        # Every threshold at once: rows are thresholds, columns phrases.
        routed = (score[None, :] >= thresholds[:, None]) & (gap[None, :] >= margin)
        right = (routed & inside & right_task).sum(axis=1)
        wrong = (routed & inside & ~right_task).sum(axis=1)
        refused = (~routed & ~inside).sum(axis=1)
        for i in np.flatnonzero(wrong <= allowed):
            key = (float(right[i] + refused[i]), -margin)
            if best is None or key > best[0]:
                best = (key, float(thresholds[i]), margin)
    assert best is not None  # the highest threshold refuses everything: always admissible
    return evaluate(phrases, round(best[1], 4), best[2])


async def score_phrases(
    caps: list[dict[str, Any]],
    phrases: list[dict[str, Any]],
    embedder: Embedder,
    learned: Sequence[tuple[str, str]] = (),
) -> list[Scored]:
    """Score every phrase against the capabilities exactly as the Router scores a request.

    ``learned``: (phrase, task) routes confirmed before, indexed as the Router indexes them (one
    more example row of their task), to measure what learning buys on phrases never seen.
    """
    index = SemanticIndex(dim=embedder.dim or 384)
    for cap in caps:
        texts = capability_texts(
            cap["task"], str(cap.get("description") or ""), list(cap.get("examples") or [])
        )
        index.add(f"calibration:{cap['task']}", cap["task"], texts, await embedder.embed(texts, "passage"))
    if learned:
        rows = await embedder.embed([text for text, _ in learned], "passage")
        for i, ((text, task), row) in enumerate(zip(learned, rows, strict=True)):
            index.add(f"{LEARNED}{i}", task, [text], row[None, :])
    background = await embedder.embed(list(BACKGROUND), "passage")
    queries = await embedder.embed([p["text"] for p in phrases], "query")
    scored = []
    for phrase, query in zip(phrases, queries, strict=True):
        best = index.nearest(query, 3, float((background @ query).mean()))
        scored.append(
            Scored(
                phrase["text"],
                phrase.get("expect"),
                best[0][0] if best else None,
                best[0][1] if best else 0.0,
                best[1][1] if len(best) > 1 else None,
            )
        )
    return scored


async def calibrate(
    data: Any, embedder: Embedder, *, current: tuple[float, float] | None = None
) -> Calibration:
    """Score every phrase as the Router would, and propose a threshold and margin."""
    caps, phrases = load_labelled(data)
    scored = await score_phrases(caps, phrases, embedder)
    result = Calibration(embedder.model, scored, propose(scored))
    if current is not None:
        result.current = evaluate(scored, *current)
    result.distributions = {
        "in_scope_right_task": sorted(p.score for p in scored if p.expect and p.best == p.expect),
        "in_scope_wrong_task": sorted(p.score for p in scored if p.expect and p.best != p.expect),
        "out_of_scope": sorted(p.score for p in scored if p.expect is None),
    }
    return result
