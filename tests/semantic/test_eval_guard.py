"""The regression guard: the held-out half of the evaluation corpus with the bundled model.

The floors are the held-out figures reached when the operating point was fitted on the
calibration half (docs/semantic-routing.md, "Measured accuracy"), minus a margin of 3 points for right
and refused and plus 2 points for wrong. The held-out half holds 78 in-scope and 36 out-of-scope
questions per language, so one question is 0.6-1.4 points; the margin absorbs a changed tie or
two, not a mechanism that got worse. The embedder and the scoring are deterministic, so the run
gives the same figures every time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reachmesh.semantic.embedders.base import calibrated_head_confidence, calibrated_head_margin
from reachmesh.semantic.embedders.local import LocalEmbedder
from reachmesh.semantic.evaluation import evaluate_corpus

CORPUS = Path(__file__).resolve().parent.parent / "data" / "eval"

# condition -> (right %, wrong %, refused %) reached on the held-out half.
REACHED = {
    "description": (20.0, 4.5, 86.1),
    "examples": (27.1, 0.6, 81.9),
    "rich": (40.0, 1.9, 84.7),
}
MARGIN_RIGHT = 3.0
MARGIN_WRONG = 2.0


@pytest.mark.semantic_eval
async def test_held_out_figures_hold() -> None:
    """At the shipped operating point, no profile condition drops below the figures reached."""
    embedder = LocalEmbedder()
    assert embedder.thresholds is not None
    head_margin = calibrated_head_margin(embedder.model)
    confidence = calibrated_head_confidence(embedder.model)
    report = await evaluate_corpus(
        CORPUS, embedder, fixed=embedder.thresholds, head_margin=head_margin, head_confidence=confidence
    )
    for result in report.results:
        right, wrong, refused = REACHED[result.condition]
        got = result.overall
        assert got.right_pct is not None and got.wrong_pct is not None and got.refused_pct is not None
        summary = f"{result.condition}: {got.right_pct:.1f}/{got.wrong_pct:.1f}/{got.refused_pct:.1f}"
        assert got.right_pct >= right - MARGIN_RIGHT, summary
        assert got.wrong_pct <= wrong + MARGIN_WRONG, summary
        assert got.refused_pct >= refused - MARGIN_RIGHT, summary
