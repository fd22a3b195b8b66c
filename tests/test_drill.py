"""``reach drill``: each scenario end to end with real processes, against its own Router or a
Router started separately with auth on; cleanup on Ctrl-C; one clear line for each bad start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from reachmesh.ports import free_port
from tests.helpers import TIME_SCALE

pytestmark = pytest.mark.drill

SCALE = TIME_SCALE
ADMIN = "drill-test-admin-token"

# What each scenario's JSON report must hold (the list of figures per scenario).
FIGURES = {
    "latency": {"steps", "firstRetryAtS", "breakerOpenedAtS", "slowAgent"},
    "crash": {
        "touchedVictimAfterKill",
        "failedAfterKill",
        "untouchedAfterS",
        "suspectAfterS",
        "offlineAfterS",
    },
    "storm": {"sheddingBeganAtRate", "inflightPeak", "retryAmplification", "healthzP99Ms", "shed"},
    "breaker": {"failuresBeforeOpen", "halfOpenProbes", "openedAtS", "closedAtS"},
    "partition": {"timeDegradedS", "servedDuringPartition", "resyncAfterS"},
    "burst": {"calls", "answered", "breakersOpened", "idealLastMs"},
    "router-crash": {"asyncAccepted", "asyncInFlightAtKill", "asyncLost", "lastResultAfterKillS"},
}


def reach(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reachmesh", *args],
        env={**os.environ, "COLUMNS": "100", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout * SCALE,
    )


def wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout * SCALE
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, ValueError, KeyError):
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout * SCALE:.0f} s waiting for {what}; last {last!r}")


@pytest.mark.parametrize("scenario", sorted(FIGURES))
def test_each_scenario_runs_to_its_report_and_its_promises_hold(scenario: str, tmp_path: Path) -> None:
    report = tmp_path / "report"
    # The storm's /healthz promise is a timing one: on a machine shared with the rest of the suite
    # (and CPU hogs), it gets the suite's time scale like every other deadline here.
    done = reach(
        "drill",
        scenario,
        "--duration",
        "8",
        "--rate",
        "20",
        "--json",
        "--report",
        str(report),
        "--healthz-p99-ms",
        str(100 * SCALE),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer == json.loads((report / "report.json").read_text())
    found = answer["scenarios"][scenario]
    assert FIGURES[scenario] <= set(found["figures"]), sorted(found["figures"])
    assert found["promises"] and all(p["ok"] for p in found["promises"]), found["promises"]
    assert found["timeline"] and found["marks"]
    assert answer["router"]["started"] == "started by the drill" and answer["router"]["version"]
    markdown = (report / "report.md").read_text()
    assert f"## {scenario}" in markdown and "Policy in force" in markdown
    # matplotlib is a dev dependency: the plot is there, and the report shows it.
    assert (report / f"{scenario}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({scenario}.png)" in markdown


class TeamRouter:
    """A Router started separately with auth on, and one agent of the team's own on it."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        env = {**os.environ, "REACH_ADMIN_TOKEN": ADMIN, "PYTHONUNBUFFERED": "1"}
        (tmp / "router.yaml").write_text(yaml.safe_dump({"embedding": {"backend": "none"}}))
        self._spawn(
            ["router", "--port", str(self.port), "--config", str(tmp / "router.yaml")], tmp / "r.log", env
        )
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
        wait_for(lambda: self.http.get("/healthz").status_code == 200, "the team's Router")
        port, health = free_port(), free_port()
        profile = {
            "agent": {
                "id": "team-agent",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "team_echo", "description": "the team's own agent"}],
                "health_check": {"port": health, "interval_seconds": 1},
            },
            "router": {"url": self.url},
        }
        (tmp / "team.yaml").write_text(yaml.safe_dump(profile))
        agent_env = {**env, "REACH_TOKEN": ADMIN, "REACH_DRILL_TASK": "team_echo"}
        app = "reachmesh.cli.drill.agent:agent"
        self._spawn(["agent", "--config", str(tmp / "team.yaml"), "--app", app], tmp / "team.log", agent_env)
        wait_for(lambda: self.agent("team-agent")["status"] == "available", "the team's agent")

    def _spawn(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        with log.open("ab") as out:
            self.procs.append(
                subprocess.Popen([sys.executable, "-m", "reachmesh", *args], stdout=out, stderr=out, env=env)
            )

    def agent(self, agent_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/admin/agents/{agent_id}").json())

    def drill_agents(self) -> list[str]:
        return [row["id"] for row in self.http.get("/admin/agents").json() if row["id"].startswith("drill-")]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20 * SCALE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.http.close()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[TeamRouter]:
    router = None
    try:
        router = TeamRouter(tmp_path)
        yield router
    finally:
        if router is not None:
            router.stop()


def test_a_drill_against_a_separate_router_with_auth_leaves_nothing_and_touches_no_other_agent(
    team: TeamRouter,
) -> None:
    done = reach(
        "drill",
        "crash",
        "--router",
        team.url,
        "--duration",
        "6",
        "--rate",
        "20",
        "--json",
        env={"REACH_TOKEN": ADMIN},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["router"]["started"] == "given"
    # The team's policy, read from /admin/summary, is the one the report shows.
    policy = answer["scenarios"]["crash"]["router"]["policy"]
    assert policy["embedding"]["backend"] == "none" and "tokensByRole" in policy["auth"]
    assert answer["scenarios"]["crash"]["figures"]["requestsAfterKill"] > 0
    assert team.drill_agents() == []
    mine = team.agent("team-agent")
    assert mine["status"] == "available" and mine["stats"]["requests"] == 0


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_mid_run_stops_and_removes_every_drill_agent(
    team: TeamRouter, sig: int, code: int
) -> None:
    with (Path(os.environ.get("TMPDIR", "/tmp")) / f"drill-{os.getpid()}-{sig}.log").open("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reachmesh", "drill", "crash", "--router", team.url, "--duration", "120"],
            env={**os.environ, "REACH_TOKEN": ADMIN},
            stdout=log,
            stderr=log,
        )
        try:
            # The positive control: the drill's agents do get registered before the interrupt.
            ids = wait_for(
                lambda: team.drill_agents() if len(team.drill_agents()) >= 2 else None,
                "the drill's agents to register",
                timeout=60,
            )
            proc.send_signal(sig)
            assert proc.wait(60 * SCALE) == code
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        said = log.read()
    assert "Traceback" not in said and "the drill's agents were stopped and removed" in said, said
    assert team.drill_agents() == []
    assert team.agent("team-agent")["status"] == "available"
    still = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if any(f"{agent_id}.yaml" in part for agent_id in ids for part in (p.info["cmdline"] or []))
    ]
    assert still == []


def test_an_interrupted_drill_says_what_became_of_its_agents() -> None:
    """Removed only when the Router's list shows none; else the ones left, or that it is unknown."""
    from reachmesh.cli.drill.run import Interrupted, _interrupted_line

    exc = Interrupted(signal.SIGTERM)
    assert _interrupted_line(exc).endswith("(SIGTERM): the drill's agents were stopped and removed")
    exc.left = ["drill-1-2", "drill-1-3"]
    assert _interrupted_line(exc).endswith("still listed until their leases run out: drill-1-2, drill-1-3")
    exc.left = None
    assert "could not be read" in _interrupted_line(exc)


def test_a_missing_token_is_one_line(team: TeamRouter) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REACH_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "reachmesh", "drill", "crash", "--router", team.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60 * SCALE,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "REACH_TOKEN" in done.stderr, done.stderr
    assert team.drill_agents() == []


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["drill", "quake"], {}, "unknown scenario 'quake'"),
        (["drill", "crash", "--rate", "0"], {}, "--rate"),
        (["drill", "crash", "--router", "http://127.0.0.1:{port}"], {}, "cannot reach the Router"),
        (["drill", "partition", "--router", "http://127.0.0.1:{port}"], {}, "without --router"),
        (
            ["drill", "router-crash", "--router", "http://127.0.0.1:{port}"],
            {},
            "kills one of the drill's own",
        ),
        (["drill", "partition"], {"PATH": "/nonexistent"}, "etcd is not installed"),
        (["drill", "crash", "--config", "{missing}"], {}, "cannot read"),
        (["drill", "crash", "--config", "{bad_key}"], {}, "bad.yaml: routing.bogus_key"),
        (["drill", "crash", "--router", "http://[::1"], {}, "is not a URL"),
        (["drill", "crash", "--router", "http://192.0.2.1:7200"], {}, "--agent-host"),
        (["drill", "storm", "--concurrency", "4"], {}, "without --concurrency"),
        (["drill", "crash", "--report", "/dev/null/report"], {}, "--report /dev/null/report"),
        (["drill", "crash", "--router", "{not_a_router}"], {}, "is not an Agent-Reach Router"),
    ],
)
def test_bad_starts_are_one_clear_line(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    port = str(free_port())
    (tmp_path / "bad.yaml").write_text("routing:\n  bogus_key: 1\n")
    with _plain_web_server() as not_a_router:
        fields = {"port": port, "missing": tmp_path / "nope.yaml", "bad_key": tmp_path / "bad.yaml"}
        filled = [a.format(**fields, not_a_router=not_a_router) for a in args]
        done = reach(*filled, env=env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr, done.stderr
    # One error line (a usage error also shows click's usage line above it), no traceback.
    errors = [line for line in done.stderr.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr


@contextlib.contextmanager
def _plain_web_server() -> Iterator[str]:
    """A web server that is not a Router (Python's own), on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(url, timeout=1).status_code == 200, "python -m http.server")
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_a_port_taken_before_the_child_binds_it_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() saw the port free, then another process took it before the drill's Router or
    agent bound it: that child is started again on another port instead of failing the drill."""
    from reachmesh.cli.drill import fleet
    from reachmesh.cli.drill.run import drill_policy

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    handed = [busy]  # the next port free_port() hands out is the taken one
    monkeypatch.setattr(fleet, "free_port", lambda: handed.pop() if handed else free_port())
    own = fleet.OwnRouter(tmp_path, drill_policy("crash"))
    team = None
    try:
        own.wait_ready()
        assert own.port != busy and own.respawns == 1
        assert "address already in use" in (tmp_path / "router.log").read_text().lower()
        team = fleet.Fleet(own.url, None, tmp_path)
        handed.append(busy)
        (name,) = team.start(1)
        asyncio.run(team.wait_registered([name]))
        agent = team.agents[name]
        assert agent.respawns == 1 and busy not in (agent.port, agent.health_port)
    finally:
        if team is not None:
            team.cleanup()
        own.stop()
        taken.close()


def test_latency_and_crash_hold_their_promises_with_streaming_agents(tmp_path: Path) -> None:
    """``--stream``: the agents stream, the callers ask for a stream; both drills hold their
    promises (every successful stream whole and in order too), and the report shows time to
    first chunk."""
    report = tmp_path / "report"
    args = ("drill", "latency", "crash", "--stream", "--duration", "6", "--rate", "20", "--json")
    done = reach(*args, "--report", str(report))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    for scenario in ("latency", "crash"):
        found = answer["scenarios"][scenario]
        assert all(p["ok"] for p in found["promises"]), found["promises"]
        assert "every successful stream whole and in order" in [p["name"] for p in found["promises"]]
        first = found["figures"]["firstChunk"]
        assert first["streams"] > 0 and first["p50Ms"] is not None, first
    steps = answer["scenarios"]["latency"]["figures"]["steps"]
    assert all("firstChunk" in step for step in steps)
    assert "firstChunk" in (report / "report.md").read_text()


def test_stream_is_refused_for_a_scenario_that_does_not_stream() -> None:
    done = reach("drill", "storm", "--stream")
    assert done.returncode != 0
    assert "--stream applies to latency and crash only" in done.stdout + done.stderr
