"""``reach drill``: the resilience drills as a command, against the drill's own Router or any other.

Each scenario starts agents of its own (processes, so ``kill -9`` is real), drives traffic,
injects its fault, and checks what it measured against the Router's promise. The command exits
non-zero when a promise is missed, so a team can run it in its own CI. The command is declared
here; what it runs is in :mod:`reachmesh.cli.drill.run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reachmesh.cli.console import app, need_router

# The longer options, named here so the command's signature stays readable.
RouterOption = Annotated[
    str | None,
    typer.Option(
        "--router",
        help="Drive this Router (admin token in REACH_TOKEN when auth is on) instead of starting one.",
    ),
]
AgentHostOption = Annotated[
    str,
    typer.Option(
        "--agent-host",
        help="Address the drill's agents listen on and give the Router; one it can reach "
        "(needed when --router is on another host).",
    ),
]
StreamOption = Annotated[
    bool,
    typer.Option(
        "--stream",
        help="latency and crash only: the agents stream their answers and the callers ask for "
        "a stream; the report adds time to first chunk.",
    ),
]
HealthzOption = Annotated[
    float,
    typer.Option(
        "--healthz-p99-ms",
        min=1,
        max=60_000,
        help="storm: the /healthz p99 it promises; a shared or slow machine may need more.",
    ),
]


@app.command()
def drill(
    scenarios: Annotated[
        list[str],
        typer.Argument(
            help="latency, crash, storm, breaker, partition, burst, router-crash, or all.", show_default=False
        ),
    ],
    router: RouterOption = None,
    agent_host: AgentHostOption = "127.0.0.1",
    agents: Annotated[int, typer.Option(min=2, max=20, help="Drill agents per scenario.")] = 3,
    duration: Annotated[float, typer.Option(min=3, max=3600, help="Seconds of traffic per scenario.")] = 15.0,
    rate: Annotated[float, typer.Option(min=1, max=5000, help="Requests per second (open loop).")] = 40.0,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, max=2000, help="Closed loop with this many callers instead of --rate."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Policy file for the drill's own Router.")
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write report.md (and the plots) into this folder.")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (and write report.json).")
    ] = False,
    stream: StreamOption = False,
    healthz_p99_ms: HealthzOption = 100.0,
) -> None:
    """Run resilience drills (latency, crash, storm, breaker, partition, all); exit 1 on a missed promise."""
    if router is None:
        need_router("reach drill without --router (it starts a Router of its own)")
    # The drill's machinery (aiohttp, the scenarios, matplotlib for the plots) loads only when a
    # drill runs: every other command of `reach` starts without it.
    from reachmesh.cli.drill.run import start

    start(
        scenarios,
        router,
        agent_host,
        agents,
        duration,
        rate,
        concurrency,
        config,
        report,
        json_out,
        stream,
        healthz_p99_ms,
    )
