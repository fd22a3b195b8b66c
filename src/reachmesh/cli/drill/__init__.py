"""``reach drill``: the resilience drills as a command, against the drill's own Router or any other.

Each scenario starts agents of its own (processes, so ``kill -9`` is real), drives traffic,
injects its fault, and checks what it measured against the Router's promise. The command exits
non-zero when a promise is missed, so a team can run it in its own CI.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from reachmesh.cli.console import app, err, fail, out
from reachmesh.cli.drill.fleet import Fleet, OwnRouter, auth_headers
from reachmesh.cli.drill.report import as_json, write
from reachmesh.cli.drill.scenarios import SCENARIOS, Result, Settings, Stage
from reachmesh.exceptions import ConfigError
from reachmesh.yamlfile import read_yaml

ALL = ["latency", "crash", "storm", "breaker", "partition"]


def drill_policy(scenario: str) -> dict[str, Any]:
    """The policy of the drill's own Router when no --config is given: the defaults, with a lease
    short enough that an offline agent shows within a drill, no embedder (drills route by task),
    and for the storm a capacity small enough that one machine can exceed it."""
    policy: dict[str, Any] = {
        "registry": {"lease_ttl_seconds": 6, "sweep_interval_seconds": 0.2},
        "embedding": {"backend": "none"},
    }
    if scenario == "storm":
        policy["limits"] = {"max_inflight": 32}
    return policy


@app.command()
def drill(
    scenarios: Annotated[
        list[str],
        typer.Argument(help="latency, crash, storm, breaker, partition, or all.", show_default=False),
    ],
    router: Annotated[
        str | None,
        typer.Option(
            "--router",
            help="Drive this Router (admin token in REACH_TOKEN when auth is on) instead of starting one.",
        ),
    ] = None,
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
) -> None:
    """Run resilience drills (latency, crash, storm, breaker, partition, all); exit 1 on a missed promise."""
    names = _scenarios(scenarios)
    if router is not None and config is not None:
        fail(
            "--config sets the policy of the drill's own Router; with --router, that Router's own policy "
            "is in force"
        )
    if router is not None and "partition" in names:
        fail("partition freezes the drill's own etcd: run it without --router")
    token = os.environ.get("REACH_TOKEN") or None
    settings = Settings(agents=agents, duration=duration, rate=rate, concurrency=concurrency)
    try:
        policy = None if config is None else _read_policy(config)
        if router is not None:
            _check_router(router.rstrip("/"), token)
        results, info = _run(names, settings, router.rstrip("/") if router else None, token, policy)
    except ConfigError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        err.print("[reach-drill] interrupted: the drill's agents were stopped and removed", highlight=False)
        raise typer.Exit(130) from None
    _finish(results, info, report, json_out)


def _scenarios(given: list[str]) -> list[str]:
    names: list[str] = []
    for name in given:
        if name == "all":
            names += [n for n in ALL if n not in names]
        elif name in SCENARIOS:
            names += [] if name in names else [name]
        else:
            fail(f"unknown scenario {name!r}: choose from {', '.join(ALL)}, or all")
    return names


def _read_policy(path: Path) -> dict[str, Any]:
    found = read_yaml(path)
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: a policy file is a mapping of sections")
    return found


def _check_router(url: str, token: str | None) -> None:
    try:
        httpx.get(f"{url}/healthz", timeout=5).raise_for_status()
        resp = httpx.get(f"{url}/admin/agents", headers=auth_headers(token), timeout=5)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the Router at {url}: {exc}") from exc
    if resp.status_code in (401, 403):
        need = "set REACH_TOKEN to an admin token" if token is None else "REACH_TOKEN is not an admin token"
        raise ConfigError(f"the drill reads /admin/agents and registers agents: {need} ({resp.status_code})")


def _run(
    names: list[str], settings: Settings, router: str | None, token: str | None, policy: dict[str, Any] | None
) -> tuple[list[Result], dict[str, Any]]:
    results: list[Result] = []
    info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="reach-drill-") as tmp:
        for name in names:
            workdir = Path(tmp) / name
            workdir.mkdir()
            result, info = _run_one(name, settings, router, token, policy, workdir)
            results.append(result)
    return results, info


def _run_one(
    name: str,
    settings: Settings,
    router: str | None,
    token: str | None,
    policy: dict[str, Any] | None,
    workdir: Path,
) -> tuple[Result, dict[str, Any]]:
    if router is not None:
        return _on(Stage(router, token, Fleet(router, token, workdir), settings, None), name, started="given")
    chosen = dict(policy) if policy is not None else drill_policy(name)
    etcd = None
    if name == "partition":
        from reachmesh.cli.etcd import EtcdCluster

        etcd = EtcdCluster(workdir / "etcd").start()
        registry = dict(chosen.get("registry") or {})
        registry.update(
            {"backend": "etcd", "etcd": {**registry.get("etcd", {}), "endpoints": etcd.endpoints.split(",")}}
        )
        chosen["registry"] = registry
    own = OwnRouter(workdir, chosen)
    try:
        own.wait_ready()
        stage = Stage(own.url, token, Fleet(own.url, token, workdir), settings, chosen)
        if etcd is not None:
            stage.freeze, stage.thaw = etcd.members[0].freeze, etcd.members[0].thaw
        return _on(stage, name, started="started by the drill")
    finally:
        own.stop()
        if etcd is not None:
            etcd.stop()


def _on(stage: Stage, name: str, *, started: str) -> tuple[Result, dict[str, Any]]:
    try:
        result = asyncio.run(SCENARIOS[name](stage))
    finally:
        left = stage.fleet.cleanup()
        if left:
            err.print(
                f"[reach-drill] still listed after cleanup: {', '.join(left)}", highlight=False, markup=False
            )
    return result, {
        "url": stage.router_url,
        "started": started,
        "version": _version(stage),
        "policy": stage.policy,
    }


def _version(stage: Stage) -> str | None:
    try:
        return str(httpx.get(f"{stage.router_url}/openapi.json", timeout=5).json()["info"]["version"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _finish(results: list[Result], info: dict[str, Any], folder: Path | None, json_out: bool) -> None:
    report = write(results, info, folder, with_json=json_out) if folder else as_json(results, info)
    if json_out:
        out.print_json(data=report)
    else:
        for result in results:
            out.print(f"[bold]{result.scenario}[/]", highlight=False)
            for promise in result.promises:
                mark = "[green]held[/]" if promise.ok else "[red]MISSED[/]"
                out.print(f"  {mark}  {promise.name}: {promise.detail}", highlight=False)
        if folder:
            out.print(f"report: {folder / 'report.md'}", highlight=False)
    if not report["ok"]:
        missed = [f"{r.scenario}: {p.name}" for r in results for p in r.promises if not p.ok]
        err.print(f"[reach-drill] promise missed: {'; '.join(missed)}", highlight=False, markup=False)
        raise typer.Exit(1)
