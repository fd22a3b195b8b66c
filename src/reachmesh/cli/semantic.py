"""``reach embed-server`` and ``reach calibrate``: the commands around routing by meaning."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import orjson
import typer
from rich.table import Table

from reachmesh.cli.console import app, err, need_router, out
from reachmesh.cli.console import fail as _fail
from reachmesh.exceptions import ConfigError, EmbeddingError

if TYPE_CHECKING:
    from reachmesh.semantic.calibrate import Calibration
    from reachmesh.semantic.embedders.base import Embedder
    from reachmesh.semantic.embedders.memo import MemoEmbedder
    from reachmesh.semantic.evaluation import CorpusReport, CrossValidation

T = TypeVar("T")


@app.command("embed-server")
def embed_server(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 7300,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Policy (embedding.backend, model_path).")
    ] = None,
) -> None:
    """Serve the local embedding model: POST /embed, POST /v1/embeddings, GET /healthz."""
    need_router("reach embed-server")
    import asyncio

    import uvicorn

    from reachmesh.config import RouterConfig
    from reachmesh.embedserver.app import build_embed_app
    from reachmesh.exceptions import EmbeddingError
    from reachmesh.semantic.embedders import build_embedder

    try:
        policy = RouterConfig.load(config)
        if policy.embedding.backend == "http":
            _fail("embed-server serves a model: use backend local or sentence_transformers, not http")
        backend = (
            policy.embedding.model_copy(update={"backend": "local"})
            if policy.embedding.backend in ("auto", "none")
            else policy.embedding
        )
        embedder = build_embedder(backend)
        asyncio.run(embedder.embed(["warm-up"], "query"))
    except (ConfigError, EmbeddingError) as exc:
        _fail(exc.message)
    err.print(f"[reach-embed] {embedder.model} on http://{host}:{port}", markup=False, highlight=False)
    uvicorn.run(build_embed_app(embedder), host=host, port=port, access_log=False, log_level="warning")


def _print_phrases(phrases: list[Any]) -> None:
    from rich.markup import escape

    table = Table(title="phrases", title_justify="left")
    for column in ("EXPECT", "BEST", "SCORE", "GAP", "TEXT"):
        table.add_column(column)
    for p in phrases:
        mark = "green" if p.best == p.expect else ("yellow" if p.expect is None else "red")
        table.add_row(
            escape(p.expect or "(out of scope)"),
            f"[{mark}]{escape(str(p.best))}[/]",
            f"{p.score:.4f}",
            f"{p.gap:.4f}",
            escape(p.text),
        )
    out.print(table)


def _print_distributions(distributions: dict[str, list[float]]) -> None:
    import numpy as np  # here, not at the top: every other command of `reach` starts without numpy

    for name, values in distributions.items():
        if values:
            qs = np.percentile(values, [0, 25, 50, 75, 100])
            out.print(
                f"{name:22s} n={len(values):3d}  min {qs[0]:.4f}  p25 {qs[1]:.4f}  median {qs[2]:.4f}  "
                f"p75 {qs[3]:.4f}  max {qs[4]:.4f}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        else:
            out.print(f"{name:22s} n=  0", highlight=False, markup=False, soft_wrap=True)


def _print_outcome(label: str, o: Any) -> None:
    out.print(
        f"{label}: threshold {o.threshold:.4f}, margin {o.margin:.4f}, head margin {o.head_margin:.2f}, "
        f"head confidence {o.head_confidence:.2f} "
        f"-> in-scope right "
        f"{o.in_scope_right}/{o.in_scope} ({o.accuracy * 100:.1f}%), wrong {o.in_scope_wrong}; "
        f"out-of-scope refused {o.refused}/{o.out_of_scope} ({o.refusal_rate * 100:.1f}%)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}%"


def _print_corpus(report: Any) -> None:
    from reachmesh.semantic.evaluation import CONDITION_NAMES, DIRECTIONS

    table = Table(
        title=f"held-out half, {report.model}, threshold {report.threshold:.4f} margin {report.margin:.4f}",
        title_justify="left",
    )
    table.add_column("profiles")
    for column in ("all", *DIRECTIONS):
        table.add_column(column, justify="right")
    for result in report.results:
        cells = [result.overall, *(result.directions.get(d) for d in DIRECTIONS)]
        table.add_row(
            CONDITION_NAMES[result.condition],
            *(
                "–" if f is None else f"{_pct(f.right_pct)} / {_pct(f.wrong_pct)} / {_pct(f.refused_pct)}"
                for f in cells
            ),
        )
    out.print(table)
    out.print(
        "cells: in-scope right / in-scope wrong / out-of-scope refused (out-of-scope questions count "
        "under both directions from their language)",
        highlight=False,
    )


def _print_limits(report: Any) -> None:
    from reachmesh.semantic.limits_eval import summary

    table = Table(
        title=f"held-out half, {report.model}, threshold {report.threshold:.4f} margin {report.margin:.4f}, "
        f"limit margin {report.limit_margin:+.4f} (fitted on the calibration half)",
        title_justify="left",
    )
    for column in ("profiles", "right", "wrong", "near misses refused", "plain out-of-scope refused"):
        table.add_column(column, justify="left" if column == "profiles" else "right")
    table.add_column("agents tried", justify="right")
    table.add_column("top-1 / top-3", justify="right")
    for row in summary(report):
        table.add_row(
            row["profiles"],
            *(_pct(row[k]) for k in ("right", "wrong", "near", "plain")),
            "–" if row["tried"] is None else f"{row['tried']:.2f}",
            "–" if row["top1"] is None else f"{_pct(row['top1'])} / {_pct(row['top3'])}",
        )
    out.print(table)
    for condition, (threshold, margin) in report.decline_point.items():
        out.print(
            f"declining agents, {condition}: threshold {threshold:.4f}, margin {margin:.4f} (fitted on the "
            "calibration half: most right routes with at most 1.5 agents tried per request)",
            highlight=False,
        )
    out.print(f"limits.yaml sha256 {report.limits_sha256} (as split.yaml holds it)", highlight=False)
    out.print(
        f"embedding:\n  calibrations:\n    {orjson.dumps(report.model).decode()}: "
        f"{{threshold: {report.threshold:.4f}, margin: {report.margin:.4f}, "
        f"limit_margin: {report.limit_margin:.4f}}}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _print_calibration(
    model: str, threshold: float, margin: float, head_margin: float, confidence: float
) -> None:
    """The policy lines that apply an operating point to this model only."""
    out.print(
        f"embedding:\n  calibrations:\n    {orjson.dumps(model).decode()}: "
        f"{{threshold: {threshold:.4f}, margin: {margin:.4f}, head_margin: {head_margin:.2f}, "
        f"head_confidence: {confidence:.2f}}}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


async def _closing(embedder: Embedder, work: Awaitable[T]) -> T:
    """``work``, then the embedder's sessions and threads released, in the one event loop."""
    try:
        return await work
    finally:
        await embedder.close()


