"""``reach router --workers N``: N Router processes on one port, over one shared registry.

A Python process uses one core for its event loop; a second Router process uses the second. The
supervisor starts N workers, each binding the port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them), passes SIGTERM, SIGINT and SIGHUP on, and starts a worker again when it
dies, with a growing pause if it keeps dying. Workers share state only through etcd, which is
why ``--workers`` needs it: with N private in-memory registries, an agent registered at one
worker would be unknown to the others.

``SO_REUSEPORT`` would as gladly let a second supervisor's workers join the same port, and the
kernel would then split the callers between two groups with nothing said. So a supervisor first
claims the port with a lock (:func:`claim_port`), held by it and its workers until the last of
them exits, however it ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from reachmesh.exceptions import ConfigError

# The exit code of a worker that cannot start at all (cli/main.py, WORKER_CANNOT_START).
CANNOT_START = 3
# Linux's prctl(PR_SET_PDEATHSIG): a worker gets SIGTERM when the supervisor dies, even by kill -9.
_PR_SET_PDEATHSIG = 1
# A worker that dies sooner than this after its start is restarted after a growing pause.
_QUICK_DEATH_S = 10.0
_MAX_PAUSE_S = 30.0


class Worker:
    def __init__(self, index: int, argv: list[str], keep_fds: tuple[int, ...] = ()) -> None:
        self.index = index
        self.argv = argv
        self.keep_fds = keep_fds
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.pause = 0.5
        self.restart_at: float | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reachmesh", *self.argv],
            preexec_fn=die_with_parent,
            pass_fds=self.keep_fds,
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


def die_with_parent() -> None:
    """In the worker, before exec: be sent SIGTERM if the supervisor goes, however it goes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: a killed supervisor leaves its workers to be stopped by hand


class PortClaimed(ConfigError):
    """Another supervisor holds the port."""


class PortClaim:
    """This supervisor's hold on its port: an open, locked file. Its descriptor is also handed to
    every worker, so the lock lasts until the last process of the group has exited (after a
    ``kill -9`` of the supervisor, its workers still finish their calls on the port)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PortClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_folder() -> Path:
    """This user's runtime folder for locks: $XDG_RUNTIME_DIR when set, else one in /tmp."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "agent-reach"
    return Path(tempfile.gettempdir()) / f"agent-reach-{os.getuid()}"


def claim_port(port: int, lock_dir: Path | None = None) -> PortClaim:
    """Hold this user's lock for ``port`` while the group runs. PortClaimed, naming the holder,
    when another supervisor has it; ConfigError when the lock folder is not this user's own."""
    folder = lock_dir or _lock_folder()
    path = folder / f"router-port-{port}.lock"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A folder someone else made (in a shared /tmp) could point the lock file anywhere.
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ConfigError(
                f"cannot claim port {port}: {folder} is not a private folder of this user "
                f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); remove it, or set "
                "XDG_RUNTIME_DIR"
            )
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot claim port {port}: {exc.strerror or exc} ({path})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise PortClaimed(
            f"port {port} is already served by another `reach router --workers` (pid {holder}); "
            "stop it first, or pick another --port"
        ) from None
    # Written before cutting to length, so a reader never finds the file empty.
    pid = f"{os.getpid()}\n".encode()
    os.pwrite(fd, pid, 0)
    os.ftruncate(fd, len(pid))
    return PortClaim(fd)


def supervise(
    count: int,
    worker_argv: Callable[[int], list[str]],
    say: Callable[[str], None],
    keep_fds: tuple[int, ...] = (),
) -> int:
    """Run ``count`` workers until a signal stops them all; returns the exit code. Each worker
    inherits ``keep_fds`` (the port claim)."""
    workers = [Worker(i, worker_argv(i), keep_fds) for i in range(count)]
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
