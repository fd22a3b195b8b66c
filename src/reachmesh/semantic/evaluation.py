"""The honest evaluation of routing by meaning: held-out figures, never fitted ones.

Two entry points:

- :func:`cross_validate`: k-fold cross-validation on any labelled file (``reach calibrate``): the
  threshold and margin are fitted on k-1 folds and judged on the fold left out, and the figures
  printed are the sum of those judgements. The proposal for the policy is still fitted on all of
  it, but it is never the figure reported.
- :func:`evaluate_corpus`: the evaluation corpus in ``tests/data/eval`` (written by someone who
  never saw this code), split once into a calibration half and a held-out half
  (``split.yaml``). The operating point is fitted on the calibration half and reported on the
  held-out half, in three profile conditions and four language directions.

Everything here runs against whichever embedder it is given, so a team can measure its own model
(``embedding.backend: http``) on its own phrases.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reachmesh.config import HEAD_CONFIDENCE, HEAD_MARGIN
from reachmesh.exceptions import ConfigError
from reachmesh.semantic.calibrate import (
    Outcome,
    Scored,
    evaluate,
    fit_head_margin,
    load_labelled,
    propose,
    routes,
    score_phrases,
)
from reachmesh.semantic.embedders.base import Embedder

# The three ways an agent may describe a capability, from the reference profile to the richest.
CONDITIONS = ("description", "examples", "rich")
CONDITION_NAMES = {
    "description": "description only, one language",
    "examples": "description + 3 examples",
    "rich": "rich: both languages, 6 examples",
}
DIRECTIONS = ("zh→zh", "en→en", "zh→en", "en→zh")
# The share of in-scope questions the fitted operating point may send to a wrong task. Wrong
# routes cost more than refusals (a refusal names the best candidates; a wrong agent acts).
MAX_WRONG = 0.02
FOLDS = 5


@dataclass(slots=True)
class Question:
    """One labelled question: its text, language, kind and the task it should reach (or None)."""

    text: str
    lang: str
    kind: str
    expect: str | None


@dataclass(slots=True)
class Corpus:
    """Capabilities, questions and the fixed split into a calibration and a held-out half."""

    capabilities: list[dict[str, Any]]
    questions: list[Question]
    calibration: list[int]
    heldout: list[int]

    def cap_lang(self, task: str) -> str:
        return next(str(c["lang"]) for c in self.capabilities if c["task"] == task)


@dataclass(slots=True)
class Figures:
    """In-scope right and wrong, out-of-scope refused: counts, per direction where it applies."""

    right: int = 0
    wrong: int = 0
    in_scope: int = 0
    refused: int = 0
    out_of_scope: int = 0

    def add(self, other: Figures) -> None:
        self.right += other.right
        self.wrong += other.wrong
        self.in_scope += other.in_scope
        self.refused += other.refused
        self.out_of_scope += other.out_of_scope

    @staticmethod
    def pct(part: int, whole: int) -> float | None:
        return None if whole == 0 else 100.0 * part / whole

    @property
    def right_pct(self) -> float | None:
        return self.pct(self.right, self.in_scope)

    @property
    def wrong_pct(self) -> float | None:
        return self.pct(self.wrong, self.in_scope)

    @property
    def refused_pct(self) -> float | None:
        return self.pct(self.refused, self.out_of_scope)


@dataclass(slots=True)
class ConditionResult:
    """One profile condition on the held-out half: overall, and per language direction."""

    condition: str
    overall: Figures
    directions: dict[str, Figures] = field(default_factory=dict)


@dataclass(slots=True)
class CorpusReport:
    model: str
    threshold: float
    margin: float
    calibration: Outcome  # the fitted point on the calibration half (not a reported figure)
    results: list[ConditionResult]
    head_margin: float = HEAD_MARGIN
    head_confidence: float = HEAD_CONFIDENCE


def load_corpus(folder: Path) -> Corpus:
    """Read ``capabilities.yaml``, ``questions.yaml`` and ``split.yaml`` from ``folder``."""
    try:
        raw = (folder / "questions.yaml").read_bytes()
        caps = yaml.safe_load((folder / "capabilities.yaml").read_text(encoding="utf-8"))
        split = yaml.safe_load((folder / "split.yaml").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"evaluation corpus at {folder}: {exc}. The project's corpus is tests/data/eval in its "
            "source repository (not in the installed package); without --corpus, `reach calibrate` "
            "takes a YAML file of your own capabilities and labelled phrases (see "
            "docs/semantic-routing.md in that repository)"
        ) from exc
    if split.get("questions_sha256") != hashlib.sha256(raw).hexdigest():
        raise ConfigError(f"{folder}/questions.yaml changed since split.yaml was made: the split is stale")
    questions = [
        Question(str(q["q"]), str(q["lang"]), str(q["kind"]), q.get("expect")) for q in yaml.safe_load(raw)
    ]
    return Corpus(caps, questions, list(split["calibration"]), list(split["heldout"]))


def profile(cap: dict[str, Any], condition: str) -> dict[str, Any]:
    """The capability as an agent in ``condition`` would declare it (schema included: agents
    declare one, and it costs them nothing)."""
    lang = cap["lang"]
    other = "en" if lang == "zh" else "zh"
    if condition == "description":
        examples: list[str] = []
    elif condition == "examples":
        examples = list(cap.get(f"examples_{lang}") or [])[:3]
    else:
        examples = [
            cap[f"description_{other}"],
            *(cap.get("examples_en") or []),
            *(cap.get("examples_zh") or []),
        ]
    return {
        "task": cap["task"],
        "description": cap["description"],
        "examples": examples,
        "input_schema": cap.get("input_schema"),
    }


def direction(question: Question, corpus: Corpus) -> str | None:
    """``zh→en`` and so on for an in-scope question; None for one out of scope."""
    if question.expect is None:
        return None
    return f"{question.lang}→{corpus.cap_lang(question.expect)}"


async def score_questions(
    corpus: Corpus,
    condition: str,
    indices: list[int],
    embedder: Embedder,
    learned: list[tuple[str, str]] | None = None,
    *,
    head: bool = True,
) -> list[Scored]:
    caps = [profile(c, condition) for c in corpus.capabilities]
    phrases = [{"text": corpus.questions[i].text, "expect": corpus.questions[i].expect} for i in indices]
    return await score_phrases(caps, phrases, embedder, learned or (), head=head)


def confirmations(
    scored: list[Scored],
    threshold: float,
    margin: float,
    head_margin: float = HEAD_MARGIN,
    head_confidence: float = HEAD_CONFIDENCE,
) -> list[tuple[str, str]]:
    """The routes a Router with learning on would have been taught by these questions: each
    in-scope one it refused or sent to a wrong task, confirmed for its right task (by the caller's
    explicit retry after a refusal, or by an operator after a wrong route)."""
    taught = []
    for p in scored:
        routed = routes(p, threshold, margin, head_margin, head_confidence)
        if p.expect is not None and not (routed and p.best == p.expect):
            taught.append((p.text, p.expect))
    return taught


def tally(
    scored: list[Scored],
    threshold: float,
    margin: float,
    head_margin: float = HEAD_MARGIN,
    head_confidence: float = HEAD_CONFIDENCE,
) -> Figures:
    o = evaluate(scored, threshold, margin, head_margin, head_confidence)
    return Figures(o.in_scope_right, o.in_scope_wrong, o.in_scope, o.refused, o.out_of_scope)


def held_out_result(
    corpus: Corpus, condition: str, scored: list[Scored], point: tuple[float, float, float, float]
) -> ConditionResult:
    """The held-out half's ``scored`` questions at ``point``, overall and per language direction."""
    result = ConditionResult(condition, Figures())
    for i, phrase in zip(corpus.heldout, scored, strict=True):
        question = corpus.questions[i]
        one = tally([phrase], *point)
        result.overall.add(one)
        way = direction(question, corpus)
        ways = [way] if way else [d for d in DIRECTIONS if d.startswith(question.lang)]
        # An out-of-scope question has no target language: it counts under both directions
        # that start from its own language.
        for w in ways:
            result.directions.setdefault(w, Figures()).add(one)
    return result


