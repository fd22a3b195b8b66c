"""The error budget of `reach calibrate`: the most right routes within the wrong-route share
the operator accepts, the head's margin fitted beside the threshold."""

from __future__ import annotations

from reachmesh.semantic.calibrate import Scored, evaluate, fit_head_margin, propose


def phrases() -> list[Scored]:
    """40 in-scope phrases, the right task scoring 0.10-0.30; two wrong ones scoring high-ish
    (0.20, 0.25); 10 out-of-scope phrases below 0.12."""
    out = [Scored(f"r{i}", "a", "a", 0.10 + 0.005 * i, None) for i in range(40)]
    out += [Scored("w1", "a", "b", 0.20, None), Scored("w2", "a", "b", 0.25, None)]
    out += [Scored(f"o{i}", None, "a", 0.02 + 0.01 * i, None) for i in range(10)]
    return out


def test_a_budget_buys_right_routes_that_zero_wrong_refuses() -> None:
    """With no wrong route allowed the threshold must sit above both wrong phrases and refuses
    most of the right ones; a 5% budget (2 of 42) takes them, and stays within it."""
    strict = propose(phrases(), 0.0)
    assert strict.in_scope_wrong == 0 and strict.in_scope_right <= 10
    budget = propose(phrases(), 0.05)
    assert budget.in_scope_wrong <= 0.05 * budget.in_scope
    assert budget.in_scope_right >= 35


def test_the_head_margin_is_fitted_where_the_head_decided() -> None:
    """Phrases the head decided clear the head margin, not the similarity margin: a head that
    hesitated (gap 0.1) on the wrong ones is held back by a margin above it."""
    scored = [Scored(f"r{i}", "a", "a", 0.2, 0.19, head_gap=0.9) for i in range(20)]
    scored += [Scored(f"w{i}", "a", "b", 0.2, 0.19, head_gap=0.1) for i in range(5)]
    point = propose(scored, 0.0)
    assert point.in_scope_right == 20 and point.in_scope_wrong == 0
    assert 0.1 < point.head_margin <= 0.9
    kept = fit_head_margin(scored, 0.1, 0.05, 0.0)
    assert kept.threshold == 0.1 and kept.margin == 0.05  # only the head margin moves
    assert evaluate(scored, 0.1, 0.05, kept.head_margin).in_scope_wrong == 0