async def _corpus_reports(
    folder: Path, embedder: Embedder, learned: bool
) -> tuple[CorpusReport, CorpusReport | None]:
    """The held-out report, and with ``learned`` the one after learning, in one event loop: an
    HTTP embedder's session belongs to the loop it was opened in."""
    from reachmesh.semantic.evaluation import evaluate_corpus

    async def both() -> tuple[CorpusReport, CorpusReport | None]:
        report = await evaluate_corpus(folder, embedder)
        if not learned:
            return report, None
        point = (report.threshold, report.margin)
        return report, await evaluate_corpus(
            folder,
            embedder,
            fixed=point,
            learn=True,
            head_margin=report.head_margin,
            head_confidence=report.head_confidence,
        )

    return await _closing(embedder, both())


class _Progress:
    """How many texts the model has embedded, on stderr: a served model can take minutes. A
    line at most every ``every_s`` seconds, and one at the end."""

    def __init__(self, every_s: float = 5.0) -> None:
        self._every_s = every_s
        self._started = time.monotonic()
        self._last = self._started
        self._count = 0

    def __call__(self, embedded: int) -> None:
        self._count = embedded
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            err.print(f"  embedded {embedded} texts ({self._rate(now):.0f} per second) ...", highlight=False)

    def _rate(self, now: float) -> float:
        return self._count / max(now - self._started, 1e-9)

    def done(self) -> None:
        if self._count:
            took = time.monotonic() - self._started
            err.print(f"  embedded {self._count} texts in {took:.1f} s", highlight=False)


@app.command()
def calibrate(
    labelled: Annotated[
        Path, typer.Argument(help="YAML with capabilities and labelled phrases, or (with --corpus) a folder.")
    ],
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Router policy (embedding backend).")
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="Print every phrase with its score.")] = False,
    folds: Annotated[int, typer.Option(help="k of the k-fold cross-validation.", min=2)] = 5,
    corpus: Annotated[
        bool,
        typer.Option(
            "--corpus",
            help="LABELLED is an evaluation corpus folder (capabilities.yaml, questions.yaml, split.yaml): "
            "fit on its calibration half, report its held-out half in three profile conditions.",
        ),
    ] = False,
    limits: Annotated[
        bool,
        typer.Option(
            "--limits",
            help="With --corpus: every capability also declares the corpus's limits.yaml; fit the "
            "limit margin on the calibration half, report the held-out half with near misses and "
            "plain out-of-scope questions apart, and declining agents simulated from the labels.",
        ),
    ] = False,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            min=0.0,
            max=0.5,
            help="Share of in-scope phrases the proposal may route wrong (embedding.wrong_route_budget).",
        ),
    ] = None,
    learned: Annotated[
        bool,
        typer.Option(
            "--learned",
            help="With --corpus: also report the held-out half after learning from confirmed routes "
            "(every calibration-half question refused or routed wrong, confirmed for its task).",
        ),
    ] = False,
) -> None:
    """Measure semantic routing on labelled phrases: k-fold held-out figures, and a proposed
    threshold and margin for the model."""
    need_router("reach calibrate")
    from reachmesh.config import RouterConfig

    try:
        if budget is None:
            budget = RouterConfig.load(config).embedding.wrong_route_budget
        embedder, current, progress = _open_embedder(labelled, config)
        if corpus:
            _report_corpus(labelled, embedder, current, progress, limits=limits, learned=learned)
            return
        result, validation = _fit_phrases(labelled, embedder, current, progress, folds, budget)
    except (ConfigError, EmbeddingError) as exc:
        _fail(exc.message)
    _print_fit(result, validation, folds, budget, show=show)


