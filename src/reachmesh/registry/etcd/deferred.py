"""Deferred (``mode: async``) requests kept in etcd, so that accepted work outlives its Router.

Keys, under the registry's prefix::

    {prefix}/async/job/{traceId}      the accepted request (JSON: envelope, owner, replyTo,
                                      attempt), no lease: it stays until the work is done
    {prefix}/async/claim/{traceId}    the name of the Router running it, on that Router's lease
    {prefix}/async/result/{traceId}   the ReachResponse (JSON: status, body, owner), on a lease
                                      of async_mode.result_ttl_seconds
    {prefix}/async/size/{traceId}     that result's size in bytes, on the same lease: the bounds
                                      on results are kept by reading these, not the results
    {prefix}/async/share/{traceId}    whose share of the results it takes (a digest of the
                                      client: a caller token, or an address with auth off), on
                                      the same lease; absent for a client not known

- Accepting is one transaction: the job and the claim are written only if neither the job nor a
  result exists for that traceId, before the caller gets its ``202``.
- The claim lives on the Router's own etcd lease (``claim_ttl_seconds``, kept alive while the
  Router lives): when the Router dies, etcd deletes its claims by itself.
- A job without a claim is an orphan. Adopting it is a transaction too: the claim must still be
  absent and the job unchanged since it was read, so exactly one Router wins it.
- The first result written wins (a transaction on the result's absence); only the Router that
  wrote it delivers ``replyTo``, then deletes the job and the claim. A Router that dies while
  delivering leaves the job behind with its result: the adopter delivers that result again
  rather than run the request again (``replyTo`` is delivered at least once).
- Results are bounded as in memory: each client keeps at most ``max_results_per_client`` results
  and ``max_result_bytes_per_client`` bytes of them (its own oldest go first, nobody else's),
  then all of them at most ``etcd_max_results`` and ``etcd_max_total_result_bytes`` (the oldest
  of the client holding the most go first). With the bounds in all alone, one caller's flood of
  async requests pushed every other caller's results out of etcd; with the oldest going first
  whoever's, four callers that filled their shares did.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import heapq
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reachmesh import jsoncodec
from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import AsyncPolicy
from reachmesh.exceptions import RegistryUnavailable
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcdclient import (
    EtcdClient,
    EtcdRejected,
    KeyValue,
    compare_create,
    compare_mod,
    delete_op,
    put_op,
    range_op,
)

# Results dropped per transaction when trimming: three keys each, within etcd's default
# --max-txn-ops of 128.
TRIM_BATCH = 32

# Who a request is counted for when its client is not known (adopted from a Router that did
# not record it, with auth off): no share of its own, as in memory.
UNKNOWN_CLIENT = "-"

log = logging.getLogger("reachmesh.async")


@dataclass(frozen=True, slots=True)
class Job:
    """An accepted request as etcd holds it."""

    trace_id: str
    envelope: bytes
    owner: str | None
    reply_to: str | None
    attempt: int
    revision: int  # the job key's mod revision when read: what an adoption compares against
    client: str = UNKNOWN_CLIENT  # whose share of the results its result takes


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A finished request's answer as etcd holds it; ``body`` is None when it was too large."""

    status: int
    body: bytes | None
    owner: str | None
    size: int


