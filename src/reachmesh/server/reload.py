"""The policy file: reloaded on demand, on SIGHUP (the entry point wires it) or when it changes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError

log = logging.getLogger("reachmesh.router")


class PolicyFile:
    """Re-reads one policy file and hands a valid policy to ``apply``; a bad one is refused."""

    def __init__(self, path: Path | None, apply: Callable[[RouterConfig], None]) -> None:
        self.path = path
        self._apply = apply
        self._mtime: float | None = None
        # Set from a signal handler (SIGHUP), acted on by the next check() on the event loop:
        # a handler must not swap the policy in the middle of a request's bytecode.
        self.reload_requested = False
        self.last_error: str | None = None  # why the last reload was refused, for /admin/reload

    def reload(self) -> bool:
        """Re-read the file now; False (and the old policy kept) when it is missing or invalid."""
        if self.path is None:
            log.warning("reload requested, but the Router was started without a policy file")
            return False
        try:
            config = RouterConfig.load(self.path)
        except ConfigError as exc:
            log.error("policy reload rejected, keeping the old policy: %s", exc.message)
            self.last_error = exc.message
            return False
        self.last_error = None
        self._apply(config)
        log.info("policy reloaded from %s", self.path)
        return True

    def remember(self) -> None:
        """Note the file's modification time, so only later changes reload it."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self._mtime = self.path.stat().st_mtime

    async def check(self) -> None:
        """Reload when asked to, or when the file changed since it was last seen."""
        if self.reload_requested:
            self.reload_requested = False
            self.reload()  # says so when there is no file: a SIGHUP must never vanish silently
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return
        if self._mtime is not None and mtime != self._mtime:
            self.reload()
        self._mtime = mtime
