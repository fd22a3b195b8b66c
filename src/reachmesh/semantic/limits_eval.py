"""The honest measurement of declared limits and declines on the evaluation corpus.

``reach calibrate --corpus tests/data/eval --limits``: every capability also declares the limits
of ``limits.yaml`` (written from the capability descriptions alone, before any score, its hash in
``split.yaml``). The limit margin is fitted on the calibration half, with the threshold and margin
of the model held where they are (an operating point shared by agents with and without limits),
and the held-out half is reported:

- per profile condition (description only; + 3 examples), with limits: in-scope right and wrong,
  near misses refused and plain out-of-scope questions refused, as separate figures;
- the same without limits, at the same operating point, for comparison;
- declining agents, simulated from the labels (an agent declines what is not its task): the
  Router tries the chosen task, then each runner-up above the threshold, as it does after a
  decline. No route can be wrong; the figures are right, refused, and the mean number of agents
  tried per request. Its threshold and margin are fitted on the calibration half for the most
  right routes with at most :data:`MAX_TRIED` agents tried on average.

Everything is scored as the Router scores a request (:class:`~.index.SemanticIndex`, its veto and
its alternates), so the figures are the Router's, not a model of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reachmesh.exceptions import ConfigError
from reachmesh.semantic.embedders.base import Embedder, calibrated_thresholds
from reachmesh.semantic.evaluation import MAX_WRONG, Corpus, load_corpus, profile
from reachmesh.semantic.index import BACKGROUND, SemanticIndex, capability_texts, language_means, limit_rows

LIMIT_CONDITIONS = ("description", "examples")
LIMIT_CONDITION_NAMES = {"description": "description + limits", "examples": "+ 3 examples + limits"}
# The limit margins tried when fitting (a cosine of residuals, SemanticIndex.limit_hits), low (a
# limit wins easily) to high (it must match clearly).
LIMIT_MARGINS = [round(float(x), 4) for x in np.arange(0.0, 0.8001, 0.01)]
# Declining agents: the most agents a request may try on average, as the goal sets it.
MAX_TRIED = 1.5
# How many tasks a route by meaning looks at before the veto (as SemanticIndex.judge does).
TOP = 6


@dataclass(slots=True)
class Ranked:
    """One question: what it should reach, its kind, and the nearest tasks with their scores and
    how well their best limit matched beyond the task (None: the task declares none)."""

    expect: str | None
    kind: str
    # The nearest six (looked at after a veto): task, score, and its best limit's match beyond
    # what the task explains (None: no limits).
    top: list[tuple[str, float, float | None]]
    first: list[tuple[str, float, float | None]] = field(default_factory=list)  # the nearest three


@dataclass(slots=True)
class Row:
    """Held-out figures of one profile condition (counts)."""

    name: str
    right: int = 0
    wrong: int = 0
    in_scope: int = 0
    near_refused: int = 0
    near: int = 0
    plain_refused: int = 0
    plain: int = 0
    tried: int = 0  # agents tried in all (declining agents only)
    top1: int = 0
    top3: int = 0

    def pct(self, part: int, whole: int) -> float:
        return 100.0 * part / whole if whole else 0.0

    @property
    def mean_tried(self) -> float:
        return self.tried / (self.in_scope + self.near + self.plain or 1)


@dataclass(slots=True)
class LimitsReport:
    model: str
    threshold: float
    margin: float
    limit_margin: float
    decline_point: dict[str, tuple[float, float]]  # per condition: the declining agents' fit
    rows: list[Row] = field(default_factory=list)
    limits_sha256: str = ""


def load_limits(folder: Path, corpus: Corpus) -> tuple[dict[str, list[str]], str]:
    """``limits.yaml`` checked against the hash ``split.yaml`` holds, and against the tasks."""
    try:
        raw = (folder / "limits.yaml").read_bytes()
        split = yaml.safe_load((folder / "split.yaml").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"evaluation corpus at {folder}: {exc}") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if split.get("limits_sha256") != digest:
        raise ConfigError(f"{folder}/limits.yaml changed since its hash went into split.yaml")
    limits = yaml.safe_load(raw) or {}
    tasks = {str(c["task"]) for c in corpus.capabilities}
    unknown = sorted(set(limits) - tasks)
    if unknown:
        raise ConfigError(f"{folder}/limits.yaml names tasks the corpus does not have: {unknown}")
    return {str(k): [str(x) for x in v or []] for k, v in limits.items()}, digest


async def rank_questions(
    corpus: Corpus,
    condition: str,
    indices: list[int],
    embedder: Embedder,
    limits: dict[str, list[str]] | None,
) -> list[Ranked]:
    """Each question's nearest tasks, scored as the Router scores them, with their limit deltas."""
    index = SemanticIndex(dim=embedder.dim or 384)
    for cap in (profile(c, condition) for c in corpus.capabilities):
        task = cap["task"]
        texts = capability_texts(task, str(cap["description"]), list(cap["examples"]))
        index.add(f"eval:{task}", task, texts, await embedder.embed(texts, "passage"))
        if limits and limits.get(task):
            key, rows = limit_rows(task, limits[task])
            index.add(f"eval:{task}", key, rows, await embedder.embed(rows, "passage"))
    background = await embedder.embed(list(BACKGROUND), "passage")
    languages = language_means(background)
    queries = await embedder.embed([corpus.questions[i].text for i in indices], "query")
    ranked = []
    for i, query in zip(indices, queries, strict=True):
        baseline = float((background @ query).mean())
        top: list[tuple[str, float, float | None]] = []
        first: list[tuple[str, float, float | None]] = []
        for k, out in ((TOP, top), (3, first)):
            for task, score in index.nearest(query, k, baseline):
                hit = index.limit_hit(query, task, languages)
                out.append((task, score, None if hit is None else hit[0]))
        question = corpus.questions[i]
        ranked.append(Ranked(question.expect, question.kind, top, first))
    return ranked


