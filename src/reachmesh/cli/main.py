"""The ``reach`` command: run a Router, an agent or the demo; look at the registry; make a call."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table

from reachmesh.cli.console import RouterOpt, app, err, need_router, out
from reachmesh.cli.console import fail as _fail
from reachmesh.exceptions import ConfigError, RouterUnavailable
from reachmesh.ports import is_loopback
from reachmesh.version import __version__

if TYPE_CHECKING:
    import ssl

    import httpx

    from reachmesh.config import RouterConfig
    from reachmesh.protocol import ReachResponse
    from reachmesh.sdk.client import SyncReachClient
    from reachmesh.sdk.routers import RouterList
    from reachmesh.server import RouterApp

__all__ = ["app", "main"]


def _say(line: str) -> None:
    """One status line on stderr, as it is: no markup, no highlighting, never wrapped."""
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def _router_list(router_url: str | None) -> str:
    """``--router`` (else REACH_ROUTER_URL, else the default): one URL or several; a bad one is a
    one-line error."""
    from reachmesh.sdk.client import router_url_from_env

    try:
        return router_url_from_env(router_url)
    except ConfigError as exc:
        _fail(exc.message)


def _router_verify() -> ssl.SSLContext | Literal[True]:
    """What the CLI trusts in an HTTPS Router (REACH_CA_FILE); a bad bundle is a one-line error."""
    from reachmesh.sdk.tls import router_verify

    try:
        return router_verify()
    except ConfigError as exc:
        _fail(exc.message)


def _default_port() -> int:
    raw = os.environ.get("REACH_ROUTER_PORT", "7200")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        _fail(f"REACH_ROUTER_PORT must be a port number, got {raw!r}")
    return int(raw)


# A worker's exit code when it cannot start at all (e.g. its port is taken): the supervisor then
# stops rather than restart it forever.
WORKER_CANNOT_START = 3


def _a2a_export(app_: Any, public_url: str) -> Any:
    """The A2A export in front of the Router (``--a2a``); a one-line error without the extra."""
    try:
        from reachmesh.integrations.a2a import A2AExport
    except ConfigError as exc:
        _fail(exc.message)
    export = A2AExport(app_, public_url)
    return lambda _app: export  # the export already holds the app


def _run_workers(count: int, child: list[str], endpoints: list[str]) -> None:
    """Supervise ``count`` Router processes on one port; only over a shared (etcd) registry."""
    if not endpoints:
        _fail(
            f"--workers {count} needs the etcd registry (REACH_ETCD_ENDPOINTS or "
            "registry.etcd.endpoints): each worker is a Router process, and with in-memory "
            "registries an agent registered at one worker would be unknown to the others"
        )
    from reachmesh.cli.workers import claim_port, supervise

    port = int(child[4])
    try:
        claim = claim_port(port)
    except ConfigError as exc:
        _fail(exc.message)
    with claim:
        _say(f"[reach-router] {count} workers on port {port} (registry: etcd {', '.join(endpoints)})")
        code = supervise(count, lambda index: [*child, "--worker", str(index)], _say, (claim.fd,))
    raise typer.Exit(code)


@app.command()
def router(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option(help="Port.  [env var: REACH_ROUTER_PORT; default: 7200]")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Policy file.  [env var: REACH_CONFIG]")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = None,
    log_format: Annotated[str | None, typer.Option(help="text (the protocol's lines) or json.")] = None,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="Router processes on one port (needs the etcd registry).")
    ] = 1,
    worker: Annotated[int | None, typer.Option(hidden=True, help="This process is worker N.")] = None,
    a2a: Annotated[
        str | None,
        typer.Option(
            "--a2a",
            help="Also serve A2A (the agent card and both bindings), announcing this public base URL "
            "(needs the a2a extra).",
        ),
    ] = None,
) -> None:
    """Run the Router. SIGHUP (or a change to the policy file) reloads the policy."""
    need_router("reach router")
    if log_format not in (None, "text", "json"):
        _fail(f"--log-format must be text or json, got {log_format!r}")
    config_path = config if config is not None else (os.environ.get("REACH_CONFIG") or None)
    policy = _router_policy(config_path, log_level, log_format)
    bind_port = port if port is not None else _default_port()
    endpoints = _shared_endpoints(policy)
    if workers > 1:
        options = {
            "--config": config_path,
            "--log-level": log_level,
            "--log-format": log_format,
            "--a2a": a2a,
        }
        child = ["router", "--host", host, "--port", str(bind_port)]
        child += [item for flag, value in options.items() if value is not None for item in (flag, str(value))]
        _run_workers(workers, child, endpoints)
    app_ = _router_app(policy, config_path, worker)
    _start_router(app_, host, bind_port, endpoints, worker, a2a)


def _router_policy(
    config_path: str | Path | None, log_level: str | None, log_format: str | None
) -> RouterConfig:
    """The policy file, read and checked, and logging set up from it (the flags win)."""
    from reachmesh.config import RouterConfig
    from reachmesh.observability.logging import configure

    try:
        policy = RouterConfig.load(config_path)
    except ConfigError as exc:
        _fail(exc.message)
    json_logs = (log_format or policy.logging.format) == "json"
    # The process is ours: every library's log lines go through the escaping formatter.
    configure(
        log_level or policy.logging.level,
        "json" if json_logs else "text",
        policy.logging.levels,
        take_root=True,
    )
    return policy


def _shared_endpoints(policy: RouterConfig) -> list[str]:
    """The etcd members the Router shares its registry through; none for an in-memory one."""
    from reachmesh.registry.factory import etcd_endpoints

    try:
        endpoints = etcd_endpoints(policy.registry)
    except ConfigError as exc:
        _fail(exc.message)
    return endpoints if endpoints and policy.registry.backend != "memory" else []


def _router_app(policy: RouterConfig, config_path: str | Path | None, worker: int | None) -> RouterApp:
    """The app, with SIGHUP reloading its policy; everything built stays out of the GC."""
    from reachmesh.server import RouterApp
    from reachmesh.server.serve import tls_settings

    try:
        # Both read the TLS files now: a bad one is a one-line error, not a traceback from uvicorn.
        app_ = RouterApp(policy, config_path=config_path)
        app_.parts.worker = worker
        tls_settings(policy.server)
    except ConfigError as exc:
        _fail(exc.message)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: setattr(app_.policy_file, "reload_requested", True))
    # Everything built so far lives as long as the process: keep it out of every GC pass.
    gc.freeze()
    return app_


def _warn_open(app_: RouterApp, host: str) -> None:
    """A warning for each way a Router with auth off is open to more than its operator."""
    from reachmesh.server.origin import OPEN_TO_EVERY_PAGE, open_to_every_page

    if app_.auth_on:
        return
    if not is_loopback(host):
        _say(
            f"[reach-router] WARNING: listening on {host} with auth off: anyone who can reach it can "
            "register, call and administer it. Set REACH_ADMIN_TOKEN (and agent and caller tokens)."
        )
    if open_to_every_page(app_.parts.config.server, app_.auth_on):
        _say(f"[reach-router] WARNING: {OPEN_TO_EVERY_PAGE}")  # a reload into it warns too (apply())


def _start_router(
    app_: RouterApp, host: str, bind_port: int, endpoints: list[str], worker: int | None, a2a: str | None
) -> None:
    """Serve until stopped; the start line is printed once the port is bound."""
    from reachmesh.server.serve import serve

    policy = app_.parts.config
    _warn_open(app_, host)
    scheme = "https" if policy.server.tls_cert_file else "http"
    registry = f"etcd {', '.join(endpoints)}" if endpoints else "memory"
    who = "listening" if worker is None else f"worker {worker} listening"
    ready = (
        f"[reach-router] {who} on {scheme}://{host}:{bind_port} "
        f"(registry: {registry}, lease ttl {policy.registry.lease_ttl_seconds:g}s, "
        f"auth {'on' if app_.auth_on else 'off'})"
    )
    middleware = None if a2a is None else _a2a_export(app_, a2a)
    ready += "" if a2a is None else f"; A2A card at {a2a.rstrip('/')}/.well-known/agent-card.json"
    # Never printed before a bind that fails. Workers share the port: each binds its own socket
    # with SO_REUSEPORT.
    try:
        serve(
            app_,
            host,
            bind_port,
            loop="uvloop",
            on_ready=lambda: _say(ready),
            reuse_port=worker is not None,
            middleware=middleware,
        )
    except ConfigError as exc:  # the port is taken (or a worker's SO_REUSEPORT bind failed)
        _fail(exc.message, 1 if worker is None else WORKER_CANNOT_START)


@app.command()
def agent(
    app_spec: Annotated[
        str, typer.Option("--app", help="module:attribute or file.py:attribute of a ReachAgent.")
    ],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="The agent's profile.  [default: ./reach_config.yaml]"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    host: Annotated[
        str | None,
        typer.Option(help="Address the agent binds (server.host), e.g. 0.0.0.0 in a container."),
    ] = None,
) -> None:
    """Run an agent: register, serve its capabilities, deregister on SIGTERM."""
    from reachmesh.cli.agentapp import load_app
    from reachmesh.observability.logging import configure
    from reachmesh.sdk.config import AgentConfig, find_config

    configure(log_level, take_root=True)
    try:
        reach_agent = load_app(app_spec)
        agent_config = AgentConfig.load(find_config(config))
        if host is not None:
            agent_config = dataclasses.replace(agent_config, host=host)
        reach_agent.use_config(agent_config)
        reach_agent.run()
    except ConfigError as exc:
        _fail(exc.message)
    except OSError as exc:
        # The usual one: the callback or health port is taken by another process.
        _fail(f"the agent could not start: {exc.strerror or exc}", code=1)
    except KeyboardInterrupt:
        # Ctrl-C before the agent's own handlers are installed (while importing the app, say):
        # a quiet exit with the shell's status for SIGINT, not a traceback.
        raise typer.Exit(130) from None


@app.command()
def demo(
    port: Annotated[
        int | None, typer.Option(help="Router port.  [env var: REACH_ROUTER_PORT; default: 7200]")
    ] = None,
    examples: Annotated[
        Path | None,
        typer.Option(
            help="A folder with price_agent/, promotion_agent/ and router.yaml.  [default: the packaged demo]"
        ),
    ] = None,
    free_ports: Annotated[
        bool,
        typer.Option(
            "--free-ports",
            envvar="REACH_DEMO_FREE_PORTS",
            help="Give the agents free ports instead of their configs' 7301/7302 and 7311/7312, "
            "so a second demo (or the tests) can run beside `make demo`.",
        ),
    ] = False,
    etcd: Annotated[
        bool,
        typer.Option(
            "--etcd",
            help="The shared topology as processes: etcd, the embedding service and two Routers "
            "(needs the etcd binary: apt-get install etcd-server).",
        ),
    ] = False,
) -> None:
    """Start the Router and the two demo agents; Ctrl-C stops them all."""
    need_router("reach demo")
    from reachmesh.cli.demo import DEMO_DIR, run_demo

    try:
        run_demo(
            port if port is not None else _default_port(),
            examples or DEMO_DIR,
            free_ports=free_ports,
            etcd=etcd,
        )
    except ConfigError as exc:
        _fail(exc.message)


@app.command("agents")
def list_agents(
    router_url: RouterOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Every column: endpoint, heartbeat, latency.")] = False,
) -> None:
    """Print the registry as a table (80 columns; --wide for every column, --json for the rest).

    Reads GET /admin/agents: with auth on, REACH_TOKEN must hold an admin token.
    """
    import httpx

    from reachmesh.sdk.auth import auth_headers
    from reachmesh.sdk.routers import RouterList, request_any_sync

    url = _router_list(router_url)
    try:
        with httpx.Client(timeout=5, headers=auth_headers(), verify=_router_verify()) as http:
            url, resp = request_any_sync(http, RouterList(url), "GET", "/admin/agents")
        rows: list[dict[str, Any]] = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        _fail(f"cannot read {url}/admin/agents: {exc}", code=1)
    if resp.status_code != 200 or not isinstance(rows, list):
        _fail(_refusal(resp, "/admin/agents"), code=1)
    if as_json:
        out.print_json(data=rows)
        return
    if not rows:
        out.print(f"no agents registered at {url}", markup=False)
        return
    table = _agents_table(rows, url, wide)
    _table_console(table, wide).print(table)


def _table_console(table: Table, wide: bool) -> Any:
    """A console for the agents table: as wide as the terminal, or 80 columns when piped (COLUMNS
    overrides both). ``--wide`` never folds a cell: lines grow past that width instead."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()  # a pipe without COLUMNS: Rich's 80 columns
    if wide:
        natural = Measurement.get(console, console.options.update(width=100_000), table).maximum
        console = Console(width=max(console.width, natural))
    return console