async def evaluate_corpus(
    folder: Path,
    embedder: Embedder,
    *,
    fixed: tuple[float, float] | None = None,
    learn: bool = False,
    head: bool = True,
    budget: float = MAX_WRONG,
    head_margin: float | None = None,
    head_confidence: float | None = None,
) -> CorpusReport:
    """Fit the operating point on the calibration half (all three conditions together, as one
    Router meets all kinds of profiles), then report the held-out half with it.

    ``fixed`` skips the fit and reports the held-out half at a given (threshold, margin), e.g. the
    one shipped for the model. ``learn`` simulates learning from confirmed routes: every in-scope
    question of the *calibration* half that was refused or routed wrong is confirmed for its right
    task and indexed as a learned phrase; the held-out half (whose phrases were never confirmed)
    is then scored at the same operating point. That is what learning buys on unseen phrases.
    ``head``: with the few-shot head (as the Router routes by default); ``budget``: the share of
    in-scope calibration questions the fit may send to a wrong task; ``head_margin``: the head's
    margin to report at (with ``fixed``), else fitted with its confidence; ``head_confidence``:
    the head's confidence to report at (with ``head_margin``).
    """
    corpus = load_corpus(folder)
    calibration: list[Scored] = []
    plain: list[Scored] = []
    by_condition: dict[str, list[Scored]] = {}
    for condition in CONDITIONS:
        by_condition[condition] = await score_questions(
            corpus, condition, corpus.calibration, embedder, head=head
        )
        calibration += by_condition[condition]
        plain += await score_questions(corpus, condition, corpus.calibration, embedder, head=False)
    # Two steps: the threshold and margin by similarity alone (as before the head), then the head
    # margin with them kept, so profiles the head does not cover route exactly as before.
    fitted = propose(plain, budget)
    threshold, margin = fixed if fixed is not None else (fitted.threshold, fitted.margin)
    if head_margin is None:
        head_fit = fit_head_margin(calibration, threshold, margin, budget)
        head_margin, head_confidence = head_fit.head_margin, head_fit.head_confidence
    confidence = HEAD_CONFIDENCE if head_confidence is None else head_confidence
    results = []
    for condition in CONDITIONS:
        taught = (
            confirmations(by_condition[condition], threshold, margin, head_margin, confidence)
            if learn
            else None
        )
        scored = await score_questions(corpus, condition, corpus.heldout, embedder, taught, head=head)
        results.append(
            held_out_result(corpus, condition, scored, (threshold, margin, head_margin, confidence))
        )
    fit = evaluate(calibration, threshold, margin, head_margin, confidence)
    return CorpusReport(embedder.model, threshold, margin, fit, results, head_margin, confidence)


