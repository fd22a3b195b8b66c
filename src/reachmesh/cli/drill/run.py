"""What ``reach drill`` runs: the resilience drills, against the drill's own Router or any other.

Each scenario starts agents of its own (processes, so ``kill -9`` is real), drives traffic,
injects its fault, and checks what it measured against the Router's promise. The command exits
non-zero when a promise is missed, so a team can run it in its own CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import typer
from rich.markup import escape

from reachmesh.cli.console import err, fail, out
from reachmesh.cli.drill.burst import burst_policy
from reachmesh.cli.drill.fleet import Fleet, OwnRouter, auth_headers
from reachmesh.cli.drill.report import as_json, prepare, write
from reachmesh.cli.drill.scenarios import SCENARIOS, Result, Settings, Stage
from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.ports import is_loopback
from reachmesh.redaction import loggable
from reachmesh.yamlfile import read_yaml

ALL = ["latency", "crash", "storm", "breaker", "partition", "burst", "router-crash"]
# The scenarios that start an etcd of their own (and so cannot run against a given Router).
OWN_ETCD = ("partition", "router-crash")
# The scenarios that run with streaming agents and callers (--stream).
STREAMED = ("latency", "crash")


def drill_policy(scenario: str) -> dict[str, Any]:
    """The policy of the drill's own Router when no --config is given: the defaults, with a lease
    short enough that an offline agent shows within a drill, no embedder (drills route by task),
    and for the storm a capacity small enough that one machine can exceed it."""
    policy: dict[str, Any] = {
        # In memory whatever the environment says: the drill's Router must not join a team's etcd.
        "registry": {"backend": "memory", "lease_ttl_seconds": 6, "sweep_interval_seconds": 0.2},
        "embedding": {"backend": "none"},
    }
    if scenario == "storm":
        policy["limits"] = {"max_inflight": 32}
    if scenario == "burst":
        policy.update(burst_policy())
    if scenario == "router-crash":
        # A dead Router's claims go within about 2 s (etcd's shortest lease), looked for often.
        policy["async_mode"] = {"claim_ttl_seconds": 2, "adopt_interval_seconds": 0.2}
    return policy


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP: the drill stops, cleans up, and exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        # The drill's agents still listed after its clean-up (None: the Router's list was unread).
        self.left: list[str] | None = []


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Ctrl-C, SIGTERM (a cancelled CI job, ``timeout``) and SIGHUP (a closed terminal) all end the
    drill through its cleanup. Only this entry point changes the process's signal handlers."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Cleanup runs to its end: a second Ctrl-C must not leave agents registered."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _interruptible(scenario: Coroutine[Any, Any, Result]) -> Result:
    """Run a scenario so that a signal ends it as Interrupted. Inside the event loop the signal
    cancels the scenario's own task: an exception raised by a plain signal handler would land in
    whichever task happened to run (the load generator, the watcher), be kept there, and let the
    drill carry on to the end of its duration."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    got: list[int] = []

    def on_signal(signum: int) -> None:
        got.append(signum)
        task.cancel()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await scenario
    except asyncio.CancelledError:
        if got:
            raise Interrupted(got[0]) from None
        raise
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, _interrupt)  # back to the drill's own, which removal replaced


def start(
    scenarios: list[str],
    router: str | None,
    agent_host: str,
    agents: int,
    duration: float,
    rate: float,
    concurrency: int | None,
    config: Path | None,
    report: Path | None,
    json_out: bool,
    stream: bool = False,
    healthz_p99_ms: float = 100.0,
) -> None:
    """``reach drill`` with its arguments as given on the command line."""
    names = _scenarios(scenarios)
    url = None if router is None else router.rstrip("/")
    _check_flags(names, url, agent_host, concurrency, config)
    if stream and set(names) - set(STREAMED):
        fail(f"--stream applies to {' and '.join(STREAMED)} only (given: {', '.join(names)})")
    settings = Settings(
        agents=agents,
        duration=duration,
        rate=rate,
        concurrency=concurrency,
        stream=stream,
        healthz_p99_ms=healthz_p99_ms,
    )
    _main(names, settings, url, agent_host, config, report, json_out)


def _main(
    names: list[str],
    settings: Settings,
    url: str | None,
    agent_host: str,
    config: Path | None,
    report: Path | None,
    json_out: bool,
) -> None:
    token = os.environ.get("REACH_TOKEN") or None
    results: list[Result] = []
    try:
        policy = None if config is None else _read_policy(config)
        if report is not None:
            prepare(report)
        if url is not None:
            _check_router(url, token)
        with _signals_interrupt():
            _run(names, settings, url, token, policy, agent_host, results)
    except OSError as exc:
        fail(f"--report {report}: {exc.strerror or exc}")
    except ConfigError as exc:
        _finish(results, report, json_out, partial=True)
        fail(exc.message)
    except Interrupted as exc:
        err.print(_interrupted_line(exc), highlight=False, markup=False)
        raise typer.Exit(128 + exc.signum) from None
    _finish(results, report, json_out)