def _open_embedder(
    labelled: Path, config: Path | None
) -> tuple[MemoEmbedder, tuple[float, float, float, float] | None, _Progress]:
    """The policy's embedder (memoised, reporting progress) and its operating point today:
    threshold, margin and the few-shot head's margin the Router applies with them."""
    from reachmesh.config import RouterConfig
    from reachmesh.semantic.embedders import build_embedder
    from reachmesh.semantic.embedders.base import calibrated_head_confidence, calibrated_head_margin
    from reachmesh.semantic.embedders.memo import MemoEmbedder

    policy = RouterConfig.load(config)
    progress = _Progress()
    embedder = MemoEmbedder(build_embedder(policy.embedding), progress)
    point = policy.embedding.operating_point(embedder.model, embedder.thresholds)
    # The model's own head margin, as the Router takes it (the line "current" is what it does).
    head_margin = policy.embedding.head_margin_for(embedder.model, calibrated_head_margin(embedder.model))
    confidence = policy.embedding.head_confidence_for(
        embedder.model, calibrated_head_confidence(embedder.model)
    )
    current = None if point is None else (point[0], point[1], head_margin, confidence)
    err.print(f"embedding {labelled} with {embedder.model} ...", highlight=False)
    return embedder, current, progress


def _report_corpus(
    folder: Path,
    embedder: Embedder,
    current: tuple[float, float, float, float] | None,
    progress: _Progress,
    *,
    limits: bool,
    learned: bool,
) -> None:
    """An evaluation corpus: its limits report, or its held-out report (and the one after
    learning, with ``learned``) and the fitted point."""
    import asyncio

    if limits:
        from reachmesh.semantic.limits_eval import evaluate_limits

        point = None if current is None else current[:2]  # limits keep the head out of it
        report_limits = asyncio.run(_closing(embedder, evaluate_limits(folder, embedder, point)))
        progress.done()
        _print_limits(report_limits)
        return
    report, after = asyncio.run(_corpus_reports(folder, embedder, learned))
    progress.done()
    _print_corpus(report)
    _print_outcome("fitted on the calibration half", report.calibration)
    _print_calibration(
        report.model, report.threshold, report.margin, report.head_margin, report.head_confidence
    )
    if after is not None:
        _print_corpus(after)
        out.print("after learning the calibration half's refused and wrong questions", highlight=False)


def _fit_phrases(
    labelled: Path,
    embedder: Embedder,
    current: tuple[float, float, float, float] | None,
    progress: _Progress,
    folds: int,
    budget: float,
) -> tuple[Calibration, CrossValidation]:
    """Labelled phrases: the calibration fitted within the wrong-route ``budget``, and the
    k-fold cross-validation of that same fit."""
    import asyncio

    from reachmesh.semantic.calibrate import calibrate as run_calibration
    from reachmesh.semantic.evaluation import cross_validate
    from reachmesh.yamlfile import read_yaml

    data = read_yaml(labelled)
    result = asyncio.run(_closing(embedder, run_calibration(data, embedder, current=current, budget=budget)))
    progress.done()
    return result, cross_validate(result.phrases, folds, budget)


def _print_fit(
    result: Calibration, validation: CrossValidation, folds: int, budget: float, *, show: bool
) -> None:
    """The phrases' scores (with ``show``), the k-fold estimate of the proposal, the current and
    proposed figures, and the proposal as policy text."""
    if show:
        _print_phrases(result.phrases)
    _print_distributions(result.distributions)
    held = validation.held_out
    out.print(
        f"{folds}-fold estimate of this proposal (the same fit, within a {budget:.1%} wrong-route "
        f"budget, on k-1 folds; judged on the fold left out): in-scope right {held.right}/"
        f"{held.in_scope} ({_pct(held.right_pct)}), wrong {held.wrong} ({_pct(held.wrong_pct)}); "
        f"out-of-scope refused {held.refused}/{held.out_of_scope} ({_pct(held.refused_pct)})  "
        "<- expect this on phrases not seen here",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if held.in_scope and 2 * (held.right + held.wrong) < held.in_scope:
        out.print(
            f"note: within a {budget:.1%} wrong-route budget this proposal refuses most in-scope "
            f"phrases ({_pct(held.pct(held.in_scope - held.right - held.wrong, held.in_scope))}): "
            "give the capabilities examples, or allow a larger "
            "budget (--budget)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if result.current is not None:
        _print_outcome("current ", result.current)
    _print_outcome("proposed", result.proposed)
    out.print(
        "to use the proposal, add it to the Router's policy (the current and proposed lines are "
        "fitted to these phrases; the k-fold line is the honest one):",
        highlight=False,
    )
    proposed = result.proposed
    _print_calibration(
        result.model, proposed.threshold, proposed.margin, proposed.head_margin, proposed.head_confidence
    )