@dataclass(slots=True)
class CrossValidation:
    """k-fold figures: each phrase judged by an operating point fitted without it."""

    folds: int
    held_out: Figures
    # The (threshold, margin, head margin, head confidence) fitted per fold.
    points: list[tuple[float, float, float, float]]


def cross_validate(
    phrases: list[Scored], folds: int = FOLDS, max_wrong: float = MAX_WRONG, seed: int = 0
) -> CrossValidation:
    """Fit on k-1 folds, judge the fold left out; deterministic for a given seed."""
    if len(phrases) < folds:
        raise ConfigError(f"{len(phrases)} phrases cannot be split into {folds} folds")
    order = np.random.default_rng(seed).permutation(len(phrases))
    fold_of = np.empty(len(phrases), dtype=int)
    fold_of[order] = np.arange(len(phrases)) % folds
    total = Figures()
    points = []
    for k in range(folds):
        train = [p for i, p in enumerate(phrases) if fold_of[i] != k]
        test = [p for i, p in enumerate(phrases) if fold_of[i] == k]
        point = propose(train, max_wrong)
        fitted = (point.threshold, point.margin, point.head_margin, point.head_confidence)
        points.append(fitted)
        total.add(tally(test, *fitted))
    return CrossValidation(folds, total, points)


async def cross_validate_file(data: Any, embedder: Embedder, folds: int = FOLDS) -> CrossValidation:
    """:func:`cross_validate` on a labelled YAML file (``capabilities`` and ``phrases``)."""
    caps, phrases = load_labelled(data)
    return cross_validate(await score_phrases(caps, phrases, embedder), folds)