def _refusal(resp: Any, what: str) -> str:
    """One line for a Router that refused an admin read: the status, its code and message, and a
    hint when it is about credentials."""
    try:
        error = resp.json().get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    line = f"{what}: HTTP {resp.status_code} {error.get('code', '')}: {error.get('message', '')}".rstrip(": ")
    if resp.status_code in (401, 403):
        line += " (set REACH_TOKEN to an admin token)"
    return line


_STATUS_COLOUR = {"available": "green", "suspect": "yellow", "unhealthy": "red", "offline": "dim"}


def _agents_table(rows: list[dict[str, Any]], url: str, wide: bool) -> Table:
    """One row per agent that fits the terminal: narrow columns end in an ellipsis, never split."""
    from rich import box
    from rich.markup import escape

    table = Table(title=f"agents at {escape(url)}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    if wide:
        for column in (
            "ID",
            "STATUS",
            "TASKS",
            "CIRCUIT",
            "REQS",
            "OK",
            "ENDPOINT",
            "LAST HEARTBEAT",
            "P50 MS",
            "INFLIGHT",
        ):
            table.add_column(column, no_wrap=True)  # an endpoint split mid-word cannot be copied
    else:
        table.add_column("ID", overflow="ellipsis", no_wrap=True, max_width=20)
        table.add_column("STATUS", no_wrap=True, min_width=9)
        table.add_column("TASKS", overflow="ellipsis")  # wraps between task names, never inside one
        table.add_column("CIRCUIT", no_wrap=True, min_width=9)
        table.add_column("REQS", justify="right", no_wrap=True)
        table.add_column("OK", justify="right", no_wrap=True)
    for row in rows:
        stats = row.get("stats") or {}
        status = str(row.get("status", "?"))
        cells = [
            escape(str(row.get("id", "?"))),
            f"[{_STATUS_COLOUR.get(status, 'white')}]{escape(status)}[/]",
            escape(", ".join(row.get("capabilities", []))),
            escape(str(row.get("circuit", ""))),
            str(stats.get("requests", 0)),
            f"{stats.get('successRate', 1.0) * 100:.0f}%",
        ]
        if wide:
            p50 = stats.get("p50LatencyMs")
            cells += [
                escape(str(row.get("endpoint", ""))),
                escape(str(row.get("lastHeartbeat", ""))),
                "-" if p50 is None else f"{p50:.1f}",
                str(stats.get("inflight", 0)),
            ]
        table.add_row(*cells)
    return table


def _streamed(
    client: SyncReachClient, task: str, body: dict[str, Any], options: dict[str, Any]
) -> ReachResponse:
    """A streamed call: each chunk's value on stdout as one JSON line, as it arrives."""
    with client.stream(task, body, **options) as story:
        for chunk in story:
            sys.stdout.write(json.dumps(chunk, ensure_ascii=False) + "\n")
            sys.stdout.flush()
    return story.response  # its end without a done event raised RouterUnavailable above


@app.command()
def call(
    task: Annotated[str, typer.Argument(help="targetTask")],
    payload: Annotated[str, typer.Option(help="The payload as a JSON object.")] = "{}",
    agent_id: Annotated[str | None, typer.Option("--agent", help="targetAgent")] = None,
    timeout_ms: Annotated[int | None, typer.Option(help="Overall budget in ms.")] = None,
    read_timeout_ms: Annotated[
        int | None, typer.Option(help="How long each attempt may wait for the agent's answer, in ms.")
    ] = None,
    only: Annotated[str | None, typer.Option("--only", help="filterAgentIds, comma-separated.")] = None,
    strategy: Annotated[
        str | None, typer.Option(help="exact_match, semantic_route or weighted_round_robin.")
    ] = None,
    conversation: Annotated[str | None, typer.Option(help="conversationId")] = None,
    trace_id: Annotated[str | None, typer.Option(help="traceId")] = None,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Ask for a streamed answer: print each chunk as one JSON line as it arrives, "
            "then the ReachResponse.",
        ),
    ] = False,
    router_url: RouterOpt = None,
) -> None:
    """Send one ReachRequest and print the ReachResponse (exit 0 on SUCCESS, 1 otherwise).

    With auth on, REACH_TOKEN must hold a caller token (or an admin token).
    """
    from reachmesh.sdk.client import SyncReachClient

    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        _fail(f"--payload is not JSON: {exc}")
    if not isinstance(body, dict):
        _fail("--payload must be a JSON object")
    filters = [a.strip() for a in only.split(",") if a.strip()] if only else None
    _router_verify()  # a bad REACH_CA_FILE is one line, before the client is made
    options: dict[str, Any] = {
        "target_agent": agent_id,
        "timeout_ms": timeout_ms,
        "read_timeout_ms": read_timeout_ms,
        "filter_agent_ids": filters,
        "strategy": strategy,
        "conversation_id": conversation,
        "trace_id": trace_id,
    }
    try:
        with SyncReachClient(router_url, source_agent="reach-cli") as client:
            response = (
                _streamed(client, task, body, options) if stream else client.call(task, body, **options)
            )
    except (RouterUnavailable, ConfigError) as exc:
        _fail(exc.message, code=1)
    _print_response(response)
    raise typer.Exit(0 if response.ok else 1)