class DeferredStore:
    """The etcd side of deferred requests for one Router (see the module's docstring)."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        router: str,
        policy: AsyncPolicy,
        *,
        clock: Clock = SYSTEM_CLOCK,
        health: Health | None = None,
    ) -> None:
        self.client = client
        # The registry's view of etcd: while etcd is out of reach, what a caller waits on
        # (accepting, reading a result) fails within one attempt, as registrations do, and a
        # refusal (a login, a role, a full quota) says what to fix.
        self._health = health
        self.router = router
        self.policy = policy
        self._clock = clock
        self.jobs = prefix + "/async/job/"
        self.claims = prefix + "/async/claim/"
        self.results = prefix + "/async/result/"
        self.sizes = prefix + "/async/size/"
        self.shares = prefix + "/async/share/"
        self.lease = 0
        self._result_lease = (0, 0.0)  # (lease, monotonic time until which it is reused)
        self._keeper: asyncio.Task[None] | None = None
        # Set when keeping the claim lease failed or it lapsed: etcd was out of reach, so the
        # other Routers' claims may have lapsed too (the Adopter waits before adopting).
        self.lost_touch = False
        # Read by /metrics: refreshed by every scan for orphans.
        self.pending = 0
        self.held = 0
        self.held_bytes = 0

    def apply(self, policy: AsyncPolicy) -> None:
        """Take a reloaded policy for the next records and sweeps."""
        self.policy = policy

    # -- the Router's lease ------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """False while the registry knows etcd is out of reach (no member answers)."""
        return self._health is None or self._health.unreachable is None

    async def start(self, *, once: bool = False) -> None:
        """Grant this Router's claim lease and keep it alive until :meth:`close` (``once``: each
        member tried once at most)."""
        self.lease = await self.client.grant(self.policy.claim_ttl_seconds, once=once)
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_alive(), name="reach-async-claims")

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.policy.claim_ttl_seconds / 3)
            try:
                if await self.client.keepalive(self.lease) > 0:
                    continue
                # Lost (etcd was out of reach longer than the TTL): the claims went with it, and
                # another Router may run those requests too; new ones go under a new lease.
                log.warning("the claim lease ran out; requests this Router runs may be adopted by another")
                self.lost_touch = True
                self.lease = await self.client.grant(self.policy.claim_ttl_seconds)
            except (EtcdRejected, RegistryUnavailable) as exc:  # try again at the next tick
                self.lost_touch = True
                log.warning("cannot keep the claim lease alive: %s", exc)

    async def close(self, *, release: bool) -> None:
        """Stop keeping the lease; with ``release``, revoke it so others adopt at once."""
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if release and self.lease:
            await self.client.revoke(self.lease)

    # -- accepting and finishing -------------------------------------------------------------

    def _deadline(self) -> float | None:
        return None if self._health is None else self._health.deadline()

    def _refused(self, exc: EtcdRejected, what: str) -> RegistryUnavailable | EtcdRejected:
        return exc if self._health is None else self._health.refused_call(exc, what, write=True)

    async def accept(
        self,
        trace_id: str,
        envelope: bytes,
        owner: str | None,
        reply_to: str | None,
        client: str = UNKNOWN_CLIENT,
    ) -> bool:
        """Record an accepted request and claim it; False when the traceId is taken. ``client``
        is who it is counted for, by whichever Router runs it. Raises RegistryUnavailable (or
        EtcdRejected without the registry's health) when etcd does not record it."""
        job = {
            "envelope": envelope.decode(),
            "owner": owner,
            "replyTo": reply_to,
            "attempt": 1,
            "client": client,
        }
        try:
            result = await self.client.txn(
                [compare_create(self.jobs + trace_id, 0), compare_create(self.results + trace_id, 0)],
                [
                    put_op(self.jobs + trace_id, jsoncodec.dumps(job)),
                    put_op(self.claims + trace_id, self.router.encode(), self.lease),
                ],
                deadline=self._deadline(),
            )
        except EtcdRejected as exc:
            raise self._refused(exc, "the write") from exc
        return result.succeeded

    async def finish(
        self, trace_id: str, status: int, body: bytes, owner: str | None, client: str = UNKNOWN_CLIENT
    ) -> bool:
        """Write the result unless one is there; True when this one was written (its writer
        delivers replyTo). A body over ``etcd_max_result_bytes`` is recorded without itself.
        ``client`` is whose share of the results it takes."""
        stored: dict[str, Any] = {"status": status, "owner": owner, "size": len(body)}
        if len(body) <= self.policy.etcd_max_result_bytes:
            stored["body"] = base64.b64encode(body).decode()
        value = jsoncodec.dumps(stored)
        lease = await self._lease_for_results()
        writes = [
            put_op(self.results + trace_id, value, lease),
            put_op(self.sizes + trace_id, str(len(value)).encode(), lease),
        ]
        if client != UNKNOWN_CLIENT:
            # In the same transaction as the size: a trim that reads the sizes first, then the
            # shares, finds the share of every result it counts.
            writes.append(put_op(self.shares + trace_id, client_digest(client), lease))
        result = await self.client.txn([compare_create(self.results + trace_id, 0)], writes)
        return result.succeeded

    async def _lease_for_results(self) -> int:
        """A lease for results written now: one per tenth of the result TTL, so results cost
        etcd a handful of leases, each living the TTL plus at most that tenth."""
        lease, until = self._result_lease
        now = self._clock.monotonic()
        if lease and now < until:
            return lease
        ttl = self.policy.result_ttl_seconds
        step = max(ttl / 10, 1.0)
        lease = await self.client.grant(ttl + step)
        self._result_lease = (lease, now + step)
        return lease

    async def release(self, trace_id: str) -> None:
        """The work is done (result written, replyTo tried): drop the job and the claim."""
        await self.client.txn([], [delete_op(self.jobs + trace_id), delete_op(self.claims + trace_id)])

    # -- reading -----------------------------------------------------------------------------

    async def result(self, trace_id: str) -> StoredResult | None:
        _, kv = await self.client.get(self.results + trace_id, deadline=self._deadline())
        return None if kv is None else _stored(kv.value)

    async def lookup(self, trace_id: str) -> tuple[StoredResult | None, Job | None]:
        """``trace_id``'s result, else its job, in one read: a poll (of an id that may not
        exist) costs etcd one round trip, not two, and sees both at one revision."""
        read = await self.client.txn(
            [], [range_op(self.results + trace_id), range_op(self.jobs + trace_id)], deadline=self._deadline()
        )
        results, jobs = read.ranges if len(read.ranges) == 2 else ([], [])
        if results:
            return _stored(results[0].value), None
        return None, (_job(trace_id, jobs[0].value, jobs[0].mod_revision) if jobs else None)

    async def job(self, trace_id: str) -> Job | None:
        _, kv = await self.client.get(self.jobs + trace_id, deadline=self._deadline())
        return None if kv is None else _job(trace_id, kv.value, kv.mod_revision)

    # -- adoption ----------------------------------------------------------------------------

    async def orphans(self) -> list[Job]:
        """Jobs whose claim is gone (their Router died), read whole; counts refreshed."""
        jobs = await self.client.keys(self.jobs)
        claims = {kv.key.removeprefix(self.claims) for kv in await self.client.keys(self.claims)}
        self.pending = len(jobs)
        found: list[Job] = []
        for kv in jobs:
            trace_id = kv.key.removeprefix(self.jobs)
            if trace_id in claims:
                continue
            job = await self.job(trace_id)
            if job is not None:
                found.append(job)
        return found

    async def adopt(self, job: Job) -> bool:
        """Claim an orphan; True for the one Router whose claim went in."""
        data = {
            "envelope": job.envelope.decode(),
            "owner": job.owner,
            "replyTo": job.reply_to,
            "attempt": job.attempt + 1,
            "client": job.client,
        }
        result = await self.client.txn(
            [
                compare_create(self.claims + job.trace_id, 0),
                compare_mod(self.jobs + job.trace_id, job.revision),
            ],
            [
                put_op(self.claims + job.trace_id, self.router.encode(), self.lease),
                put_op(self.jobs + job.trace_id, jsoncodec.dumps(data)),
            ],
        )
        return result.succeeded

    async def trim_results(self) -> None:
        """Keep each client within its share of the results in etcd (``max_results_per_client``,
        ``max_result_bytes_per_client``: its own oldest go, its newest always stays), then all of
        them within ``etcd_max_results`` and ``etcd_max_total_result_bytes`` (the oldest of
        whoever holds the most go first: :meth:`_over_all`); count them for /metrics."""
        # The sizes first: each was written with its share, so every one counted has its share
        # in the read that follows (a result written between the two reads is left to the next).
        _, sizes = await self.client.get_prefix(self.sizes)
        held = sorted(sizes, key=lambda kv: kv.create_revision)
        total = sum(_size(kv.value) for kv in held)
        policy = self.policy
        gone: set[str] = set()
        over_all = len(held) > policy.etcd_max_results or total > policy.etcd_max_total_result_bytes
        over_one = len(held) > policy.max_results_per_client or total > policy.max_result_bytes_per_client
        if over_all or over_one:
            # Only then may a client be past its share, or some results go: fewer results than
            # one share are not worth reading whose they are.
            _, shares = await self.client.get_prefix(self.shares)
            whose = {kv.key.removeprefix(self.shares): kv.value for kv in shares}
            gone = self._over_shares(held, whose)
            held = [kv for kv in held if kv.key not in gone]
            total = sum(_size(kv.value) for kv in held)
            if len(held) > policy.etcd_max_results or total > policy.etcd_max_total_result_bytes:
                gone |= self._over_all(held, whose)
                held = [kv for kv in held if kv.key not in gone]
                total = sum(_size(kv.value) for kv in held)
        await self._drop_results(key.removeprefix(self.sizes) for key in gone)
        self.held, self.held_bytes = len(held), total

    def _over_all(self, held: list[KeyValue], whose: dict[str, bytes]) -> set[str]:
        """The size keys of the results past the bounds in all: the oldest of the client that
        holds the most (bytes while over ``etcd_max_total_result_bytes``, then results while
        over ``etcd_max_results``; the older oldest on a tie), one at a time. Oldest first
        whoever's, a few clients that each filled their share pushed every other client's
        results out (four at the defaults). Results of no known client count as one client."""
        by_client: dict[bytes | None, deque[KeyValue]] = {}
        for kv in held:  # oldest first
            by_client.setdefault(whose.get(kv.key.removeprefix(self.sizes)), deque()).append(kv)
        sizes = {client: sum(_size(kv.value) for kv in mine) for client, mine in by_client.items()}
        count, total = len(held), sum(sizes.values())
        most, most_bytes = self.policy.etcd_max_results, self.policy.etcd_max_total_result_bytes
        gone: set[str] = set()
        while count > most or total > most_bytes:
            by_bytes = total > most_bytes

            def rank(client: bytes | None, by_bytes: bool = by_bytes) -> tuple[int, int]:
                mine = by_client[client]
                return -(sizes[client] if by_bytes else len(mine)), mine[0].create_revision

            # The clients by what they hold, most first (a heap: a trim after a burst drops many).
            heap = [(*rank(client), i, client) for i, client in enumerate(by_client)]
            heapq.heapify(heap)
            while heap and (count > most or total > most_bytes) and (total > most_bytes) == by_bytes:
                *_, i, client = heapq.heappop(heap)
                oldest = by_client[client].popleft()
                gone.add(oldest.key)
                sizes[client] -= _size(oldest.value)
                count, total = count - 1, total - _size(oldest.value)
                if by_client[client]:
                    heapq.heappush(heap, (*rank(client), i, client))
        return gone

    def _over_shares(self, held: list[KeyValue], whose: dict[str, bytes]) -> set[str]:
        """The size keys of the results past their client's share: each client's oldest first,
        never its newest; ``held`` is oldest first."""
        by_client: dict[bytes, list[KeyValue]] = {}
        for kv in held:
            client = whose.get(kv.key.removeprefix(self.sizes))
            if client is not None:  # no share: a client not known, or written before shares
                by_client.setdefault(client, []).append(kv)
        policy = self.policy
        gone: set[str] = set()
        for mine in by_client.values():
            count, total = len(mine), sum(_size(kv.value) for kv in mine)
            for oldest in mine[:-1]:
                if count <= policy.max_results_per_client and total <= policy.max_result_bytes_per_client:
                    break
                gone.add(oldest.key)
                count, total = count - 1, total - _size(oldest.value)
        return gone

    async def _drop_results(self, trace_ids: Iterable[str]) -> None:
        """Delete these results (their sizes and shares with them), a batch per transaction."""
        batch: list[dict[str, Any]] = []
        for trace_id in trace_ids:
            batch += [
                delete_op(self.results + trace_id),
                delete_op(self.sizes + trace_id),
                delete_op(self.shares + trace_id),
            ]
            if len(batch) >= 3 * TRIM_BATCH:
                await self.client.txn([], batch)
                batch = []
        if batch:
            await self.client.txn([], batch)


def client_digest(client: str) -> bytes:
    """A client's name in etcd: 128 bits of its SHA-256 (a token's key or an address, never
    the name itself, and each of the same length)."""
    return hashlib.sha256(client.encode()).hexdigest()[:32].encode()


def _size(raw: bytes) -> int:
    """A size key's value; a value that is not a number counts as nothing."""
    return int(raw) if raw.isdigit() and len(raw) < 16 else 0


def _stored(raw: bytes) -> StoredResult:
    data = jsoncodec.loads(raw)
    body = data.get("body")
    return StoredResult(
        int(data["status"]),
        base64.b64decode(body) if isinstance(body, str) else None,
        data.get("owner"),
        int(data.get("size", 0)),
    )


def _job(trace_id: str, raw: bytes, revision: int) -> Job:
    data = jsoncodec.loads(raw)
    return Job(
        trace_id=trace_id,
        envelope=str(data["envelope"]).encode(),
        owner=data.get("owner"),
        reply_to=data.get("replyTo"),
        attempt=int(data.get("attempt", 1)),
        revision=revision,
        # A job recorded before clients were: counted for its owner, as it was then.
        client=str(data.get("client") or data.get("owner") or UNKNOWN_CLIENT),
    )
