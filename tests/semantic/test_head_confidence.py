"""The few-shot head's confidence: wherever the head covers the task chosen (by the head or by
similarity alone), the probability it gives that task over all its classes must reach
``head_confidence``, else the request is refused. A text near several capabilities that none of
them serves (a near-domain out-of-scope request) clears the similarity threshold, but the head
spreads its probability over them."""

from __future__ import annotations

import numpy as np
import pytest

from reachmesh.config import HEAD_CONFIDENCE, RouterConfig
from reachmesh.semantic.calibrate import PhraseColumns, Scored, evaluate, fit_head_margin, propose
from reachmesh.semantic.evaluation import cross_validate
from reachmesh.semantic.head import Head, train
from reachmesh.semantic.index import SemanticIndex

DIM = 16


def unit(v: np.ndarray) -> np.ndarray:
    out: np.ndarray = (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)
    return out


def three_tasks_and_a_described_one() -> tuple[SemanticIndex, Head, dict[str, np.ndarray]]:
    """Tasks a, b, c with six example rows each (the head's classes) and d with two rows (too
    few: similarity alone judges it)."""
    rng = np.random.default_rng(3)
    centres = {name: unit(rng.normal(size=DIM)) for name in "abcd"}
    index = SemanticIndex(dim=DIM)
    rows = {}
    for name, centre in centres.items():
        matrix = unit(centre + 0.2 * rng.normal(size=(6 if name != "d" else 2, DIM)))
        rows[name] = matrix
        index.add(f"agent-{name}", name, [f"{name}{i}" for i in range(len(matrix))], matrix)
    head = train(rows, index.generation)
    assert head is not None and head.tasks == ("a", "b", "c")
    return index, head, centres


def test_a_text_between_the_head_s_tasks_is_refused_at_a_confidence_it_does_not_reach() -> None:
    index, head, centres = three_tasks_and_a_described_one()
    between = unit(centres["a"] + centres["b"] + centres["c"])
    open_rule = index.judge(between, threshold=-1.0, margin=0.0, head=(head, 0.0, 0.0))
    assert open_rule.task in {"a", "b", "c"} and open_rule.head_p is not None
    assert open_rule.head_p < 0.9
    strict = index.judge(between, threshold=-1.0, margin=0.0, head=(head, 0.0, 0.9))
    assert strict.task is None and strict.reason == "below_threshold"
    assert strict.head_p == pytest.approx(open_rule.head_p)
    assert strict.best[0][0] == open_rule.task  # what it would have taken, for the caller's hints


def test_a_clear_text_passes_the_confidence_whoever_chose_it() -> None:
    """Right on a's examples: similarity alone decides (no other task within reach), and the
    head's probability for a is high, so a strict confidence still routes it."""
    index, head, centres = three_tasks_and_a_described_one()
    verdict = index.judge(centres["a"], threshold=-1.0, margin=0.0, head=(head, 0.0, 0.9))
    assert verdict.task == "a" and verdict.head_gap is None
    assert verdict.head_p is not None and verdict.head_p >= 0.9


def test_a_task_the_head_does_not_cover_is_judged_by_similarity_alone() -> None:
    index, head, centres = three_tasks_and_a_described_one()
    verdict = index.judge(centres["d"], threshold=-1.0, margin=0.0, head=(head, 0.0, 1.0))
    assert verdict.task == "d" and verdict.head_p is None


def test_calibration_proposes_the_confidence_that_refuses_near_out_of_scope_phrases() -> None:
    """Out-of-scope phrases score as high as in-scope ones (near-domain), so no threshold tells
    them apart; the head's probability does, and the proposal takes it."""
    scored = [Scored(f"r{i}", "a", "a", 0.2 + 0.001 * i, None, head_p=0.8 + 0.005 * i) for i in range(30)]
    scored += [Scored(f"o{i}", None, "a", 0.2 + 0.002 * i, None, head_p=0.2 + 0.01 * i) for i in range(20)]
    before = propose(scored, 0.03, head_confidences=[0.0])
    assert before.refused == 0 or before.in_scope_right == 0
    point = propose(scored, 0.03)
    assert 0.39 < point.head_confidence <= 0.8
    assert point.in_scope_right == 30 and point.refused == 20
    again = evaluate(scored, point.threshold, point.margin, point.head_margin, point.head_confidence)
    assert (again.in_scope_right, again.refused) == (30, 20)
    kept = fit_head_margin(scored, 0.1, 0.0, 0.03)
    assert kept.threshold == 0.1 and 0.39 < kept.head_confidence <= 0.8
    folds = cross_validate(scored, folds=5, max_wrong=0.03)
    assert all(len(p) == 4 and 0.39 < p[3] <= 0.8 for p in folds.points)
    assert folds.held_out.right == 30 and folds.held_out.refused == 20


