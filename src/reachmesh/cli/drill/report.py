"""A drill's record: JSON for machines, Markdown for people, and PNG plots when matplotlib is
installed (the ``drill`` extra): success rate and p50/p99 over time, the faults marked."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reachmesh.cli.drill.load import Sample, percentile
from reachmesh.cli.drill.scenarios import Result
from reachmesh.redaction import loggable

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def prepare(folder: Path) -> None:
    """Make ``folder`` and check that it takes files, before any traffic: a drill that runs for
    minutes must not end in an unwritable folder. Raises OSError."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / ".reach-drill-write-test"
    probe.write_text("ok", encoding="utf-8")
    probe.unlink()


PLOTS_HINT = (
    "plots need matplotlib: install the drill extra (pip install '/path/to/the/clone[drill]') or matplotlib"
)


def as_json(results: Sequence[Result]) -> dict[str, Any]:
    first = results[0].router if results else {}
    return {
        "router": {key: first.get(key) for key in ("url", "started", "version")},
        "ok": all(r.ok for r in results),
        "scenarios": {
            r.scenario: {
                "ok": r.ok,
                "router": r.router,
                "figures": r.figures,
                "promises": [{"name": p.name, "ok": p.ok, "detail": p.detail} for p in r.promises],
                "marks": [{"atS": t, "label": label} for t, label in r.marks],
                "breakersOpened": [{"atS": round(t, 3), "agentId": agent} for t, agent in r.breakers],
                "timeline": timeline(r.samples),
            }
            for r in results
        },
    }


