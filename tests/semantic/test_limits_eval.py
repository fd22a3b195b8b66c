"""The limits evaluation: its guard on the blind limits, and its scoring rules on small cases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reachmesh.exceptions import ConfigError
from reachmesh.semantic.evaluation import load_corpus
from reachmesh.semantic.limits_eval import (
    Ranked,
    declining,
    fit_limit_margin,
    load_limits,
    route,
    tally,
)

CORPUS = Path(__file__).resolve().parent.parent / "data" / "eval"
POINT = (0.08, 0.015)


def test_the_blind_limits_match_the_hash_committed_before_any_score() -> None:
    corpus = load_corpus(CORPUS)
    limits, digest = load_limits(CORPUS, corpus)
    assert set(limits) == {c["task"] for c in corpus.capabilities}
    assert all(2 <= len(v) <= 10 for v in limits.values())
    assert len(digest) == 64


def test_a_changed_limits_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "eval"
    shutil.copytree(CORPUS, folder)
    with (folder / "limits.yaml").open("a", encoding="utf-8") as f:
        f.write("weather.forecast:\n  - tuned after seeing a score\n")
    with pytest.raises(ConfigError, match="changed since its hash"):
        load_limits(folder, load_corpus(folder))


def test_a_limit_sets_a_task_aside_and_its_runner_up_is_judged_instead() -> None:
    near_miss = Ranked(None, "near_miss", [("track", 0.12, 0.05), ("price", 0.07, None)])
    assert route(near_miss, *POINT, None) == ["track"]  # without limits: a wrong route
    assert route(near_miss, *POINT, 0.03) == []  # the limit wins by 0.05 > 0.03; price is too low
    assert route(near_miss, *POINT, 0.06) == ["track"]  # not by enough
    close = Ranked("track", "terse", [("track", 0.12, None), ("price", 0.11, 0.0), ("weather", 0.09, None)])
    assert route(close, *POINT, None) == []  # ambiguous
    assert route(close, *POINT, -0.01) == ["track", "weather"]  # price set aside: clear, and a runner-up


def test_tally_counts_near_misses_and_plain_questions_apart() -> None:
    ranked = [
        Ranked("a", "terse", [("a", 0.2, None)]),
        Ranked("a", "terse", [("b", 0.2, None)]),
        Ranked(None, "near_miss", [("a", 0.2, 0.1)]),
        Ranked(None, "out_of_scope", [("a", 0.01, None)]),
    ]
    row = tally("t", ranked, POINT, 0.0)
    assert (row.right, row.wrong, row.in_scope) == (1, 1, 2)
    assert (row.near_refused, row.near, row.plain_refused, row.plain) == (1, 1, 1, 1)


def test_declining_agents_are_never_wrong_and_count_the_agents_tried() -> None:
    ranked = [
        Ranked("b", "terse", [("a", 0.2, None), ("b", 0.15, None), ("c", 0.01, None)]),
        Ranked(None, "near_miss", [("a", 0.2, None), ("b", 0.15, None)]),
        Ranked("c", "terse", [("a", 0.2, None), ("b", 0.15, None), ("c", 0.01, None)]),
    ]
    row = declining("d", ranked, POINT, None)
    assert (row.right, row.wrong, row.near_refused) == (1, 0, 1)
    assert row.tried == 2 + 2 + 2 and row.top3 == 2 and row.top1 == 0


def test_the_fitted_limit_margin_never_adds_wrong_routes() -> None:
    ranked = [
        # The limit only helps: a near miss refused.
        Ranked(None, "near_miss", [("a", 0.2, 0.04), ("b", 0.05, None)]),
        # A low margin would set "a" aside and route to "b": wrong.
        Ranked("a", "terse", [("a", 0.2, 0.01), ("b", 0.15, None)]),
    ]
    margin = fit_limit_margin(ranked, POINT)
    assert 0.01 <= margin < 0.04
    assert tally("t", ranked, POINT, margin).wrong == 0