def test_the_sweep_counts_every_point_as_evaluate_judges_it() -> None:
    """The columns' counts (the similarity group and the head group summed) equal evaluate()'s,
    one phrase at a time, at every margin, head margin, confidence and threshold swept."""
    rng = np.random.default_rng(11)
    scored = []
    for i in range(300):
        expect = None if rng.random() < 0.3 else "a"
        best = None if rng.random() < 0.05 else ("a" if rng.random() < 0.8 else "b")
        by_head = rng.random() < 0.5
        covered = rng.random() < 0.8
        scored.append(
            Scored(
                f"p{i}",
                expect,
                best,
                float(rng.uniform(-0.05, 0.3)) if best else 0.0,
                float(rng.uniform(-0.05, 0.3)) if rng.random() < 0.9 else None,
                float(rng.uniform(0, 1)) if by_head else None,
                float(rng.uniform(0, 1)) if covered and best else None,
            )
        )
    columns = PhraseColumns.of(scored)
    thresholds = np.array([-0.01, 0.05, 0.1, 0.2])
    points = 0
    for margin, head_margin, confidence, right, wrong, refused in columns.sweep(
        thresholds, [0.0, 0.02], [0.0, 0.5], [0.0, 0.3, 0.7]
    ):
        for i, threshold in enumerate(thresholds):
            o = evaluate(scored, float(threshold), margin, head_margin, confidence)
            assert (right[i], wrong[i], refused[i]) == (o.in_scope_right, o.in_scope_wrong, o.refused)
            points += 1
    assert points == 2 * 2 * 3 * 4


def test_the_policy_key_comes_before_the_calibration_and_the_model_s_default() -> None:
    model = "some-model"
    bare = RouterConfig.from_mapping({"embedding": {}}).embedding
    assert bare.head_confidence_for(model, None) == HEAD_CONFIDENCE
    assert bare.head_confidence_for(model, 0.4) == 0.4
    calibrated = RouterConfig.from_mapping(
        {"embedding": {"calibrations": {model: {"threshold": 0.1, "head_confidence": 0.5}}}}
    ).embedding
    assert calibrated.head_confidence_for(model, 0.4) == 0.5
    assert calibrated.head_confidence_for("other", 0.4) == 0.4
    chosen = RouterConfig.from_mapping(
        {
            "embedding": {
                "head_confidence": 0.6,
                "calibrations": {model: {"threshold": 0.1, "head_confidence": 0.5}},
            }
        }
    ).embedding
    assert chosen.head_confidence_for(model, 0.4) == 0.6


def test_the_share_of_tasks_set_aside_is_no_doubt_about_the_task_chosen() -> None:
    """A text between a and b, b set aside (a declared limit, a decline): the head's probability
    for a is judged among the tasks still allowed, so a request b may not take is not refused
    for b's share."""
    index, head, centres = three_tasks_and_a_described_one()
    between = unit(centres["a"] + centres["b"])
    plain = index.judge(between, threshold=-1.0, margin=0.0, head=(head, 0.0, 0.0))
    assert plain.head_p is not None
    kept = plain.best[0][0]
    other = "b" if kept == "a" else "a"

    def veto(task: str, score: float) -> tuple[str, str | None] | None:
        return ("declined", None) if task == other else None

    aside = index.judge(between, threshold=-1.0, margin=0.0, veto=veto, head=(head, 0.0, 0.0))
    assert aside.task == kept and aside.head_p is not None
    assert aside.head_p > plain.head_p
    assert [v[0] for v in aside.vetoed] == [other]