def route(r: Ranked, threshold: float, margin: float, limit_margin: float | None) -> list[str]:
    """The tasks the Router would try, in order: the chosen one, then the runner-ups above the
    threshold (tried only after a decline). Empty: refused."""

    def stands(d: float | None) -> bool:
        return limit_margin is None or d is None or d <= limit_margin

    # As SemanticIndex.judge: the nearest three, and the nearest six once one of those is vetoed.
    first = r.first or r.top[:3]
    looked = first if all(stands(d) for _, _, d in first) else r.top
    kept = [(t, s) for t, s, d in looked if stands(d)][:3]
    if not kept or kept[0][1] < threshold:
        return []
    if len(kept) > 1 and kept[0][1] - kept[1][1] < margin:
        return []
    return [t for t, s in kept if s >= threshold]


def tally(name: str, ranked: list[Ranked], point: tuple[float, float], limit_margin: float | None) -> Row:
    """Right, wrong and refusals when agents take whatever they are sent."""
    row = Row(name)
    for r in ranked:
        tried = route(r, *point, limit_margin)
        chosen = tried[0] if tried else None
        _count_kind(row, r, refused=chosen is None)
        if r.expect is not None:
            row.right += chosen == r.expect
            row.wrong += chosen is not None and chosen != r.expect
    return row


def declining(name: str, ranked: list[Ranked], point: tuple[float, float], limit_margin: float | None) -> Row:
    """Right and refusals when each agent declines what is not its task, and agents tried."""
    row = Row(name)
    for r in ranked:
        tried = route(r, *point, limit_margin)
        found = r.expect is not None and r.expect in tried
        row.tried += tried.index(r.expect) + 1 if found and r.expect is not None else len(tried)
        _count_kind(row, r, refused=not found)
        row.right += found
        tasks = [t for t, _, _ in r.top]
        row.top1 += bool(tasks) and tasks[0] == r.expect
        row.top3 += r.expect in tasks[:3]
    return row


def _count_kind(row: Row, r: Ranked, *, refused: bool) -> None:
    if r.expect is not None:
        row.in_scope += 1
    elif r.kind == "near_miss":
        row.near += 1
        row.near_refused += refused
    else:
        row.plain += 1
        row.plain_refused += refused


