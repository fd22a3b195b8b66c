"""Results of ``mode: async`` requests, kept for a while and fetched by traceId.

Bounded: at most ``max_results`` finished results and ``max_result_bytes`` of their bodies (the
oldest dropped first, the newest always kept), each kept for ``result_ttl_seconds``; pending
requests are bounded by the Router's in-flight limit. A count alone let a caller hold 10,000
answers of up to 8 MiB each.

Each client (a caller token, or an address with auth off) also has a share of the store:
``max_results_per_client`` results and ``max_result_bytes_per_client`` bytes. Past its share a
client's own oldest result goes, nobody else's: with the global bounds alone, one caller's flood
of small async requests pushed every other caller's answers out before they polled. Past the
bounds in all, the oldest of the client holding the most goes first, not the oldest whoever's.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import AsyncPolicy
from reachmesh.tally import Tally

# (HTTP status, ReachResponse body), as reachmesh.dispatch.encoder encodes it.
Reply = tuple[int, bytes]


class ResultStore:
    """traceId -> pending, or the finished (HTTP status, ReachResponse body)."""

    def __init__(self, policy: AsyncPolicy | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy or AsyncPolicy()
        self._clock = clock
        self._pending: set[str] = set()
        self._owners: dict[str, str] = {}
        self._done: OrderedDict[str, tuple[Reply, float]] = OrderedDict()
        self._bytes = 0
        # Who each request is counted for, and each client's finished results (oldest first)
        # with their bytes: the client's share is checked without a walk of the whole store.
        self._clients: dict[str, str] = {}
        self._by_client: dict[str, OrderedDict[str, None]] = {}
        self._client_bytes: dict[str, int] = {}
        # Who holds the most, kept as results come and go, not found by a walk of every client
        # at each eviction (with thousands of clients, 0.3 ms a finished result): the clients
        # by how many results they hold (each count's in the order they came to it) and the
        # largest count; and a heap of (-bytes, n, client), an entry pushed at each change, the
        # stale ones dropped as they come to the top and all of them now and then.
        self._counts = Tally()
        self._heavy: list[tuple[int, int, str]] = []
        self._pushes = itertools.count()
        self.evicted = 0

    def apply(self, policy: AsyncPolicy) -> None:
        """Take a reloaded policy; results already held keep until the new bounds drop them."""
        self.policy = policy

    @property
    def bytes_held(self) -> int:
        """Bytes of finished ReachResponse bodies held now (the ``/metrics`` gauge)."""
        return self._bytes

    @property
    def held(self) -> int:
        return len(self._done)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def known(self, trace_id: str) -> bool:
        return trace_id in self._pending or self.get(trace_id) is not None

    def start(self, trace_id: str, owner: str | None = None, client: str = "-") -> None:
        """``owner`` may fetch the result; ``client`` is whose share of the store it takes."""
        self._pending.add(trace_id)
        self._clients[trace_id] = client
        if owner is not None:
            self._owners[trace_id] = owner

    def held_for(self, client: str) -> tuple[int, int]:
        """(results, bytes) of ``client``'s finished results held now."""
        return len(self._by_client.get(client, ())), self._client_bytes.get(client, 0)

    def owner(self, trace_id: str) -> str | None:
        """Who started the request (a token's fingerprint), or None when auth was off."""
        return self._owners.get(trace_id)

    def finish(self, trace_id: str, reply: Reply) -> None:
        self._pending.discard(trace_id)
        client = self._clients.get(trace_id, "-")
        self._drop(trace_id)
        self._clients[trace_id] = client
        self._done[trace_id] = (reply, self._clock.monotonic() + self.policy.result_ttl_seconds)
        self._bytes += len(reply[1])
        mine = self._by_client.setdefault(client, OrderedDict())
        mine[trace_id] = None
        self._client_bytes[client] = self._client_bytes.get(client, 0) + len(reply[1])
        self._held_changed(client, len(mine) - 1)
        policy = self.policy
        # The client's own share first (its newest result is always kept) ...
        while len(mine) > 1 and self._over_share(client, len(mine)):
            self._evict(next(iter(mine)))
        # ... then the store's: the oldest of whoever holds the most.
        while len(self._done) > 1 and (
            len(self._done) > policy.max_results or self._bytes > policy.max_result_bytes
        ):
            self._evict(self._next_out(trace_id))

    def _next_out(self, newest: str) -> str:
        """The result that goes past the bounds in all: the oldest of the client holding the
        most (bytes past ``max_result_bytes``, else results); never ``newest``, whose client
        then gives way to the oldest whoever's. Oldest first whoever's, a few clients each
        within its share pushed every other client's answers out (eight at the defaults)."""
        clients = self._by_client
        if len(clients) > 1:
            if self._bytes > self.policy.max_result_bytes:
                most = self._heaviest()
            else:
                most = self._counts.first_of_most()
            oldest = next(iter(clients[most]))
            if oldest != newest:
                return oldest
        return next(iter(self._done))

    def _over_share(self, client: str, held: int) -> bool:
        """Whether ``client`` holds more than its share; "-", a request whose client is not known
        (one adopted from another Router with auth off), has no share of its own."""
        policy = self.policy
        return client != "-" and (
            held > policy.max_results_per_client
            or self._client_bytes[client] > policy.max_result_bytes_per_client
        )

    def _evict(self, trace_id: str) -> None:
        self._drop(trace_id)
        self._owners.pop(trace_id, None)
        self.evicted += 1

    def _drop(self, trace_id: str) -> None:
        """Forget a finished result (its owner stays while it may still be pending)."""
        found = self._done.pop(trace_id, None)
        if found is None:
            return
        size = len(found[0][1])
        self._bytes -= size
        client = self._clients.pop(trace_id, "-")
        mine = self._by_client.get(client)
        if mine is not None and trace_id in mine:
            del mine[trace_id]
            left = self._client_bytes.get(client, 0) - size
            if mine:
                self._client_bytes[client] = left
            else:
                del self._by_client[client]
                self._client_bytes.pop(client, None)
            self._held_changed(client, len(mine) + 1)

    def _held_changed(self, client: str, before: int) -> None:
        """``client`` went from ``before`` results to one more or one fewer (its bytes too)."""
        mine = self._by_client.get(client)
        after = 0 if mine is None else len(mine)
        self._counts.moved(client, before, after)
        heavy = self._heavy
        if len(heavy) > 2 * len(self._client_bytes) + 64:  # mostly stale: rebuilt, O(1) a change
            heavy[:] = [(-held, next(self._pushes), who) for who, held in self._client_bytes.items()]
            heapq.heapify(heavy)
        elif after:
            heapq.heappush(heavy, (-self._client_bytes[client], next(self._pushes), client))

    def _heaviest(self) -> str:
        """The client holding the most bytes (of those holding as many, the one that came to it
        first); its heap entry is current, the stale ones above it are dropped."""
        heavy, held = self._heavy, self._client_bytes
        while held.get(heavy[0][2]) != -heavy[0][0]:
            heapq.heappop(heavy)
        return heavy[0][2]

    def is_pending(self, trace_id: str) -> bool:
        return trace_id in self._pending

    def get(self, trace_id: str) -> Reply | None:
        """The finished reply, or None (unknown, pending or expired)."""
        found = self._done.get(trace_id)
        if found is None:
            return None
        reply, expires = found
        if self._clock.monotonic() >= expires:
            self._drop(trace_id)
            self._owners.pop(trace_id, None)
            return None
        return reply
