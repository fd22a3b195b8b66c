"""``reach router --workers N``: N Router processes on one port, over one shared registry.

A Python process uses one core for its event loop; a second Router process uses the second. The
supervisor starts N workers, each binding the port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them), passes SIGTERM, SIGINT and SIGHUP on, and starts a worker again when it
dies, with a growing pause if it keeps dying. Workers share state only through etcd, which is
why ``--workers`` needs it: with N private in-memory registries, an agent registered at one
worker would be unknown to the others.

``SO_REUSEPORT`` would as gladly let a second supervisor's workers join the same port, and the
kernel would then split the callers between two groups with nothing said. So a supervisor first
claims the port with a lock (:func:`claim_port`), held for its life and freed by the kernel
however it ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO

# The exit code of a worker that cannot start at all (cli/main.py, WORKER_CANNOT_START).
CANNOT_START = 3
# Linux's prctl(PR_SET_PDEATHSIG): a worker gets SIGTERM when the supervisor dies, even by kill -9.
_PR_SET_PDEATHSIG = 1
# A worker that dies sooner than this after its start is restarted after a growing pause.
_QUICK_DEATH_S = 10.0
_MAX_PAUSE_S = 30.0


class Worker:
    def __init__(self, index: int, argv: list[str]) -> None:
        self.index = index
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.pause = 0.5
        self.restart_at: float | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_reach", *self.argv], preexec_fn=_die_with_parent
        )
        self.started = time.monotonic()
        self.restart_at = None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self) -> int:
        return 0 if self.proc is None else self.proc.wait()

    def tend(self, say: Callable[[str], None]) -> bool:
        """Start the worker again if it died: at once the first time, later if it keeps dying.

        False when it cannot start at all (it said why, e.g. the port is taken): restarting it
        would only repeat that.
        """
        code = None if self.proc is None else self.proc.poll()
        if code is None:
            return True
        if code == CANNOT_START:
            return False
        now = time.monotonic()
        if self.restart_at is None:
            quick = now - self.started < _QUICK_DEATH_S
            self.pause = min(self.pause * 2, _MAX_PAUSE_S) if quick else 0.5
            self.restart_at = now + self.pause
            say(f"[reach-router] worker {self.index} exited ({code}); restarting in {self.pause:g}s")
        elif now >= self.restart_at:
            self.start()
        return True


def _die_with_parent() -> None:
    """In the worker, before exec: be sent SIGTERM if the supervisor goes, however it goes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: a killed supervisor leaves its workers to be stopped by hand


class PortClaimed(Exception):
    """Another supervisor holds the port."""


def claim_port(port: int, lock_dir: Path | None = None) -> IO[str]:
    """Hold this user's lock for ``port`` (keep the returned file open as long as the workers
    run); PortClaimed, naming the holder, when another supervisor has it."""
    folder = lock_dir or Path(tempfile.gettempdir()) / f"agent-reach-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = (folder / f"router-port-{port}.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise PortClaimed(
            f"port {port} is already served by another `reach router --workers` (pid {holder}); "
            "stop it first, or pick another --port"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def supervise(count: int, worker_argv: Callable[[int], list[str]], say: Callable[[str], None]) -> int:
    """Run ``count`` workers until a signal stops them all; returns the exit code."""
    workers = [Worker(i, worker_argv(i)) for i in range(count)]
    stopping: list[int] = []

    def forward(sig: int, frame: FrameType | None) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            stopping.append(sig)
        for worker in workers:
            worker.signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for worker in workers:
        worker.start()
    while not stopping:
        if not all(worker.tend(say) for worker in workers):
            say("[reach-router] a worker cannot start (see its error above); stopping")
            forward(signal.SIGTERM, None)
            break
        time.sleep(0.1)
    codes = [worker.wait() for worker in workers]
    return 0 if all(code in (0, -signal.SIGTERM, -signal.SIGINT) for code in codes) else 1