def fit_limit_margin(ranked: list[Ranked], point: tuple[float, float]) -> float:
    """The limit margin with the most right routes plus refusals on ``ranked``, sending no more
    questions to a wrong task than the same profiles without limits (nor more than
    :data:`MAX_WRONG`, when they do better); ties go to the highest margin (fewest vetoes)."""
    plain = tally("fit", ranked, point, None)
    allowed = max(plain.wrong, MAX_WRONG * plain.in_scope)
    best: tuple[tuple[int, float], float] | None = None
    for limit_margin in LIMIT_MARGINS:
        row = tally("fit", ranked, point, limit_margin)
        if row.wrong > allowed:
            continue
        key = (row.right + row.near_refused + row.plain_refused, limit_margin)
        if best is None or key > best[0]:
            best = (key, limit_margin)
    return LIMIT_MARGINS[-1] if best is None else best[1]


def fit_declining(ranked: list[Ranked], limit_margin: float | None) -> tuple[float, float]:
    """The threshold and margin with the most right routes by declining agents, at most
    :data:`MAX_TRIED` agents tried per request on average."""
    scores = sorted({round(s, 4) for r in ranked for _, s, _ in r.top})
    best: tuple[tuple[int, float], tuple[float, float]] | None = None
    for threshold in scores[:: max(1, len(scores) // 400)]:
        for margin in (0.0, 0.005, 0.01, 0.015):
            row = declining("fit", ranked, (threshold, margin), limit_margin)
            if row.mean_tried > MAX_TRIED:
                continue
            key = (row.right + row.near_refused + row.plain_refused, -threshold)
            if best is None or key > best[0]:
                best = (key, (threshold, margin))
    if best is None:
        raise ConfigError(f"no threshold keeps declining agents under {MAX_TRIED} tries per request")
    return best[1]


async def evaluate_limits(
    folder: Path, embedder: Embedder, point: tuple[float, float] | None
) -> LimitsReport:
    """Fit the limit margin (and the declining agents' point) on the calibration half; report
    the held-out half. ``point``: the model's (threshold, margin); None takes its calibration."""
    corpus = load_corpus(folder)
    limits, digest = load_limits(folder, corpus)
    point = point or calibrated_thresholds(embedder.model)
    if point is None:
        raise ConfigError(f"{embedder.model} has no threshold yet: run `reach calibrate --corpus` first")
    fit: list[Ranked] = []
    held: dict[str, tuple[list[Ranked], list[Ranked]]] = {}
    for condition in LIMIT_CONDITIONS:
        with_limits = await rank_questions(corpus, condition, corpus.heldout, embedder, limits)
        without = await rank_questions(corpus, condition, corpus.heldout, embedder, None)
        held[condition] = (with_limits, without)
        fit += await rank_questions(corpus, condition, corpus.calibration, embedder, limits)
    limit_margin = fit_limit_margin(fit, point)
    report = LimitsReport(embedder.model, point[0], point[1], limit_margin, {}, limits_sha256=digest)
    for condition in LIMIT_CONDITIONS:
        with_limits, without = held[condition]
        name = LIMIT_CONDITION_NAMES[condition]
        report.rows.append(tally(f"{name.replace(' + limits', '')}, no limits", without, point, None))
        report.rows.append(tally(name, with_limits, point, limit_margin))
    for condition in LIMIT_CONDITIONS:
        own = await rank_questions(corpus, condition, corpus.calibration, embedder, limits)
        decline_point = fit_declining(own, limit_margin)
        report.decline_point[condition] = decline_point
        name = f"{LIMIT_CONDITION_NAMES[condition]}, declining agents"
        report.rows.append(declining(name, held[condition][0], decline_point, limit_margin))
    return report


def summary(report: LimitsReport) -> list[dict[str, Any]]:
    """The report's rows as percentages, for printing and for docs."""
    rows = []
    for row in report.rows:
        rows.append(
            {
                "profiles": row.name,
                "right": row.pct(row.right, row.in_scope),
                "wrong": row.pct(row.wrong, row.in_scope),
                "near": row.pct(row.near_refused, row.near),
                "plain": row.pct(row.plain_refused, row.plain),
                "tried": row.mean_tried if row.tried else None,
                "top1": row.pct(row.top1, row.in_scope) if row.tried else None,
                "top3": row.pct(row.top3, row.in_scope) if row.tried else None,
            }
        )
    return rows
