"""``reach embed-server`` and ``reach calibrate``: the commands around routing by meaning."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from agent_reach.cli.console import app, err, out
from agent_reach.cli.console import fail as _fail
from agent_reach.exceptions import ConfigError


@app.command("embed-server")
def embed_server(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 7300,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Policy (embedding.backend, model_path).")
    ] = None,
) -> None:
    """Serve the local embedding model: POST /embed, POST /v1/embeddings, GET /healthz."""
    import asyncio

    import uvicorn

    from agent_reach.config import RouterConfig
    from agent_reach.exceptions import EmbeddingError
    from agent_reach.semantic.embedders import build_embedder
    from agent_reach.server.embedding import build_embed_app

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
        f"{label}: threshold {o.threshold:.4f}, margin {o.margin:.4f} -> in-scope right "
        f"{o.in_scope_right}/{o.in_scope} ({o.accuracy * 100:.1f}%), wrong {o.in_scope_wrong}; "
        f"out-of-scope refused {o.refused}/{o.out_of_scope} ({o.refusal_rate * 100:.1f}%)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


@app.command()
def calibrate(
    labelled: Annotated[Path, typer.Argument(help="YAML with capabilities and labelled phrases.")],
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Router policy (embedding backend).")
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="Print every phrase with its score.")] = False,
) -> None:
    """Measure semantic routing on labelled phrases; propose a threshold and margin for the model."""
    import asyncio

    from agent_reach.config import RouterConfig, read_yaml
    from agent_reach.exceptions import EmbeddingError
    from agent_reach.semantic.calibrate import calibrate as run_calibration
    from agent_reach.semantic.embedders import build_embedder

    try:
        policy = RouterConfig.load(config)
        data = read_yaml(labelled)
        embedder = build_embedder(policy.embedding)
        current = embedder.thresholds
        if policy.embedding.threshold is not None:
            current = (policy.embedding.threshold, policy.embedding.margin or 0.0)
        err.print(f"embedding {labelled} with {embedder.model} ...", highlight=False)
        result = asyncio.run(run_calibration(data, embedder, current=current))
    except (ConfigError, EmbeddingError) as exc:
        _fail(exc.message)
    if show:
        _print_phrases(result.phrases)
    _print_distributions(result.distributions)
    if result.current is not None:
        _print_outcome("current ", result.current)
    _print_outcome("proposed", result.proposed)
    out.print(
        f"set embedding.threshold: {result.proposed.threshold:.4f} and embedding.margin: "
        f"{result.proposed.margin:.4f} in the Router's policy to use the proposal",
        highlight=False,
    )
