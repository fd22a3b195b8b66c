"""``mode: async``: accept at once, run the request in the background, keep and deliver its answer.

The answer is kept in the :class:`~agent_reach.router.results.ResultStore` for
``GET /reach/{traceId}`` and, when the caller gave a ``replyTo``, POSTed there through the
transport with bounded retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agent_reach.config import AsyncPolicy
from agent_reach.exceptions import DeliveryFailed
from agent_reach.lifecycle import Background
from agent_reach.router.results import Reply, ResultStore
from agent_reach.transport.base import Transport

log = logging.getLogger("agent_reach.async")

Run = Callable[[], Awaitable[Reply]]


class AsyncRequests:
    """Runs accepted async requests and delivers their answers."""

    def __init__(self, transport: Transport, results: ResultStore, policy: AsyncPolicy) -> None:
        self.transport = transport
        self.results = results
        self.policy = policy
        self._running = Background("reach-async")

    def start(self, trace_id: str, run: Run, reply_to: str | None) -> None:
        """Run ``run()`` in the background; its answer is stored, then delivered to ``reply_to``."""
        self.results.start(trace_id)
        self._running.spawn(self._serve(trace_id, run, reply_to), trace_id)

    async def _serve(self, trace_id: str, run: Run, reply_to: str | None) -> None:
        reply = await run()
        self.results.finish(trace_id, reply)
        if reply_to:
            await self.deliver(trace_id, reply_to, reply[1])

    async def deliver(self, trace_id: str, url: str, body: bytes) -> None:
        """POST the ReachResponse to ``replyTo``, retrying a bounded number of times."""
        policy = self.policy
        headers = {"Content-Type": "application/json", "X-Reach-Trace-Id": trace_id}
        last = ""
        for attempt in range(1, policy.reply_attempts + 1):
            try:
                await self.transport.deliver(url, body, headers, policy.reply_timeout_ms / 1000)
            except DeliveryFailed as exc:
                last = exc.message
            else:
                log.info("[%s] reply delivered to %s", trace_id, url)
                return
            if attempt < policy.reply_attempts:
                await asyncio.sleep(policy.reply_backoff_ms * attempt / 1000)
        log.error(
            "[%s] reply to %s failed after %d attempts (%s); the result stays at GET /reach/%s",
            trace_id,
            url,
            policy.reply_attempts,
            last,
            trace_id,
        )

    async def close(self) -> None:
        """Cancel async requests still running."""
        await self._running.close()
