"""Helpers for tests that run the Router and agents as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from reachmesh.testing import free_port
from tests.helpers import describe, scaled

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose combined output goes to a file we can read at any time.

    Owned from the moment it is spawned: it is in :data:`LIVE` until :meth:`stop`, and the
    suite's ``_reap_processes`` fixture stops whatever a test left running, even when the test
    failed before its own ``try``. ``with Proc(...) as proc:`` stops it at the end of the block.
    """

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.args = args
        self._file = log.open("ab")
        spawned = False
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "reachmesh", *args],
                stdout=self._file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                cwd=ROOT,
            )
            LIVE.add(self)
            spawned = True
        finally:
            if not spawned:
                self._file.close()

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Proc(pid={self.popen.pid}, {' '.join(self.args[:3])})"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        """True while it runs; an AssertionError with its last output once it has exited, so a
        poll for its readiness ends at once instead of at its deadline."""
        code = self.popen.poll()
        if code is not None:
            raise AssertionError(f"{self!r} exited with {code}: {self.text()[-1500:]}")
        return True

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def stop(self) -> None:
        """Terminate, then kill if it has not exited within a (scaled) grace period; idempotent."""
        try:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    self.popen.wait(scaled(5))
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
        finally:
            self._file.close()
            LIVE.discard(self)


def exit_code_within(popen: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The exit code once ``popen`` has exited within ``seconds`` (scaled); else kill it, None."""
    try:
        return popen.wait(scaled(seconds))
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
        return None


# Every Proc not yet stopped, in this process (one xdist worker).
LIVE: set[Proc] = set()


def stop_all() -> list[Proc]:
    """Stop every Proc still running; returns the ones that were."""
    left = [proc for proc in LIVE if proc.popen.poll() is None]
    for proc in list(LIVE):
        proc.stop()
    return left


def wait_for(
    check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, *, what: str = ""
) -> Any:
    """Poll ``check`` until it returns something truthy (and return that), for ``timeout`` scaled.

    An HTTP error or a missing key counts as "not yet"; on expiry the error says what was awaited
    (``what``, else the check's source line), the last value and the last error.
    """
    end = time.monotonic() + scaled(timeout)
    last: Any = None
    error: Exception | None = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            error = exc
        if time.monotonic() >= end:
            raise AssertionError(
                f"waited {scaled(timeout):g} s for {what or describe(check)}; last value {last!r}"
                + (f", last error {error!r}" if error is not None else "")
            )
        time.sleep(interval)


CHAOS_APP = str(ROOT / "examples" / "chaos_agent" / "agent.py") + ":agent"
CHAOS_CONFIG = str(ROOT / "examples" / "chaos_agent" / "reach_config.yaml")


def chaos_agent(tmp: Path, name: str, router_url: str, port: int, health: int) -> Proc:
    """The chaos example agent as a process, its faults read from ``tmp/<name>.faults.json``."""
    return Proc(
        ["agent", "--config", CHAOS_CONFIG, "--app", CHAOS_APP],
        tmp / f"{name}.log",
        env={
            "REACH_SELF_ID": name,
            "REACH_CALLBACK_URL": f"http://127.0.0.1:{port}/reach",
            "REACH_HEALTH_PORT": str(health),
            "REACH_ROUTER_URL": router_url,
            "REACH_FAULT_FILE": str(tmp / f"{name}.faults.json"),
        },
    )


class Drill:
    """A Router process and chaos agent processes, each agent with its own fault file.

    The Router runs without an embedder: drills route by task, and loading the model costs a
    Router seconds of CPU at start-up, during which it answers registrations late.
    """

    def __init__(self, tmp: Path, policy: dict[str, Any]) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base: dict[str, Any] = {
            # Scaled: an agent process on a busy machine may renew a third of a second late.
            "registry": {"lease_ttl_seconds": scaled(2), "sweep_interval_seconds": 0.05},
            "embedding": {"backend": "none"},
        }
        for key, value in policy.items():
            base[key] = {**base.get(key, {}), **value}
        (tmp / "router.yaml").write_text(yaml.safe_dump(base))
        self.router = Proc(
            ["router", "--port", str(self.port), "--config", str(tmp / "router.yaml")], tmp / "router.log"
        )
        self.http = httpx.Client(base_url=self.url, timeout=scaled(10))
        self.agents: dict[str, Proc] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        ready = False
        try:
            wait_for(
                lambda: self.router.running() and self.http.get("/healthz").status_code == 200,
                what="the Router's /healthz",
            )
            ready = True
        finally:
            if not ready:
                self.stop()

    def fault(self, name: str, **faults: Any) -> None:
        (self.tmp / f"{name}.faults.json").write_text(json.dumps(faults))

    def start_agent(self, name: str) -> Proc:
        if name not in self.ports:
            self.ports[name] = (free_port(), free_port())
            self.fault(name)
        port, health = self.ports[name]
        proc = chaos_agent(self.tmp, name, self.url, port, health)
        self.agents[name] = proc
        return proc

    def statuses(self) -> dict[str, str]:
        return {row["id"]: row["status"] for row in self.http.get("/admin/agents").json()}

    def wait_available(self, *names: str, timeout: float = 30) -> None:
        """Until the Router lists each agent available *and* each agent holds its lease.

        The Router lists an agent from the moment it writes the entry, before the agent has its
        answer (the lease id); a drill started in between measures registration, not resilience.
        """
        wait_for(
            lambda: all(
                self.statuses().get(n) == "available" and "registration successful" in self.agents[n].text()
                for n in names
            ),
            timeout=timeout,
        )

    def call(self, **prefs: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.http.post(
            "/reach", json={"targetTask": "chaos", "preferences": prefs}
        ).json()
        return result

    def stop(self) -> None:
        for proc in self.agents.values():
            proc.stop()
        self.router.stop()
        self.http.close()