def timeline(samples: list[Sample], bin_s: float = 1.0) -> list[dict[str, Any]]:
    """Per-second requests, success share, p50 and p99: what the plots draw.

    A second that traffic covered less than half of (traffic started or stopped within it) is
    ``partial``: its handful of requests says little, and a plot leaves it out rather than show
    a count, a share or a p99 of two requests as a drop."""
    if not samples:
        return []
    bins: dict[int, list[Sample]] = {}
    for sample in samples:
        bins.setdefault(int(sample.t // bin_s), []).append(sample)
    begin, end = min(s.t for s in samples), max(s.t for s in samples)
    rows = []
    for index in range(min(bins), max(bins) + 1):
        chunk = bins.get(index, [])
        ms = [s.ms for s in chunk]
        covered = min(end, (index + 1) * bin_s) - max(begin, index * bin_s)
        rows.append(
            {
                "atS": round(index * bin_s, 3),
                "requests": len(chunk),
                "success": round(sum(1 for s in chunk if s.ok) / len(chunk), 4) if chunk else None,
                "p50Ms": _r(percentile(ms, 0.5)),
                "p99Ms": _r(percentile(ms, 0.99)),
                "partial": covered < bin_s / 2,
            }
        )
    return rows


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def markdown(report: dict[str, Any], plots: dict[str, str]) -> str:
    """The report for people. Whatever came from the Router (its version, ids, policy values)
    is escaped: report.md is rendered as Markdown and HTML, and the Router may be hostile."""
    router = report["router"]
    lines = [
        "# reach drill report",
        "",
        f"- Router: version {md(router.get('version') or 'unknown')}; {md(router['started'])}",
        f"- Result: **{'all promises held' if report['ok'] else 'a promise was missed'}**",
    ]
    for name, scenario in report["scenarios"].items():
        policy = scenario["router"].get("policy")
        lines += [
            "",
            f"## {md(name)}",
            "",
            f"Router: {md(scenario['router'].get('url'))}. Policy in force:",
            "",
        ]
        lines += (
            # JSON escapes control characters and puts every line after an indent or a bracket,
            # so no value can close the fence; inside it nothing is rendered.
            ["```json", json.dumps(policy, indent=2, sort_keys=True), "```"]
            if policy is not None
            else [
                "the Router's own (it could not be read from /admin/summary; "
                "the drill assumed the defaults where it needed a value)"
            ]
        )
        lines += ["", "| promise | held | measured |", "|---|---|---|"]
        lines += [
            f"| {md(p['name'])} | {'yes' if p['ok'] else '**no**'} | {md(p['detail'])} |"
            for p in scenario["promises"]
        ]
        figures = scenario["figures"]
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| {md(key)} | {_cell(value)} |" for key, value in figures.items() if not _rows(value)]
        for key, value in figures.items():
            if _rows(value):
                columns = list(value[0])
                header = "| " + " | ".join(md(c) for c in columns) + " |"
                lines += ["", f"{md(key)}:", "", header, "|" + "---|" * len(columns)]
                lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in value]
        marks = ", ".join(f"{md(m['label'])} at {md(m['atS'])} s" for m in scenario["marks"])
        lines += ["", f"Faults: {marks or 'none'}."]
        opened = ", ".join(
            f"{md(b['agentId'])} at {md(b['atS'])} s" for b in scenario.get("breakersOpened") or []
        )
        lines += ["", f"Breakers opened: {opened or 'none'}."]
        lines += ["", f"![{md(name)}]({plots[name]})" if name in plots else f"({PLOTS_HINT})"]
    return "\n".join(lines) + "\n"


def _rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return md(json.dumps(value, separators=(", ", ": ")))
    return md(value)


# Markdown's characters that start emphasis, links, code, strikethrough, or end a table cell
# (inside a cell or a line's middle, nothing else starts anything).
_MARKDOWN = re.compile(r"([\\`*_\[\]|~])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}


def md(value: object, limit: int = 2000) -> str:
    """``value`` as inert Markdown text: control characters escaped (one line), Markdown's
    punctuation backslashed, and HTML's characters as entities."""
    text = _MARKDOWN.sub(r"\\\1", loggable(value, limit))
    return "".join(_HTML.get(ch, ch) for ch in text)


def draw(result: Result) -> Figure | None:
    """The plot of ``result``; ``None`` when matplotlib is not installed."""
    try:
        # The object API renders with Agg and leaves matplotlib's global backend alone.
        from matplotlib.figure import Figure
    except ImportError:
        return None
    rows = [row for row in timeline(result.samples) if not row["partial"]]
    xs = [row["atS"] for row in rows]
    figure = Figure(figsize=(9, 5.5))
    top, bottom = figure.subplots(2, 1, sharex=True)
    top.plot(xs, [None if r["success"] is None else 100 * r["success"] for r in rows], color="tab:green")
    top.set_ylabel("success %")
    top.set_ylim(0, 105)
    bottom.plot(xs, [r["p50Ms"] for r in rows], label="p50")
    bottom.plot(xs, [r["p99Ms"] for r in rows], label="p99")
    bottom.set_ylabel("latency ms")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left")
    marks = [(at, label, "tab:red", "--") for at, label in result.marks]
    # An agent id is the Router's word (a hostile one's too): one line, and no "$" for mathtext.
    marks += [
        (at, "breaker opened: " + loggable(agent, 64).replace("$", r"\$"), "tab:purple", ":")
        for at, agent in result.breakers
    ]
    for at, label, color, style in marks:
        for axis in (top, bottom):
            axis.axvline(at, color=color, linestyle=style, linewidth=1)
        # Upright beside its line, inside the axes: a label never runs past the figure's edge
        # nor sits on the success line at 100 %.
        top.text(at, 4, label, rotation=90, fontsize=8, color=color, ha="right", va="bottom")
    top.set_title(f"reach drill {result.scenario}")
    figure.tight_layout()
    return figure


def plot(result: Result, folder: Path) -> str | None:
    """``<scenario>.png`` in ``folder``; ``None`` when matplotlib is not installed."""
    figure = draw(result)
    if figure is None:
        return None
    name = f"{result.scenario}.png"
    figure.savefig(folder / name, dpi=90)
    return name


def write(results: Sequence[Result], folder: Path, *, with_json: bool) -> dict[str, Any]:
    """Write the report into ``folder`` (made and checked before the drill: :func:`prepare`)."""
    report = as_json(results)
    plots = {r.scenario: name for r in results if (name := plot(r, folder)) is not None}
    (folder / "report.md").write_text(markdown(report, plots), encoding="utf-8")
    if with_json:
        (folder / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report