def _interrupted_line(exc: Interrupted) -> str:
    """What an interrupted drill says about its agents: removed, or which are left, or unknown."""
    if exc.left is None:
        fate = "; the Router's list could not be read to check they were removed"
    elif exc.left:
        fate = f"; still listed until their leases run out: {', '.join(exc.left)}"
    else:
        fate = " and removed"
    return f"[reach-drill] interrupted ({exc}): the drill's agents were stopped{fate}"


def _check_flags(
    names: list[str], router: str | None, agent_host: str, concurrency: int | None, config: Path | None
) -> None:
    if router is not None and config is not None:
        fail(
            "--config sets the policy of the drill's own Router; "
            "with --router, that Router's own policy is in force"
        )
    if router is not None and "partition" in names:
        fail("partition freezes the drill's own etcd: run it without --router")
    if router is not None and "router-crash" in names:
        fail("router-crash kills one of the drill's own Routers: run it without --router")
    if concurrency is not None and "storm" in names:
        fail("storm ramps a rate past capacity: it runs open loop, without --concurrency")
    if router is not None:
        try:
            parts = urlsplit(router)
            host = parts.hostname or ""
        except ValueError:
            fail(f"--router {router!r} is not a URL")
        if parts.scheme not in ("http", "https") or not host:
            fail(f"--router {router!r} is not a URL: give http(s)://host:port")
        if is_loopback(agent_host) and not is_loopback(host):
            fail(
                f"the drill's agents listen on {agent_host}, which the Router at {host} cannot reach: "
                "give --agent-host an address of this machine that the Router can reach"
            )


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
    """The policy file, checked as the Router would check it, before anything starts."""
    found = read_yaml(path)
    if found is None:
        found = {}
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: a policy file is a mapping of sections")
    RouterConfig.from_mapping(found, source=str(path))
    return found


def _check_router(url: str, token: str | None) -> None:
    try:
        health = httpx.get(f"{url}/healthz", timeout=5)
        listed = httpx.get(f"{url}/admin/agents", headers=auth_headers(token), timeout=5)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"--router {url!r} is not a URL: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the Router at {url}: {exc}") from exc
    if listed.status_code in (401, 403):
        need = "set REACH_TOKEN to an admin token" if token is None else "REACH_TOKEN is not an admin token"
        raise ConfigError(
            f"the drill reads /admin/agents and registers agents: {need} ({listed.status_code})"
        )
    try:
        rows = listed.json()
    except ValueError:
        rows = None
    if health.status_code != 200 or listed.status_code != 200 or not isinstance(rows, list):
        raise ConfigError(
            f"{url} is not an Agent-Reach Router (GET /healthz: {health.status_code}, "
            f"GET /admin/agents: {listed.status_code})"
        )


def _run(
    names: list[str],
    settings: Settings,
    router: str | None,
    token: str | None,
    policy: dict[str, Any] | None,
    agent_host: str,
    results: list[Result],
) -> None:
    """Each scenario in turn; ``results`` keeps the finished ones when a later one fails."""
    with tempfile.TemporaryDirectory(prefix="reach-drill-") as tmp:
        for name in names:
            workdir = Path(tmp) / name
            workdir.mkdir()
            results.append(_run_one(name, settings, router, token, policy, agent_host, workdir))


def _run_one(
    name: str,
    settings: Settings,
    router: str | None,
    token: str | None,
    policy: dict[str, Any] | None,
    agent_host: str,
    workdir: Path,
) -> Result:
    if router is not None:
        fleet = Fleet(router, token, workdir, agent_host)
        return _on(Stage(router, token, fleet, settings, _policy_of(router, token)), name, "given")
    chosen = dict(policy) if policy is not None else drill_policy(name)
    with contextlib.ExitStack() as stack:
        freeze = thaw = None
        if name in OWN_ETCD:
            etcd = _start_etcd(workdir, stack)
            registry = dict(chosen.get("registry") or {})
            etcd_policy = {**registry.get("etcd", {}), "endpoints": etcd.endpoints.split(",")}
            chosen["registry"] = {**registry, "backend": "etcd", "etcd": etcd_policy}
            freeze, thaw = etcd.members[0].freeze, etcd.members[0].thaw
        own = OwnRouter(workdir, chosen)
        stack.callback(own.stop)
        own.wait_ready()
        if name == "router-crash":
            stage = _two_routers(own, workdir, stack, token, settings, chosen, agent_host)
        else:
            fleet = Fleet(own.url, token, workdir, agent_host)
            stage = Stage(own.url, token, fleet, settings, chosen, freeze, thaw)
        result = _on(stage, name, "started by the drill")
    return result


