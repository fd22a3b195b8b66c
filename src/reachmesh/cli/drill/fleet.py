"""What a drill runs and watches: its own Router (or the team's), its own agents, and a watcher.

Every process a drill starts runs in its own session, so a Ctrl-C in the terminal reaches only
the drill, which then stops what it started in order: agents first (each deregisters on
SIGTERM; an agent the drill killed is deregistered with the lease it wrote down), the Router
last. A drill never touches an agent it did not start: its agents' ids begin with the run's
prefix and serve a task of the run's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from reachmesh.cli.workers import die_with_parent
from reachmesh.exceptions import ConfigError
from reachmesh.ports import free_port
from reachmesh.redaction import loggable

AGENT_APP = "reachmesh.cli.drill.agent:agent"
# What the drill takes from a Router's agent listing: its own agents are a few dozen at most.
MAX_LISTED = 10_000
MAX_ID_SHOWN = 160
START_TIMEOUT_S = 60.0  # a busy 2-core machine starts a Python process in seconds, not tens


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The caller's environment without any ``REACH_*`` variable, plus the drill's own.

    An agent's environment overrides its profile (REACH_SELF_ID, REACH_ROUTER_URL, ...) and a
    Router's its policy (REACH_ETCD_ENDPOINTS, REACH_ADMIN_TOKEN, ...): inherited, they could
    send the drill's agents to a team's Router under a team agent's id.
    """
    clean = {key: value for key, value in os.environ.items() if not key.startswith("REACH_")}
    return {**clean, "PYTHONUNBUFFERED": "1", **extra}


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "reachmesh", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(env or {}),
            # Its own session, so a terminal's Ctrl-C reaches only the drill, which stops its
            # children in order; and SIGTERM when the drill dies, however it dies.
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def stop_all(procs: list[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM to every one at once, then wait for them together; SIGKILL what is left."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


# free_port() hands out a port that was free a moment ago; another process (an outgoing
# connection's ephemeral port, on a busy host) may take it before the child binds it. Such a
# child is started again on other ports, a few times, before the drill gives up.
PORT_RETRIES = 3


def port_taken(log: Path) -> bool:
    """Whether the process writing ``log`` stopped because its port was taken."""
    return "address already in use" in _tail(log, lines=3).lower()


class OwnRouter:
    """A Router the drill starts on a free port, with the policy it is given."""

    def __init__(self, workdir: Path, policy: dict[str, Any]) -> None:
        self.policy = policy
        self.log = workdir / "router.log"
        self.config = workdir / "router.yaml"
        self.config.write_text(yaml.safe_dump(policy), encoding="utf-8")
        self.respawns = 0
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = _spawn(["router", "--port", str(self.port), "--config", str(self.config)], self.log)

    def wait_ready(self) -> None:
        """Until the Router answers /healthz; the URL is settled only then (see port_taken)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if port_taken(self.log) and self.respawns < PORT_RETRIES:
                    self.respawns += 1
                    self._spawn()
                    continue
                raise ConfigError(f"the drill's Router exited at start: {_tail(self.log)}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise ConfigError(f"the drill's Router did not answer /healthz within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        stop_all([self.proc])


@dataclass
class DrillAgent:
    name: str
    port: int
    health_port: int
    faults: Path
    lease_file: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False
    respawns: int = 0


@dataclass
class Fleet:
    """The drill's agents: one process each, all serving the run's own task."""

    router_url: str
    token: str | None
    workdir: Path
    host: str = "127.0.0.1"  # where the drill's agents listen, and the address they advertise
    # The Routers the agents register and renew through, when not router_url alone (a list).
    agent_router_url: str | None = None
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    agents: dict[str, DrillAgent] = field(default_factory=dict)
    # Declared by agents started from now on (the burst drill's capacity), if set.
    max_concurrency: int | None = None
    # Agents started from now on stream their answers (``reach drill --stream``).
    stream: bool = False

    @property
    def prefix(self) -> str:
        return f"drill-{self.run_id}-"

    @property
    def task(self) -> str:
        return f"drill_{self.run_id}"

    def start(self, count: int) -> list[str]:
        names = [f"{self.prefix}{len(self.agents) + i}" for i in range(count)]
        for name in names:
            self._start(name)
        return names

    def _start(self, name: str) -> None:
        agent = self.agents.get(name) or DrillAgent(
            name,
            free_port(),
            free_port(),
            self.workdir / f"{name}.faults.json",
            self.workdir / f"{name}.lease",
            self.workdir / f"{name}.log",
        )
        self.agents[name] = agent
        agent.faults.write_text("{}", encoding="utf-8")
        config = self.workdir / f"{name}.yaml"
        config.write_text(yaml.safe_dump(self._profile(agent)), encoding="utf-8")
        env = {
            "REACH_DRILL_TASK": self.task,
            "REACH_DRILL_FAULTS": str(agent.faults),
            "REACH_DRILL_LEASE_FILE": str(agent.lease_file),
        }
        if self.token:
            env["REACH_TOKEN"] = self.token
        if self.stream:
            env["REACH_DRILL_STREAM"] = "1"
        args = ["agent", "--config", str(config), "--app", AGENT_APP, "--log-level", "WARNING"]
        agent.proc = _spawn([*args, "--host", self.host], agent.log, env)
        agent.killed = False

    def _profile(self, agent: DrillAgent) -> dict[str, Any]:
        profile: dict[str, Any] = {
            "agent": {
                "id": agent.name,
                "display_name": f"reach drill {self.run_id}",
                "network": {"endpoint": f"http://{_url_host(self.host)}:{agent.port}/reach"},
                "capabilities": [
                    {"task": self.task, "description": "a reach drill agent: answers, or fails on purpose"}
                ],
                "health_check": {
                    "path": "/healthz",
                    "port": agent.health_port,
                    "interval_seconds": 1,
                    "timeout_ms": 500,
                },
            },
            "router": {"url": self.agent_router_url or self.router_url},
        }
        if self.max_concurrency is not None:
            profile["agent"]["max_concurrency"] = self.max_concurrency
        return profile

    def fault(self, name: str, **faults: Any) -> None:
        target = self.agents[name].faults
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults), encoding="utf-8")
        tmp.replace(target)

    def kill(self, name: str) -> None:
        """``kill -9``: the agent gets no chance to deregister."""
        agent = self.agents[name]
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
        agent.killed = True

    async def wait_registered(self, names: list[str]) -> None:
        """Until each agent is ``available`` in the Router and holds its lease (wrote it down)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        headers = auth_headers(self.token)
        async with httpx.AsyncClient(base_url=self.router_url, headers=headers, timeout=5) as http:
            waiting = list(names)
            while waiting:
                for name in list(waiting):
                    if await self._registered(http, name):
                        waiting.remove(name)
                if not waiting:
                    return
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"drill agents not registered within {START_TIMEOUT_S:.0f} s: {waiting}"
                    )
                await asyncio.sleep(0.1)

    async def _registered(self, http: httpx.AsyncClient, name: str) -> bool:
        agent = self.agents[name]
        if agent.proc is not None and agent.proc.poll() is not None:
            if port_taken(agent.log) and agent.respawns < PORT_RETRIES:
                agent.respawns += 1
                agent.port, agent.health_port = free_port(), free_port()
                self._start(name)
                return False
            raise ConfigError(f"drill agent {name} exited at start: {_tail(agent.log)}")
        try:
            resp = await http.get(f"/admin/agents/{name}")
            row = resp.json() if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return False  # a loaded Router answers late: ask again until the deadline
        if resp.status_code in (401, 403):
            raise ConfigError(
                f"the drill reads /admin/agents and needs an admin token in REACH_TOKEN ({resp.status_code})"
            )
        return isinstance(row, dict) and row.get("status") == "available" and agent.lease_file.exists()

    def cleanup(self) -> list[str] | None:
        """Stop every agent and leave none registered; returns the ids still listed afterwards,
        or None when the Router's list could not be read."""
        stop_all([agent.proc for agent in self.agents.values() if agent.proc is not None])
        with httpx.Client(base_url=self.router_url, headers=auth_headers(self.token), timeout=5) as http:
            for agent in self.agents.values():
                self._deregister(http, agent)
            try:
                listed = http.get("/admin/agents").json()
            except (httpx.HTTPError, ValueError):
                return None
        if not isinstance(listed, list):
            return None
        # The ids are printed: a hostile Router's must not carry terminal control sequences.
        return [
            loggable(row.get("id"), MAX_ID_SHOWN)
            for row in listed[:MAX_LISTED]
            if isinstance(row, dict) and str(row.get("id", "")).startswith(self.prefix)
        ]

    @staticmethod
    def _deregister(http: httpx.Client, agent: DrillAgent) -> None:
        # An agent stopped with SIGTERM deregistered itself; one that was killed (or did not get
        # to) is removed with the lease it wrote down. A 404 means it is already gone.
        try:
            lease = agent.lease_file.read_text(encoding="utf-8").strip()
        except OSError:
            return
        with contextlib.suppress(httpx.HTTPError):
            http.delete(f"/agents/{agent.name}", headers={"X-Reach-Lease": lease})


@dataclass
class Change:
    t: float
    agent: str
    what: str  # "status" or "circuit"
    value: str


class ViewPoller:
    """Polls the Router's view of the drill's agents and its readiness, and notes each change."""

    def __init__(self, http: httpx.AsyncClient, prefix: str, started: float, interval: float = 0.1) -> None:
        self._http = http
        self._prefix = prefix
        self._started = started
        self._interval = interval
        self.changes: list[Change] = []
        self.ready: list[tuple[float, str]] = []  # /readyz's status: ready, degraded, not_ready
        self._last: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def first(self, agent: str, what: str, value: str, after: float = 0.0) -> float | None:
        return next(
            (
                c.t
                for c in self.changes
                if c.agent == agent and c.what == what and c.value == value and c.t >= after
            ),
            None,
        )

    async def _run(self) -> None:
        while True:
            await self._poll()
            await asyncio.sleep(self._interval)

    async def _poll(self) -> None:
        now = time.monotonic() - self._started
        try:
            rows = (await self._http.get("/admin/agents")).json()
            ready = str((await self._http.get("/readyz")).json().get("status"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        if not self.ready or self.ready[-1][1] != ready:
            self.ready.append((now, ready))
        for row in rows if isinstance(rows, list) else []:
            agent = str(row.get("id", ""))
            if not agent.startswith(self._prefix):
                continue
            for what in ("status", "circuit"):
                value = str(row.get(what))
                if self._last.get((agent, what)) != value:
                    self._last[(agent, what)] = value
                    self.changes.append(Change(now, agent, what, value))
