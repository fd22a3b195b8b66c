"""The drill's plots: fault labels inside the figure, no partial last second, breakers marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reachmesh.cli.drill import report
from reachmesh.cli.drill.load import Sample
from reachmesh.cli.drill.scenarios import Result


def drill_result() -> Result:
    """Ten seconds at 20/s from t=0.05, ending at t=10.05 with one failed request in that last
    twentieth of a second; faults near both edges and a breaker opening at 6 s."""
    samples = [Sample(t=0.05 + i / 20, ms=12.0, http=200, status="SUCCESS") for i in range(200)]
    samples.append(Sample(t=10.05, ms=500.0, http=504, status="TIMEOUT"))
    marks = [(0.05, "steady"), (9.6, "+3000 ms on agent drill-agent-0")]
    result = Result("latency", {}, [], marks, samples)
    result.breakers = [(6.0, "drill-agent-0")]
    return result


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Figure:
    """The figure report.plot() saves, caught as it is saved."""
    caught: list[Figure] = []

    def keep(figure: Figure, *args: Any, **kwargs: Any) -> None:
        caught.append(figure)

    monkeypatch.setattr(Figure, "savefig", keep)
    assert report.plot(drill_result(), tmp_path) == "latency.png"
    return caught[0]


def test_every_fault_label_is_inside_its_plot(drawn: Figure) -> None:
    """Inside the axes it marks: not over the frame, the title or the figure's edge."""
    renderer = FigureCanvasAgg(drawn).get_renderer()  # type: ignore[no-untyped-call]
    texts = [(axis, t) for axis in drawn.axes for t in axis.texts]
    assert texts
    for axis, text in texts:
        box = axis.get_window_extent(renderer)
        extent = text.get_window_extent(renderer)
        inside = extent.x0 >= box.x0 and extent.x1 <= box.x1 and extent.y0 >= box.y0 and extent.y1 <= box.y1
        assert inside, f"{text.get_text()!r} at {extent} runs out of its plot {box}"


def test_a_partial_last_second_is_left_out_not_drawn_as_a_drop(drawn: Figure) -> None:
    success = drawn.axes[0].lines[0]
    xs: list[float] = success.get_xdata().tolist()  # type: ignore[union-attr]
    ys: list[float] = success.get_ydata().tolist()  # type: ignore[union-attr]
    assert max(xs) == 9.0, xs
    assert min(ys) == 100.0, ys
    rows = report.timeline(drill_result().samples)
    assert rows[-1]["partial"] and rows[-1]["atS"] == 10.0
    assert not any(row["partial"] for row in rows[:-1])


def test_a_breaker_opening_is_marked(drawn: Figure) -> None:
    labels = [t.get_text() for axis in drawn.axes for t in axis.texts]
    assert "breaker opened: drill-agent-0" in labels
    markdown = report.markdown(report.as_json([drill_result()]) | {"router": {"started": "now"}}, {})
    assert "Breakers opened: drill-agent-0 at 6.0 s." in markdown
