"""An agent's own gate: at most ``max_concurrency`` handlers at once, and repeats answered once.

- **Busy.** The (N+1)th concurrent request is answered ``429`` with ``Retry-After`` and a
  retryable ``AGENT_BUSY`` error: the Router reads a 429 as "busy, not broken" and fails over,
  so even a Router that does not keep capacity (PROTOCOL §15) cannot overload the agent. It is
  answered so only once no slot came free within :data:`BUSY_GRACE_S` (or its deadline): a
  Router that keeps capacity sends the next call from its queue the moment an attempt ends
  there, at its deadline or read timeout, and the handler of that attempt is stopped here a
  moment later (its own deadline, or the caller watch, :data:`.streaming.CALLER_WATCH_S`); refused
  at once, that call lost its place after waiting its turn, for nothing.
- **Repeats.** The Router sends an ``Idempotency-Key`` (the request's trace id and a per-request
  id), the same on every attempt of one request. A request whose key was answered in the last
  :data:`REPEAT_TTL_S` seconds gets the same answer again, and one whose first copy is still
  running waits for that one's answer: the handler never runs twice for one request. A repeat is
  the same key *and* the same task and payload (its fingerprint): a key sent again with another
  request (a caller reusing a trace id for an async request, whose key follows from it, or one
  guessing a key) runs that request, and is never given the other's answer. The cache is
  bounded: :data:`REPEAT_MAX_KEYS` keys, answers up to :data:`REPEAT_MAX_BYTES` each, and
  ``max_bytes`` of answers in all (:data:`REPEAT_CACHE_BYTES` by default; ``server.repeat_cache_bytes``
  in reach_config.yaml, ``ReachAgent(repeat_cache_bytes=...)``), the oldest forgotten first.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

from aiohttp import web

from reachmesh import jsoncodec

REPEAT_TTL_S = 60.0
REPEAT_MAX_KEYS = 1024
REPEAT_MAX_BYTES = 64 * 1024
# All the answers kept at once: the key and size bounds alone allowed 64 MiB.
REPEAT_CACHE_BYTES = 16 * 1024 * 1024
# A key longer than this is not remembered (the Router's is about 50 characters).
MAX_KEY_CHARS = 200
BUSY_RETRY_AFTER_S = 1
# How long a call past max_concurrency waits for a slot before it is answered busy: the caller
# watch's period (0.25 s) and a margin, so a handler whose caller left frees its slot in time.
BUSY_GRACE_S = 0.3

_UNFINISHED = jsoncodec.dumps(
    {
        "status": "AGENT_ERROR",
        "error": {
            "code": "REPEAT_UNFINISHED",
            "message": "the first copy of this request did not finish here",
            "retryable": True,
        },
    }
)

Answer = tuple[int, bytes]  # status and JSON body: what a repeat is given back


def fingerprint(task: str, payload: object) -> bytes:
    """What makes two requests under one Idempotency-Key the same request: task and payload."""
    return hashlib.blake2b(jsoncodec.dumps([task, payload]), digest_size=16).digest()


def busy_answer(limit: int) -> web.Response:
    error = {
        "code": "AGENT_BUSY",
        "message": f"the agent is running its {limit} requests at once (max_concurrency); retry later",
        "retryable": True,
    }
    return web.Response(
        status=429,
        body=jsoncodec.dumps({"status": "AGENT_ERROR", "error": error}),
        content_type="application/json",
        headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
    )


class Gate:
    """Counts handlers in flight and remembers recent answers by idempotency key."""

    def __init__(
        self,
        max_concurrency: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = REPEAT_CACHE_BYTES,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.inflight = 0
        self.busy_grace_s = BUSY_GRACE_S
        # Calls waiting for a slot, first come first served; a slot that ends goes to the first.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.max_bytes = max_bytes  # of the answers kept, in all
        self.bytes_held = 0
        self._clock = clock
        # key -> (expires, the request's fingerprint, its answer), oldest first
        self._answers: OrderedDict[str, tuple[float, bytes, asyncio.Future[Answer]]] = OrderedDict()
        self._sizes: dict[str, int] = {}  # key -> its answer's bytes, once it has one

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def serve(
        self,
        key: str | None,
        run: Callable[[], Awaitable[web.StreamResponse]],
        fingerprint: bytes = b"",
        wait_s: float | None = None,
    ) -> web.StreamResponse:
        """``run()``'s answer, or a remembered one for ``key`` (of a request with the same
        ``fingerprint``: task and payload), or busy when full and no slot came free within the
        grace (``wait_s`` at most: what is left of the request's deadline)."""
        usable = key if key and len(key) <= MAX_KEY_CHARS else None
        if usable is not None:
            known = self._recall(usable)
            if known is not None:
                if known[0] != fingerprint:
                    usable = None  # another request under a known key: run it, keep the first
                else:
                    status, body = await asyncio.shield(known[1])
                    return web.Response(status=status, body=body, content_type="application/json")
        limit = self.max_concurrency
        if limit is None or (self.inflight < limit and not self.waiting):
            self.inflight += 1
        else:
            grace = self.busy_grace_s if wait_s is None else min(self.busy_grace_s, wait_s)
            if grace <= 0 or not await self._slot_within(grace):
                return busy_answer(limit)
        pending: asyncio.Future[Answer] | None = None
        if usable is not None:
            pending = asyncio.get_running_loop().create_future()
            self._remember(usable, fingerprint, pending)
        response: web.StreamResponse | None = None
        try:
            response = await run()
            return response
        finally:
            self._release()
            if pending is not None:
                self._settle(usable or "", pending, response)

    async def _slot_within(self, grace: float) -> bool:
        """Wait up to ``grace`` seconds for a slot handed over by :meth:`_release`; True once
        this call holds it (``inflight`` already counts it)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        owned = False
        try:
            async with asyncio.timeout(grace):
                await waiter
            owned = True
        except TimeoutError:
            owned = waiter.done() and not waiter.cancelled()  # handed over as the time ran out
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if not owned and waiter.done() and not waiter.cancelled():
                self._release()  # handed over as this call was cancelled: pass it on
        return owned

    def _release(self) -> None:
        """A slot ends: handed to the first call still waiting, else freed."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.inflight -= 1

    def _settle(self, key: str, pending: asyncio.Future[Answer], response: web.StreamResponse | None) -> None:
        """Give waiting repeats the answer, and keep it for later ones when it is small enough (a
        streamed answer, gone as it was written, is not kept)."""
        raw = getattr(response, "body", None)
        body = raw if isinstance(raw, bytes) else None
        if response is None or body is None or len(body) > min(REPEAT_MAX_BYTES, self.max_bytes):
            # The first copy did not finish (or its answer is too big to keep): a repeat waiting
            # on it is told to try again, and the key is forgotten.
            self._forget(key)
            pending.set_result((503, _UNFINISHED))
            return
        pending.set_result((response.status, body))
        kept = self._answers.get(key)
        if kept is not None and kept[2] is pending:
            self._sizes[key] = len(body)
            self.bytes_held += len(body)
            self._evict_to(self.max_bytes)

    def _evict_to(self, max_bytes: int) -> None:
        """Forget the oldest answers until those kept hold ``max_bytes`` at most. A request still
        running holds no bytes yet, and stays: its repeats wait for it."""
        if self.bytes_held <= max_bytes:
            return
        for key in [key for key in self._answers if key in self._sizes]:
            self._forget(key)
            if self.bytes_held <= max_bytes:
                return

    def _forget(self, key: str) -> None:
        self._answers.pop(key, None)
        self.bytes_held -= self._sizes.pop(key, 0)

    def _recall(self, key: str) -> tuple[bytes, asyncio.Future[Answer]] | None:
        found = self._answers.get(key)
        if found is None:
            return None
        expires, fingerprint, answer = found
        if expires < self._clock() or answer.cancelled():
            self._forget(key)
            return None
        return fingerprint, answer

    def _remember(self, key: str, fingerprint: bytes, answer: asyncio.Future[Answer]) -> None:
        now = self._clock()
        while self._answers:
            oldest_key, (expires, _, _) = next(iter(self._answers.items()))
            if expires >= now and len(self._answers) < REPEAT_MAX_KEYS:
                break
            self._forget(oldest_key)
        self._forget(key)  # a key seen again (another request under it) starts over, newest
        self._answers[key] = (now + REPEAT_TTL_S, fingerprint, answer)
