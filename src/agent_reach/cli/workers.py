"""``reach router --workers N``: N Router processes on one port, over one shared registry.

A Python process uses one core for its event loop; a second Router process uses the second. The
supervisor starts N workers, each binding the port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them), passes SIGTERM, SIGINT and SIGHUP on, and starts a worker again when it
dies, with a growing pause if it keeps dying. Workers share state only through etcd, which is
why ``--workers`` needs it: with N private in-memory registries, an agent registered at one
worker would be unknown to the others.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

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
