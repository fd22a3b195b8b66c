"""Async requests that outlive their Router: recorded in etcd before the ``202``, adopted by
another Router when the one that accepted them dies.

The store is :class:`~reachmesh.registry.etcd.deferred.DeferredStore`; this module is the
Router's side of it: what accepting checks, and the :class:`Adopter` that looks for orphans
(requests whose Router's claim is gone) every ``async_mode.adopt_interval_seconds`` and runs
each one it wins, or, when the request had finished and only its ``replyTo`` was left, delivers
the stored result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import ValidationError

from reachmesh import jsoncodec
from reachmesh.clock import Clock
from reachmesh.config import AsyncPolicy, RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.dispatch.asyncmode import AsyncRequests, Run
from reachmesh.dispatch.results import Reply
from reachmesh.exceptions import (
    InternalError,
    Overloaded,
    PayloadTooLarge,
    ReachError,
    RegistryUnavailable,
    RequestError,
    TraceIdInUse,
    Unrecorded,
)
from reachmesh.protocol import ReachRequest
from reachmesh.registry.etcd.deferred import UNKNOWN_CLIENT, DeferredStore, Job
from reachmesh.registry.etcdclient import EtcdRejected
from reachmesh.tracecontext import new_trace_id

log = logging.getLogger("reachmesh.async")

# A look for orphans that ends this much later than the adopt interval after the one before
# waited for an etcd that did not answer (the claim leases may have lapsed meanwhile).
LATE_LOOK_S = 1.5

# What X-Reach-Idempotency-Key carries for an async request: its traceId and this suffix. The
# same on every run, by whichever Router, so an agent can recognise a second run.
IDEMPOTENCY_SUFFIX = ":async"


# How a refusal of an async request that etcd could not record begins.
NOT_RECORDED = (
    "not accepted: an async request is recorded in etcd before its 202, and etcd did not record this one"
)


def idempotency_key(trace_id: str) -> str:
    return trace_id + IDEMPOTENCY_SUFFIX


async def record_job(
    journal: DeferredStore,
    policy: AsyncPolicy,
    data: dict[str, Any],
    owner: str | None,
    reply_to: str | None,
    retry_after_s: int = 1,
    client: str = UNKNOWN_CLIENT,
) -> ReachError | None:
    """Record an accepted request in etcd; the error to answer instead of ``202``, if any.
    ``client`` is who it is counted for (its result's share), by whichever Router runs it."""
    envelope = jsoncodec.dumps(data)
    trace_id = str(data["traceId"])
    if len(envelope) > policy.etcd_max_request_bytes:
        return PayloadTooLarge(
            f"an async request is recorded in etcd before it is accepted, and this one is "
            f"{len(envelope)} bytes, over async_mode.etcd_max_request_bytes "
            f"({policy.etcd_max_request_bytes}); "
            "send it with mode sync, or a smaller payload"
        )
    if journal.pending >= policy.etcd_max_pending:
        return Overloaded(
            f"{journal.pending} async requests wait in etcd (async_mode.etcd_max_pending)",
            retry_after_s=retry_after_s,
        )
    if not journal.lease:
        return Unrecorded(
            f"{NOT_RECORDED}: this Router holds no claim lease in etcd yet; retry in a moment",
            retry_after_s=retry_after_s,
        )
    try:
        accepted = await journal.accept(trace_id, envelope, owner, reply_to, client)
    except (EtcdRejected, RegistryUnavailable) as exc:
        # Not load: etcd did not answer or refused. Calls in mode sync still route meanwhile.
        return Unrecorded(
            f"{NOT_RECORDED}: {exc}; retry in a moment, or send it with mode sync",
            retry_after_s=retry_after_s,
        )
    if not accepted:
        return TraceIdInUse(f"traceId {trace_id!r} is already in use by an async request")
    journal.pending += 1
    return None


class Dispatching(Protocol):
    """What running an async request needs of the dispatcher (it is one)."""

    clock: Clock
    async_requests: AsyncRequests

    async def dispatch(
        self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord
    ) -> Reply: ...

    def refuse(
        self,
        error: ReachError,
        *,
        started: float | None = None,
        trace_id: str | None = None,
        task: Any = None,
    ) -> Reply: ...


def runner(
    dispatching: Dispatching, request: ReachRequest, data: dict[str, Any], record: DecisionRecord
) -> Run:
    """The background run of an accepted (or adopted) async request."""
    trace_id = record.trace_id

    async def run() -> Reply:
        try:
            return await dispatching.dispatch(request, data, record)
        except Exception:  # a bug: the caller still gets one ReachResponse, counted and traced
            log.exception("[%s] async request failed inside the Router", trace_id)
            return dispatching.refuse(InternalError(), trace_id=trace_id, task=request.target_task)

    return run


def start_adopted(dispatching: Dispatching, job: Job) -> None:
    """Run a request another Router accepted and did not finish."""
    try:
        data = jsoncodec.loads(job.envelope)
        request = ReachRequest.model_validate(data)
    except (jsoncodec.JSONDecodeError, ValidationError) as exc:
        raise RequestError(f"the recorded request no longer decodes: {exc}") from exc
    clock = dispatching.clock
    record = DecisionRecord(
        trace_id=str(data["traceId"]),
        task=request.target_task,
        source=request.source_agent or "-",
        started=clock.monotonic(),
        started_wall=clock.time(),
        conversation_id=request.conversation_id,
        mode="async",
        idempotency_key=idempotency_key(str(data["traceId"])),
        # Counted for its client (turns at a full agent, its result's share), as the Router that
        # accepted it counted it.
        client=job.client,
    )
    run = runner(dispatching, request, data, record)
    reply_to = request.preferences.reply_to
    dispatching.async_requests.start(
        record.trace_id, run, reply_to, job.owner, job.client, request.target_task
    )


async def admit(
    journal: DeferredStore | None,
    config: RouterConfig,
    data: dict[str, Any],
    record: DecisionRecord,
    owner: str | None,
    reply_to: str | None,
    client: str = UNKNOWN_CLIENT,
) -> ReachError | None:
    """Before an async request is accepted: give it its idempotency key (the same on every run,
    by whichever Router) and, with etcd, record it there (:func:`accept`)."""
    record.idempotency_key = idempotency_key(record.trace_id)
    if journal is None:
        return None
    failed = await accept(journal, config, data, record, (owner, client), reply_to)
    record.idempotency_key = idempotency_key(record.trace_id)  # the traceId may have been replaced
    return failed


async def accept(
    journal: DeferredStore,
    config: RouterConfig,
    data: dict[str, Any],
    record: DecisionRecord,
    caller: tuple[str | None, str],
    reply_to: str | None,
) -> ReachError | None:
    """Record the request in etcd before its 202; the error to answer instead, if any.
    ``caller`` is (who may fetch the result, who it is counted for). A traceId taken in etcd by
    another caller is replaced, as one taken on this Router is: refusing would tell this caller
    that the other's request exists."""
    (owner, client), policy = caller, config.async_mode
    retry_after = config.limits.retry_after_seconds
    failed = await record_job(journal, policy, data, owner, reply_to, retry_after, client)
    if isinstance(failed, TraceIdInUse) and not await owned_by(journal, record.trace_id, owner):
        record.trace_id = data["traceId"] = new_trace_id()
        failed = await record_job(journal, policy, data, owner, reply_to, retry_after, client)
    return failed


async def owned_by(journal: DeferredStore, trace_id: str, owner: str | None) -> bool:
    """Whether the async request recorded in etcd under ``trace_id`` is ``owner``'s."""
    try:
        stored, job = await journal.lookup(trace_id)
    except (EtcdRejected, RegistryUnavailable):
        return True  # unknown: refuse rather than guess
    found = stored.owner if stored is not None else job.owner if job is not None else owner
    return found == owner


class Adopter:
    """Finds orphaned requests and runs the ones this Router wins."""

    def __init__(
        self,
        journal: DeferredStore,
        requests: AsyncRequests,
        run: Callable[[Job], None],
    ) -> None:
        self.journal = journal
        self.requests = requests
        self._run = run
        self._task: asyncio.Task[None] | None = None
        self.adopted = 0
        # After etcd was out of reach, every Router's claim lease may have lapsed at once, and
        # the Routers still running those requests claim them again at their next look: until
        # this loop time, only this Router's own requests are claimed, never another's.
        self._quiet_until = 0.0
        self._lost_touch = False
        self._last_look: float | None = None  # loop time the last look at etcd ended

    async def start(self) -> None:
        """Claim a lease now (async requests are refused until one is held), then look for
        orphans in the background; with etcd out of reach, the loop keeps trying. The Router's
        start does not wait for an etcd known to be out of reach, nor try a member twice."""
        try:
            if not self.journal.reachable:
                raise RegistryUnavailable("etcd is out of reach")
            await self.journal.start(once=True)
        except (EtcdRejected, RegistryUnavailable) as exc:
            log.warning("async requests wait for etcd: no claim lease yet (%s)", exc)
        self._task = asyncio.create_task(self._loop(), name="reach-async-adopter")

    async def close(self) -> None:
        """Stop looking, and release this Router's claims (revoke its lease) so that what it
        leaves unfinished is adopted at once by another Router."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            # The results etcd did not take yet, before the claims go: else another Router adopts
            # a finished request and runs it again. The jobs stay: their adopter delivers replyTo
            # from the result (at least once), as for a Router that died delivering.
            await self.requests.settle(release=False)
        except (EtcdRejected, RegistryUnavailable) as exc:
            log.warning("finished async requests not written to etcd at shutdown (%s): others run them", exc)
        try:
            await self.journal.close(release=True)
        except (EtcdRejected, RegistryUnavailable) as exc:
            log.warning("could not release the claim lease (%s): others adopt once it runs out", exc)

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except (EtcdRejected, RegistryUnavailable) as exc:
                self._lost_touch = True
                log.debug("looking for orphaned async requests: %s", exc)
            await asyncio.sleep(self.journal.policy.adopt_interval_seconds)

    async def tick(self) -> None:
        """One look: claim the lease if needed, settle what etcd did not take when this Router
        finished it, adopt orphans, trim old results."""
        if not self.journal.lease:
            await self.journal.start()
        await self.requests.settle()
        orphans = await self.journal.orphans()
        now = asyncio.get_running_loop().time()
        if (
            self._last_look is not None
            and now - self._last_look > self.journal.policy.adopt_interval_seconds + LATE_LOOK_S
        ):
            self._lost_touch = True  # a look that waited this long waited for etcd
        self._last_look = now
        quiet = self._quiet(bool(orphans))
        for job in orphans:
            if quiet and not self.requests.busy(job.trace_id):
                continue  # its Router may be about to claim it again
            if await self.journal.adopt(job):
                await self._take(job)
        await self.journal.trim_results()

    def _quiet(self, orphans: bool) -> bool:
        """Whether this look must leave other Routers' orphans alone: etcd has just come back
        (this Router lost touch with it), and their Routers need a keepalive tick to notice a
        lapsed claim lease and an adopter tick to claim their requests again."""
        now = asyncio.get_running_loop().time()
        if self._lost_touch or self.journal.lost_touch:
            self._lost_touch = self.journal.lost_touch = False
            policy = self.journal.policy
            grace = policy.claim_ttl_seconds / 3 + 2 * policy.adopt_interval_seconds
            self._quiet_until = now + grace
            if orphans:
                log.info("etcd answers again: adopting no other Router's request for %.1f s", grace)
        return now < self._quiet_until

    async def _take(self, job: Job) -> None:
        if self.requests.busy(job.trace_id):
            # Its own request, whose claim went with a lease that lapsed (etcd was out of reach
            # for longer than claim_ttl_seconds): claimed again under the new lease, still running.
            log.info("[%s] claimed again after the claim lease lapsed", job.trace_id)
            return
        self.adopted += 1
        stored = await self.journal.result(job.trace_id)
        if stored is not None:
            # Finished, but its Router died before replyTo was done: deliver, do not run again.
            log.info("[%s] adopted a finished async request: delivering its result", job.trace_id)
            body = stored.body if stored.body is not None else b""
            self.requests.hand_over(job.trace_id, job.reply_to if stored.body is not None else None, body)
            return
        log.warning(
            "[%s] adopted an async request its Router left unfinished (run %d)", job.trace_id, job.attempt + 1
        )
        try:
            self._run(job)
        except ReachError as exc:  # a record that no longer decodes: finish it as refused
            log.error("[%s] an adopted async request cannot run: %s", job.trace_id, exc.message)
            await self.journal.release(job.trace_id)
