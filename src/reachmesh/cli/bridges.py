"""``reach a2a import`` and ``reach mcp``: the bridges' commands (each needs its extra)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import typer

from reachmesh.cli.console import HELP, RouterOpt, app, err, out
from reachmesh.cli.console import fail as _fail
from reachmesh.exceptions import ConfigError, RegistryError, RouterUnavailable
from reachmesh.ports import is_loopback

a2a_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
    context_settings=HELP,
    help="The A2A bridge.",
)
app.add_typer(a2a_app, name="a2a")


def _router_url(router: str | None) -> str:
    """``--router`` (else REACH_ROUTER_URL): one URL, or several comma-separated Routers of one
    service; a bad one is a one-line error."""
    from reachmesh.sdk.client import router_url_from_env

    try:
        return router_url_from_env(router)
    except ConfigError as exc:
        _fail(exc.message)


@a2a_app.command("import")
def a2a_import(
    url: Annotated[str, typer.Argument(help="The agent's card URL, or its base URL.")],
    router: RouterOpt = None,
    agent_id: Annotated[
        str | None, typer.Option("--id", help="Registry id.  [default: from the card's name]")
    ] = None,
    health_interval: Annotated[float, typer.Option(help="Seconds between health probes of the card.")] = 15.0,
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            "--max-concurrency",
            min=1,
            help="The most calls the Router sends the agent at once; the rest wait in the Router."
            "  [default: no bound]",
        ),
    ] = None,
) -> None:
    """Register an A2A agent by its card: skills become capabilities (needs an admin token)."""
    try:
        from reachmesh.integrations.a2a_import import import_agent

        answer = asyncio.run(
            import_agent(
                url,
                _router_url(router),
                agent_id=agent_id,
                token=os.environ.get("REACH_TOKEN"),
                health_interval_s=health_interval,
                max_concurrency=max_concurrency,
            )
        )
    except (ConfigError, RegistryError) as exc:
        _fail(exc.message, 1)
    tasks = ", ".join(cap["task"] for cap in answer["profile"]["capabilities"])
    err.print(f"imported {answer['agentId']} ({tasks})", markup=False, highlight=False)
    out.print_json(json.dumps({k: v for k, v in answer.items() if k != "profile"}))


@app.command("mcp")
def mcp(
    router: RouterOpt = None,
    http: Annotated[
        int | None, typer.Option("--http", help="Serve streamable HTTP on this port.  [default: stdio]")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind with --http.")] = "127.0.0.1",
    poll_interval: Annotated[float, typer.Option(help="Seconds between reads of the registry.")] = 1.0,
    timeout_ms: Annotated[int | None, typer.Option(help="Budget of each tool call, in ms.")] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(min=1024, help="With --http, the largest request body taken; larger is refused 413."),
    ] = 2 * 1024 * 1024,
) -> None:
    """Serve the Router's capabilities as MCP tools (stdio, or streamable HTTP with --http)."""
    try:
        from reachmesh.integrations.mcp import ReachMCP
    except ConfigError as exc:
        _fail(exc.message)
    tokens = [t.strip() for t in os.environ.get("REACH_MCP_TOKEN", "").split(",") if t.strip()]
    if http is not None and not tokens and not is_loopback(host):
        # The bridge calls the Router with REACH_TOKEN: open on the network, anyone could.
        _fail(
            f"--host {host} serves MCP beyond this machine: set REACH_MCP_TOKEN "
            "(the bearer token its clients must send)"
        )
    server = ReachMCP(_router_url(router), poll_interval_s=poll_interval, timeout_ms=timeout_ms)
    try:
        if http is None:
            asyncio.run(server.serve_stdio())
        else:
            if not tokens and os.environ.get("REACH_TOKEN"):
                err.print(
                    "[reach-mcp] WARNING: no REACH_MCP_TOKEN: any process on this machine can call "
                    "the Router through this bridge with your REACH_TOKEN",
                    markup=False,
                    highlight=False,
                )
            err.print(f"[reach-mcp] http://{host}:{http}/mcp", markup=False, highlight=False)
            asyncio.run(server.serve_http(host, http, tokens=tokens, max_body_bytes=max_body_bytes))
    except (RouterUnavailable, ConfigError) as exc:
        _fail(exc.message, 1)
