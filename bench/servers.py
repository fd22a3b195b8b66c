"""Start, pin, watch and stop the benchmark's server processes."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil


def free_port() -> int:
    """A port that is free on loopback right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinned(core: int | None, argv: Sequence[str]) -> list[str]:
    """``argv`` under ``taskset`` when a core is given. taskset execs, so the PID stays the server's."""
    return list(argv) if core is None else ["taskset", "-c", str(core), *argv]


@dataclass
class Server:
    """One server subprocess whose output goes to a log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(self.env or {})},
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"{self.name} is not running; the end of its log:\n{tail}")

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Poll ``probe`` until it answers True; fail early if the process has died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} was not ready within {timeout_s:g} s")

    def cpu_seconds(self) -> float:
        """User plus system CPU time the process has used so far."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


def http(
    method: str, url: str, body: Any = None, timeout_s: float = 2.0, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One JSON request with the standard library; returns (status, decoded body or None)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def answers_success(
    url: str, body: Any, headers: dict[str, str] | None = None, timeout_s: float = 2.0
) -> bool:
    """Whether a POST of ``body`` to ``url`` comes back 200 with status SUCCESS."""
    status, answer = http("POST", url, body, timeout_s=timeout_s, headers=headers)
    return status == 200 and isinstance(answer, dict) and answer.get("status") == "SUCCESS"


@dataclass
class CpuSnapshot:
    """CPU used so far by the whole machine and by each known process, to tell noise from signal.

    The machine is shared: anything else running during a measurement (a test suite, say) takes
    cycles from the paths under test, so the bench reports how much CPU went to processes it did
    not start. wrk's share is read from RUSAGE_CHILDREN once subprocess.run has reaped it.
    """

    wall: float
    machine_busy: float
    ours: dict[str, float]
    children: float

    @classmethod
    def take(cls, known: Sequence[Server]) -> CpuSnapshot:
        times = psutil.cpu_times()
        # guest time is already inside user time on Linux, so it is not added again.
        busy = sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = {s.name: s.cpu_seconds() for s in known}
        ours["harness"] = me.ru_utime + me.ru_stime
        return cls(time.monotonic(), busy, ours, kids.ru_utime + kids.ru_stime)

    def until(self, later: CpuSnapshot) -> dict[str, float]:
        """CPU seconds per process between the two snapshots, plus `foreign_core`: the mean
        fraction of one core that went to processes the bench did not start."""
        spent = {name: later.ours[name] - before for name, before in self.ours.items()}
        spent["wrk"] = later.children - self.children
        foreign = (later.machine_busy - self.machine_busy) - sum(spent.values())
        spent["foreign_core"] = max(0.0, foreign) / max(1e-9, later.wall - self.wall)
        return spent