def _print_response(response: ReachResponse) -> None:
    """The ReachResponse on stdout (alone: `| jq` works); the lines a person reads on stderr."""
    from reachmesh.cli.timeline import declines
    from reachmesh.redaction import loggable

    out.print_json(response.model_dump_json(by_alias=True, exclude_none=False))
    if response.route is not None:
        # Which task ran, on its own line: a caller who named one task must see it when the
        # Router ran another (by meaning, by the mapping table).
        score = f", score {response.route.score:.4f}" if response.route.score is not None else ""
        err.print(
            f"route: {response.route.task} (by {response.route.by}{score})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if not response.ok and response.error is not None:
        # The one line a person reads first: what went wrong, and any "did you mean".
        line = f"{response.status}: {response.error.message}{declines(response.error.candidates)}"
        err.print(loggable(line, 4096), markup=False, highlight=False, soft_wrap=True)
        if "the request gave no preferences.timeoutMs" in response.error.message:
            # The Router's default budget cut it; the caller may not know it had one.
            _say("hint: --timeout-ms N gives the whole call N ms (the Router's default budget without it)")
        if any(_read_timeout(c.message) for c in response.error.candidates or ()):
            # The Router names the envelope field; this is the option that sends it.
            err.print(
                "hint: --read-timeout-ms N lets each attempt wait N ms for the agent's answer "
                "(--timeout-ms bounds the whole call)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def _read_timeout(message: str | None) -> bool:
    """Whether a candidate's message says its attempt ran out of read timeout (protocol §6), or,
    streamed, waited its whole bound for the answer's head (a plain handler's comes with its
    result, and the read timeout is part of that bound)."""
    if message is None:
        return False
    return message.startswith("no answer head within") or (
        message.startswith("no answer within") and "read timeout" in message
    )


@app.command()
def trace(
    trace_id: Annotated[str, typer.Argument(help="The traceId to show.")],
    router_url: RouterOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Print one trace as a timeline: every hop, candidate, attempt and outcome.

    Reads GET /admin/traces/{id}: with auth on, REACH_TOKEN must hold an admin token.
    """
    import httpx

    from reachmesh.cli.timeline import render_trace
    from reachmesh.sdk.auth import auth_headers
    from reachmesh.sdk.routers import RouterList, request_any_sync

    urls = RouterList(_router_list(router_url))
    asked: list[str] = []
    try:
        with httpx.Client(timeout=5, headers=auth_headers(), verify=_router_verify()) as http:
            url, resp = request_any_sync(http, urls, "GET", f"/admin/traces/{trace_id}")
            # Each Router keeps the traces of the calls it served, so a 404 from one is no answer
            # for the list: the call may have gone to another (the first was down, say).
            while resp.status_code == 404 and url not in asked:
                asked.append(url)
                url, resp = _trace_elsewhere(http, urls, asked, trace_id) or (url, resp)
    except httpx.HTTPError as exc:
        _fail(f"cannot reach {urls.describe()}: {exc}", code=1)
    if resp.status_code == 404:
        _fail(
            f"no trace {trace_id!r} at {', '.join(asked)} (unknown, or evicted from the trace store; "
            "each Router, and each worker of `reach router --workers N`, keeps only the traces of "
            "the calls it served)",
            code=1,
        )
    if resp.status_code != 200:
        _fail(_refusal(resp, "/admin/traces"), code=1)
    try:
        data = resp.json()
    except ValueError:
        _fail(f"{url} answered HTTP {resp.status_code} without JSON", code=1)
    if as_json:
        out.print_json(data=data)
        return
    out.print(render_trace(data))


def _trace_elsewhere(
    http: httpx.Client, urls: RouterList, asked: list[str], trace_id: str
) -> tuple[str, httpx.Response] | None:
    """The next Router of the list not asked yet that answers, and its answer. One that does not
    (refused, timed out, broke off) is passed over: the others' "no trace" still stands."""
    import httpx

    for url in urls.order():
        if url in asked:
            continue
        try:
            return url, http.get(f"{url}/admin/traces/{trace_id}")
        except httpx.HTTPError:
            urls.failed(url)
    return None


@app.command()
def schema(
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write one file per model here.")] = None,
) -> None:
    """Export the JSON Schema of every wire model."""
    from reachmesh.protocol import json_schemas

    schemas = json_schemas()
    if out_dir is None:
        out.print_json(data=schemas)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, body in schemas.items():
        (out_dir / f"{name}.schema.json").write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
    out.print(f"wrote {len(schemas)} schemas to {out_dir}")


def _version_line() -> str:
    return f"reach (reachmesh) {__version__}"


def _print_version(value: bool) -> None:
    if value:
        out.print(_version_line(), markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Agent-Reach: the Router, agents and tools around them."""


@app.command()
def version() -> None:
    """Print the version."""
    out.print(_version_line(), markup=False, highlight=False)


# Registered last, so `reach --help` lists the everyday commands first.
from reachmesh.cli import bridges as _bridge_commands  # noqa: E402, F401
from reachmesh.cli import drill as _drill_commands  # noqa: E402, F401
from reachmesh.cli import semantic as _semantic_commands  # noqa: E402, F401


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
