"""``mode: async``: accept at once, run the request in the background, keep and deliver its answer.

The answer is kept in the :class:`~reachmesh.dispatch.results.ResultStore` for
``GET /reach/{traceId}`` and, when the caller gave a ``replyTo``, POSTed there through the
transport, retried with exponential backoff and jitter for ``reply_window_seconds``.

A delivery holds no copy of the answer: each try reads it from the result store, so the bytes
the store's gauge reports are all there are, and a result the store has let go is not delivered
again (retried deliveries of 4 MB answers once held 262 MiB while the gauge read 16). At most
``max_pending_replies`` deliveries retry at once; past that, a delivery gets one try.

Nothing accepted is lost silently: on shutdown, requests still running get until the drain
deadline; the rest are logged as abandoned by traceId, their stored result becomes ``TIMEOUT``,
and their ``replyTo`` is sent that ``TIMEOUT`` once.

With the etcd registry a :class:`~reachmesh.registry.etcd.deferred.DeferredStore` (the
``journal``) holds each accepted request until its work is done: the result is written there too,
only the Router whose result went in first delivers ``replyTo``, and the job is dropped once
delivery is over. A Router shutting down then leaves what it has not finished to the others
(its claims are released) instead of answering ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import AsyncPolicy
from reachmesh.dispatch import encoder
from reachmesh.dispatch.results import Reply, ResultStore
from reachmesh.exceptions import DeadlineExceeded, DeliveryFailed, RegistryUnavailable
from reachmesh.redaction import loggable_url
from reachmesh.registry.etcd.deferred import DeferredStore
from reachmesh.registry.etcdclient import EtcdRejected
from reachmesh.transport.base import Transport

log = logging.getLogger("reachmesh.async")

Run = Callable[[], Awaitable[Reply]]
Sleep = Callable[[float], Awaitable[None]]

# Jitter from a private generator: it must not share or disturb the process-wide `random`.
_jitter = random.Random()

# A poll of a running request says when to look again (Retry-After, whole seconds): the time its
# task's async runs have lately taken here, less what this one has run, within these bounds; the
# lower one while there is nothing to go on. A 202 alone left callers to guess, and poll in a loop.
POLL_AFTER_MIN_S = 1
POLL_AFTER_MAX_S = 5
# Tasks whose usual run time is kept (the least recently finished forgotten first): a task is the
# caller's word, so a caller naming a new one each time must not grow the Router.
_USUAL_TASKS = 256
_USUAL_WEIGHT = 0.3  # how far one finished run moves its task's usual time


@dataclass(eq=False)
class _Accepted:
    trace_id: str
    reply_to: str | None
    client: str = "-"
    task: asyncio.Task[None] | None = None
    target: str = ""  # the task the caller named: whose usual run time a poll is told
    started: float = 0.0  # monotonic


class AsyncRequests:
    """Runs accepted async requests and delivers their answers."""

    def __init__(
        self,
        transport: Transport,
        results: ResultStore,
        policy: AsyncPolicy,
        *,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
        journal: DeferredStore | None = None,
    ) -> None:
        self.transport = transport
        self.results = results
        self.policy = policy
        self._clock = clock
        self._sleep = sleep
        self._running: dict[str, _Accepted] = {}
        # Requests running per client (a token, or an address with auth off): one caller held
        # every async slot when only the total was counted.
        self._by_client: dict[str, int] = {}
        self._deliveries: dict[asyncio.Task[bool], tuple[str, str]] = {}
        # With etcd as the registry, accepted requests are recorded there: see the module's docstring.
        self.journal = journal
        # Results etcd did not take when they were finished (trace id -> client), and finished
        # jobs it did not drop: :meth:`settle` writes and drops them once it answers. Without
        # this, the other Routers answered "still running" for the whole result TTL, the job
        # held a place in etcd_max_pending, and the request ran again when this Router stopped.
        self._unwritten: dict[str, str] = {}
        self._unreleased: set[str] = set()
        # Seconds an async run of each task has lately taken here, least recently finished first.
        self._usual: dict[str, float] = {}

    def apply(self, policy: AsyncPolicy) -> None:
        """Take a reloaded policy, and hand it to the journal in etcd if there is one."""
        self.policy = policy
        if self.journal is not None:
            self.journal.apply(policy)

    def __len__(self) -> int:
        return len(self._running)

    def running_for(self, client: str) -> int:
        """How many of ``client``'s async requests are running now."""
        return self._by_client.get(client, 0)

    def busy(self, trace_id: str) -> bool:
        """Whether this Router is running ``trace_id`` or delivering its answer now."""
        return trace_id in self._running or any(t == trace_id for t, _ in self._deliveries.values())

    def start(
        self,
        trace_id: str,
        run: Run,
        reply_to: str | None,
        owner: str | None = None,
        client: str = "-",
        target: str = "",
    ) -> None:
        """Run ``run()`` in the background; its answer is stored, then delivered to ``reply_to``.

        ``owner`` (a token's fingerprint) is the only caller besides an admin who may fetch it;
        ``client`` is who is counted for it (:meth:`running_for`); ``target`` is the task the
        caller named (:meth:`poll_after`).
        """
        self.results.start(trace_id, owner, client)
        accepted = _Accepted(trace_id, reply_to, client, target=target, started=self._clock.monotonic())
        self._running[trace_id] = accepted
        self._by_client[client] = self._by_client.get(client, 0) + 1
        accepted.task = asyncio.create_task(self._serve(accepted, run), name=f"reach-async-{trace_id}")

    async def _serve(self, accepted: _Accepted, run: Run) -> None:
        try:
            reply = await run()
        finally:
            self._running.pop(accepted.trace_id, None)
            left = self._by_client.get(accepted.client, 1) - 1
            if left > 0:
                self._by_client[accepted.client] = left
            else:
                self._by_client.pop(accepted.client, None)
        self._learn(accepted.target, self._clock.monotonic() - accepted.started)
        self.results.finish(accepted.trace_id, reply)
        if not await self._journal_result(accepted.trace_id, reply, accepted.client):
            return
        self.hand_over(accepted.trace_id, accepted.reply_to)

    def _learn(self, target: str, took_s: float) -> None:
        usual = self._usual.pop(target, None)
        self._usual[target] = took_s if usual is None else usual + _USUAL_WEIGHT * (took_s - usual)
        if len(self._usual) > _USUAL_TASKS:
            del self._usual[next(iter(self._usual))]

    def poll_after(self, trace_id: str) -> int:
        """Whole seconds a poll of ``trace_id``, still running, is told to wait (Retry-After):
        its task's usual run time here less what it has run, from ``POLL_AFTER_MIN_S`` to
        ``POLL_AFTER_MAX_S``; the least for a request run elsewhere or a task not seen finish."""
        accepted = self._running.get(trace_id)
        usual = None if accepted is None else self._usual.get(accepted.target)
        if accepted is None or usual is None:
            return POLL_AFTER_MIN_S
        left = usual - (self._clock.monotonic() - accepted.started)
        return min(POLL_AFTER_MAX_S, max(POLL_AFTER_MIN_S, math.ceil(left)))

    def hand_over(self, trace_id: str, reply_to: str | None, body: bytes | None = None) -> None:
        """Deliver the answer to ``reply_to`` (if any): ``body``, else the stored result; then
        drop the job from the journal."""
        if not reply_to:
            if self.journal is not None:
                self._track(asyncio.create_task(self._release(trace_id)), trace_id, "")
            return
        # Delivery outlives the request: it is tracked apart, so draining waits only for work.
        # Deliveries beyond the bound get one try: each one retrying is a task and a timer.
        tries = 1 if len(self._deliveries) >= self.policy.max_pending_replies else None
        delivery = asyncio.create_task(self._deliver_and_release(trace_id, reply_to, body, tries))
        self._track(delivery, trace_id, reply_to)

    def _track(self, delivery: asyncio.Task[bool], trace_id: str, url: str) -> None:
        self._deliveries[delivery] = (trace_id, url)
        delivery.add_done_callback(lambda task: self._deliveries.pop(task, None))

    async def _deliver_and_release(
        self, trace_id: str, url: str, body: bytes | None, tries: int | None
    ) -> bool:
        delivered = await self.deliver(trace_id, url, body, tries=tries)
        await self._release(trace_id)
        return delivered

    async def _journal_result(self, trace_id: str, reply: Reply, client: str) -> bool:
        """Write the result to the journal, in ``client``'s share; False when another Router's
        result went in first (it ran the request too, after this Router's claim lapsed, and
        delivers replyTo itself)."""
        if self.journal is None:
            return True
        owner = self.results.owner(trace_id)
        try:
            won = await self.journal.finish(trace_id, reply[0], reply[1], owner, client)
        except EtcdRejected as exc:
            # etcd said no (a full quota, a role): trying again would be refused again.
            log.error("[%s] etcd refused the result (%s); kept here only", trace_id, exc)
            return True
        except RegistryUnavailable as exc:
            # The job stays in etcd under this Router's claim, and the result is written there
            # once etcd answers (settle): delivered from here meanwhile.
            log.error(
                "[%s] the result could not be written to etcd (%s); kept here, written once etcd answers",
                trace_id,
                exc,
            )
            self._unwritten[trace_id] = client
            return True
        if not won:
            log.info("[%s] another Router finished this request first; its answer stands", trace_id)
            await self._release(trace_id)
        return won

    async def _release(self, trace_id: str) -> bool:
        if self.journal is None:
            return True
        if trace_id in self._unwritten:
            # Not before its result is in etcd: the other Routers would answer 404 meanwhile.
            self._unreleased.add(trace_id)
            return False
        try:
            await self.journal.release(trace_id)
        except (EtcdRejected, RegistryUnavailable) as exc:
            log.error(
                "[%s] the finished request could not be dropped from etcd (%s); dropped once it answers",
                trace_id,
                exc,
            )
            self._unreleased.add(trace_id)
            return False
        return True

    async def settle(self, *, release: bool = True) -> None:
        """Write the results etcd did not take and (``release``) drop the finished jobs it did
        not drop; the adopter's look calls this first, so none is taken for an orphan. Raises
        what etcd raises; what is left waits for the next look."""
        journal = self.journal
        if journal is None:
            return
        for trace_id, client in list(self._unwritten.items()):
            reply = self.results.get(trace_id)
            try:
                if reply is not None:  # else expired or evicted here: nothing left to write
                    await journal.finish(trace_id, reply[0], reply[1], self.results.owner(trace_id), client)
                    log.info("[%s] the result is written to etcd now", trace_id)
            except EtcdRejected as exc:
                # Refused, not out of reach: kept here only, as a result etcd refuses at once.
                log.error("[%s] etcd refused the result (%s); kept here only", trace_id, exc)
            del self._unwritten[trace_id]
        if not release:
            return
        for trace_id in list(self._unreleased):
            if self.busy(trace_id):
                continue  # its replyTo is still being delivered: dropped after that
            await journal.release(trace_id)
            self._unreleased.discard(trace_id)

    def _backoff_s(self, attempt: int) -> float:
        policy = self.policy
        ceiling = min(policy.reply_backoff_max_ms, policy.reply_backoff_ms * 2.0 ** (attempt - 1))
        return float(ceiling * _jitter.uniform(0.5, 1.0) / 1000)

    def _body(self, trace_id: str) -> bytes | None:
        stored = self.results.get(trace_id)
        return None if stored is None else stored[1]

    async def deliver(
        self, trace_id: str, url: str, body: bytes | None = None, *, tries: int | None = None
    ) -> bool:
        """POST the ReachResponse to ``replyTo`` until it is taken or the window closes, at most
        ``tries`` times (``reply_attempts`` by default).

        Without ``body``, each try reads the result from the store; once the store has let it
        go (evicted for room, or expired), delivery stops and says so."""
        policy = self.policy
        headers = {"Content-Type": "application/json", "X-Reach-Trace-Id": trace_id}
        closes = self._clock.monotonic() + policy.reply_window_seconds
        tries = policy.reply_attempts if tries is None else tries
        last, attempt = "", 0
        while attempt < tries:
            attempt += 1
            sent = body if body is not None else self._body(trace_id)
            if sent is None:
                log.error(
                    "[%s] reply to %s stopped after %d attempts: the result is no longer held "
                    "(async_mode.max_result_bytes, max_results or result_ttl_seconds)",
                    trace_id,
                    loggable_url(url),
                    attempt - 1,
                )
                return False
            try:
                await self.transport.deliver(url, sent, headers, policy.reply_timeout_ms / 1000)
            except DeliveryFailed as exc:
                last = exc.message
            else:
                log.info("[%s] reply delivered to %s (attempt %d)", trace_id, loggable_url(url), attempt)
                return True
            if attempt >= tries:
                break
            wait = self._backoff_s(attempt)
            if self._clock.monotonic() + wait >= closes:
                break
            await self._sleep(wait)
        log.error(
            "[%s] reply to %s failed after %d attempts over %.0f s (%s); the result stays at GET /reach/%s",
            trace_id,
            loggable_url(url),
            attempt,
            policy.reply_window_seconds,
            last,
            trace_id,
        )
        return False

    async def drain(self, timeout_s: float) -> None:
        """Give running requests ``timeout_s`` to finish; abandon the rest, loudly."""
        tasks = [a.task for a in self._running.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
        abandoned = list(self._running.values())
        for accepted in abandoned:
            if accepted.task is not None:
                accepted.task.cancel()
        if abandoned:
            await asyncio.gather(*(a.task for a in abandoned if a.task is not None), return_exceptions=True)
        for accepted in abandoned:
            if self.journal is not None:
                # Recorded in etcd: another Router adopts it once this one's claims are gone.
                log.warning(
                    "[%s] async request left unfinished at shutdown: another Router adopts it",
                    accepted.trace_id,
                )
                continue
            await self._abandon(accepted)
        for delivery, (trace_id, url) in list(self._deliveries.items()):
            delivery.cancel()
            if url:
                log.error("[%s] reply to %s still undelivered at shutdown", trace_id, loggable_url(url))
        if self._deliveries:
            await asyncio.gather(*self._deliveries, return_exceptions=True)

    async def _abandon(self, accepted: _Accepted) -> None:
        log.error("[%s] async request abandoned at shutdown: answered TIMEOUT", accepted.trace_id)
        error = DeadlineExceeded("the Router shut down before this async request finished")
        reply = encoder.standalone(self._clock, accepted.trace_id, error=error)
        self.results.finish(accepted.trace_id, reply)
        if accepted.reply_to:
            try:
                await self.transport.deliver(
                    accepted.reply_to,
                    reply[1],
                    {"Content-Type": "application/json", "X-Reach-Trace-Id": accepted.trace_id},
                    min(self.policy.reply_timeout_ms / 1000, 2.0),
                )
            except DeliveryFailed as exc:
                log.error(
                    "[%s] the TIMEOUT answer did not reach %s (%s)",
                    accepted.trace_id,
                    loggable_url(accepted.reply_to),
                    exc,
                )

    async def close(self) -> None:
        """Abandon whatever still runs, at once."""
        await self.drain(0.0)
