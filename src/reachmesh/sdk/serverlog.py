"""The logger an agent's aiohttp server writes to: malformed requests in one short line.

aiohttp refuses a request it cannot parse (a 100 KB header line, 5000 headers, a broken request
line) with 400 and logs "Error handling request" with a full traceback, about thirty lines a
refusal: whoever reaches the agent's port could fill its log as fast as they can send. This
logger is given to the agent's own server (``AppRunner(logger=...)``), so no logger of the
process changes: such a refusal is one line, at most one every ``every_s`` seconds, the next one
counting those left out. Anything else (an exception a handler let through) is logged as
aiohttp logs it, traceback included.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

from reachmesh.redaction import loggable

log = logging.getLogger("reachmesh.sdk")

REFUSAL_LOG_EVERY_S = 5.0


class RefusalLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """``aiohttp.server`` for one agent's server, with its refusals of malformed requests rate-limited."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = REFUSAL_LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger, {})
        self.every_s = every_s
        self._clock = clock
        self._next_at = float("-inf")
        self.left_out = 0  # refusals not logged since the last line

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            self.refused(error, args[0] if args else None)
            return
        # The record names aiohttp's line that logged it, as it did before this logger.
        kwargs.setdefault("stacklevel", 2)
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def refused(self, error: HttpProcessingError, peer: object) -> None:
        """One line for this refusal, unless one was written less than ``every_s`` ago."""
        now = self._clock()
        if now < self._next_at:
            self.left_out += 1
            return
        self._next_at = now + self.every_s
        left_out, self.left_out = self.left_out, 0
        more = f" ({left_out} more refused since the last such line)" if left_out else ""
        log.warning(
            "[reach-agent] refused a malformed request from %s: %s %s: %s%s",
            loggable(str(peer), 64),
            error.code,
            type(error).__name__,
            loggable(error.message, 160),
            more,
        )


def agent_runner(app: web.Application, shutdown_timeout: float, idle_timeout: float) -> web.AppRunner:
    """The runner of an agent's server: no access log, no signal handlers of its own, connections
    that send no whole request closed after ``idle_timeout``, and its refusals of malformed
    requests logged by a :class:`RefusalLog` of its own."""
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=idle_timeout,
        logger=RefusalLog(server_logger),
    )
