"""Helpers for tests that run the Router and agents as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose combined output goes to a file we can read at any time."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "agent_reach", *args],
            stdout=self._file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=ROOT,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._file.close()


def wait_for(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s; last value {last!r}")
