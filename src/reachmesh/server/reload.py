"""The policy file: reloaded on demand, on SIGHUP (the entry point wires it) or when it changes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError

log = logging.getLogger("reachmesh.router")


class PolicyFile:
    """Re-reads one policy file and hands a valid policy to ``apply``; a bad one is refused."""

    def __init__(
        self, path: Path | None, apply: Callable[[RouterConfig], None], *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.path = path
        self._apply = apply
        self._clock = clock
        self._mtime: float | None = None
        # Set from a signal handler (SIGHUP), acted on by the next check() on the event loop:
        # a handler must not swap the policy in the middle of a request's bytecode.
        self.reload_requested = False
        self.last_error: str | None = None  # why the last reload was refused, for /admin/reload
        # For the admin page: when the policy in force was loaded (the start counts), and when a
        # reload was last tried, whether it was taken.
        self.loaded_at = clock.time()
        self.last_reload: tuple[float, bool] | None = None

    def reload(self) -> bool:
        """Re-read the file now; False (and the old policy kept) when it is missing or invalid."""
        if self.path is None:
            log.warning("reload requested, but the Router was started without a policy file")
            return False
        try:
            config = RouterConfig.load(self.path)
            # Applying may refuse too (a secret's variable unset): before it changes anything.
            self._apply(config)
        except ConfigError as exc:
            log.error("policy reload rejected, keeping the old policy: %s", exc.message)
            self.last_error = exc.message
            self.last_reload = (self._clock.time(), False)
            return False
        self.last_error = None
        self.loaded_at = self._clock.time()
        self.last_reload = (self.loaded_at, True)
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