def _two_routers(
    victim: OwnRouter,
    workdir: Path,
    stack: contextlib.ExitStack,
    token: str | None,
    settings: Settings,
    policy: dict[str, Any],
    agent_host: str,
) -> Stage:
    """router-crash: a second Router over the same etcd; the agents are given both, the drill
    reads through the second, and the first is the one killed."""
    (workdir / "b").mkdir()
    other = OwnRouter(workdir / "b", policy)
    stack.callback(other.stop)
    other.wait_ready()
    fleet = Fleet(other.url, token, workdir, agent_host, agent_router_url=f"{victim.url},{other.url}")

    def crash() -> None:
        victim.proc.kill()  # SIGKILL: no drain, no release of its claims
        victim.proc.wait()

    return Stage(other.url, token, fleet, settings, policy, victim_url=victim.url, crash=crash)


def _start_etcd(workdir: Path, stack: contextlib.ExitStack) -> Any:
    from reachmesh.cli.etcd import EtcdCluster

    etcd = EtcdCluster(workdir / "etcd")
    stack.callback(etcd.stop)  # before start: a start interrupted half-way is stopped too
    try:
        return etcd.start()
    except RuntimeError as exc:
        raise ConfigError(f"the drill's etcd did not start: {exc}") from exc


def _on(stage: Stage, name: str, started: str) -> Result:
    stage.fleet.stream = stage.settings.stream
    cleaned = False
    try:
        result = asyncio.run(_interruptible(SCENARIOS[name](stage)))
    except Interrupted as exc:
        exc.left, cleaned = _clean_up(stage), True
        raise
    finally:
        if not cleaned:
            _clean_up(stage)
    result.router = {
        "url": stage.router_url,
        "started": started,
        "version": _version(stage),
        "policy": stage.policy,
    }
    return result


def _clean_up(stage: Stage) -> list[str] | None:
    """Stop and remove the drill's agents; says which are still listed, and returns them."""
    with _uninterrupted():
        left = stage.fleet.cleanup()
    if left is None:
        err.print(
            "[reach-drill] could not read the Router's agents after cleanup", highlight=False, markup=False
        )
    elif left:
        err.print(
            f"[reach-drill] still listed after cleanup: {', '.join(left)}", highlight=False, markup=False
        )
    return left


def _policy_of(url: str, token: str | None) -> dict[str, Any] | None:
    """The policy a Router runs, from ``GET /admin/summary``; ``None`` from one that lacks it."""
    try:
        found = httpx.get(f"{url}/admin/summary", headers=auth_headers(token), timeout=5).json()
        settings = found["policy"]["settings"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return settings if isinstance(settings, dict) else None


def _version(stage: Stage) -> str | None:
    try:
        found = httpx.get(f"{stage.router_url}/openapi.json", timeout=5).json()["info"]["version"]
        return loggable(found, 64)  # printed and written into the report: the Router's own words
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _finish(results: list[Result], folder: Path | None, json_out: bool, *, partial: bool = False) -> None:
    """Print and write the report; exit 1 when a promise was missed. ``partial``: a later
    scenario failed to start, and what finished before it is still reported."""
    if not results:
        return
    try:
        report = write(results, folder, with_json=json_out) if folder else as_json(results)
    except OSError as exc:
        fail(f"cannot write the report into {folder}: {exc.strerror or exc}")
    if json_out:
        out.print_json(data=report)
    else:
        for result in results:
            out.print(f"[bold]{result.scenario}[/]", highlight=False)
            for promise in result.promises:
                mark = "[green]held[/]" if promise.ok else "[red]MISSED[/]"
                said = f"{escape(loggable(promise.name))}: {escape(loggable(promise.detail))}"
                out.print(f"  {mark}  {said}", highlight=False)
        if folder:
            out.print(f"report: {folder / 'report.md'}", highlight=False, markup=False)
    if partial:
        return
    if not report["ok"]:
        missed = [f"{r.scenario}: {p.name}" for r in results for p in r.promises if not p.ok]
        err.print(f"[reach-drill] promise missed: {'; '.join(missed)}", highlight=False, markup=False)
        raise typer.Exit(1)
