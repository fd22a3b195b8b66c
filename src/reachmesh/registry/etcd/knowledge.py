"""What the Routers tell each other through etcd: learned routes and negatives, capability
vectors, and which agents fail. Each Router writes its own; the watch brings everyone else's."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from urllib.parse import quote

import orjson

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.registry.entry import AgentEntry, LearnedRoute, learned_key, normalize_phrase
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcd.stored import decode, read_route, route_value
from reachmesh.registry.etcdclient import EtcdRejected, KeyValue

log = logging.getLogger("reachmesh.registry")


def _gone(key: str, revision: int) -> KeyValue:
    """A deletion of ``key`` at ``revision``, as the watch would bring it."""
    return KeyValue(key, b"", 0, revision, 0)


class SharedKnowledge:
    """Learned routes, negatives, vector blocks and failure reports, kept in step with etcd."""

    def __init__(self, shared: Shared, health: Health) -> None:
        self._shared = shared
        self._health = health
        self._blocks: dict[tuple[str, str], bytes] = {}
        self._reported: dict[tuple[str, int], float] = {}
        # etcd key -> normalized phrase, and the revision applied for it (a watch event of a
        # write this Router made itself is not applied twice).
        self._learned_keys: dict[str, tuple[str, int]] = {}
        self._negative_keys: dict[str, tuple[tuple[str, str, str], int]] = {}
        # etcd key -> the bytes its value takes, for the byte bound and /metrics.
        self._sizes: dict[str, int] = {}
        # etcd key -> the lease a learned negative was written with (each has its own), revoked
        # when the key is deleted or written again: a deleted key's lease lived on in etcd to the
        # end of its TTL, so one caller token's declines grew etcd's leases past every bound.
        self._leases: dict[str, int] = {}

    # -- from etcd ---------------------------------------------------------------------------

    def reset_blocks(self) -> None:
        self._blocks.clear()

    def apply_block(self, kv: KeyValue, *, deleted: bool) -> None:
        model, _, agent_id = kv.key[len(self._shared.keys.vectors) :].partition("/")
        if not agent_id:
            return
        if deleted:
            self._blocks.pop((model, agent_id), None)
        else:
            self._blocks[(model, agent_id)] = kv.value

    def apply_failure(self, kv: KeyValue) -> None:
        agent_id, _, router = kv.key[len(self._shared.keys.health) :].partition("/")
        if router == self._shared.router or agent_id not in self._shared.snapshot.entries:
            return
        record = decode(kv) or {}
        lease = record.get("lease")
        if isinstance(lease, int) and lease != self._shared.snapshot.entries[agent_id].backend_lease:
            # About a holder this id no longer has (taken over since): it says nothing of the new one.
            return
        self._shared.snapshot.emit_failure(agent_id, str(record.get("reason", "failing")), router)

    def apply_learned(self, kv: KeyValue, *, deleted: bool) -> None:
        known = self._learned_keys.get(kv.key)
        if known is not None and known[1] >= kv.mod_revision and not deleted:
            return  # this Router wrote it already
        if deleted:
            self._sizes.pop(kv.key, None)
            if known is not None:
                del self._learned_keys[kv.key]
                self._shared.snapshot.drop_learned(known[0])
            return
        route = read_route(kv, "learned route")
        if route is not None:
            self._learned_keys[kv.key] = (self._shared.snapshot.keep(route), kv.mod_revision)
            self._sizes[kv.key] = len(kv.value)

    def apply_negative(self, kv: KeyValue, *, deleted: bool) -> None:
        known = self._negative_keys.get(kv.key)
        if known is not None and known[1] >= kv.mod_revision and not deleted:
            return  # this Router wrote it already
        if deleted:
            self._sizes.pop(kv.key, None)
            self._leases.pop(kv.key, None)
            if known is not None:
                del self._negative_keys[kv.key]
                self._shared.snapshot.drop_negative(known[0])
            return
        route = read_route(kv, "learned negative")
        if route is not None:
            self._negative_keys[kv.key] = (self._shared.snapshot.keep_negative(route), kv.mod_revision)
            self._sizes[kv.key] = len(kv.value)
            self._leases[kv.key] = kv.lease

    def forget_missing(self, present: set[str], revision: int) -> None:
        """After a full read: drop what was forgotten while this Router was not watching."""
        for key in [k for k in self._learned_keys if k not in present]:
            self.apply_learned(_gone(key, revision), deleted=True)
        for key in [k for k in self._negative_keys if k not in present]:
            self.apply_negative(_gone(key, revision), deleted=True)

    # -- learned routes and negatives --------------------------------------------------------

    async def remember(self, route: LearnedRoute, *, limit: int, quota: int | None = None) -> LearnedRoute:
        snapshot = self._shared.snapshot
        key = route.key
        # The bound holds across Routers: whoever writes past it removes the oldest.
        room = limit if key in snapshot.learned else limit - 1
        known = snapshot.learned.get(key)
        own = quota if quota is None or (known is not None and known.by == route.by) else quota - 1
        victims = [old for old in snapshot.excess(room, route.by, own) if old != key]
        going = [self._shared.keys.learned_route(old) for old in victims]
        where = self._shared.keys.learned_route(key)
        order = [self._shared.keys.learned_route(old) for old in snapshot.learned]
        going += self._over_bytes(order, where, route, going)
        return await self._learn(route, where, going, self.apply_learned)

    async def remember_negative(
        self, route: LearnedRoute, *, limit: int, quota: int | None = None
    ) -> LearnedRoute:
        snapshot = self._shared.snapshot
        key = route.negative_key
        room = limit if key in snapshot.negatives else limit - 1
        known = snapshot.negatives.get(key)
        own = quota if quota is None or (known is not None and known.by == route.by) else quota - 1
        victims = [old for old in snapshot.excess_negatives(room, route.by, own) if old != key]
        going = [self._shared.keys.negative(*old) for old in victims]
        where = self._shared.keys.negative(*key)
        order = [self._shared.keys.negative(*old) for old in snapshot.negatives]
        going += self._over_bytes(order, where, route, going)
        return await self._learn(route, where, going, self.apply_negative)

    def _over_bytes(
        self, oldest_first: list[str], key: str, route: LearnedRoute, going: list[str]
    ) -> list[str]:
        """The further keys (oldest first) to delete so that, with ``route`` written under
        ``key``, these keys hold at most ``registry.etcd.max_learned_bytes``."""
        budget = self._shared.policy.etcd.max_learned_bytes
        total = len(route_value(route, self._shared.router))
        total += sum(self._sizes.get(k, 0) for k in oldest_first if k != key and k not in going)
        more: list[str] = []
        for old in oldest_first:
            if total <= budget:
                break
            if old != key and old not in going:
                more.append(old)
                total -= self._sizes.get(old, 0)
        return more

    def held(self) -> tuple[int, int, int, int]:
        """Learned routes and their bytes, learned negatives and theirs, as this Router sees etcd."""
        learned = sum(self._sizes.get(k, 0) for k in self._learned_keys)
        negatives = sum(self._sizes.get(k, 0) for k in self._negative_keys)
        return len(self._learned_keys), learned, len(self._negative_keys), negatives

    async def _learn(
        self, route: LearnedRoute, key: str, victims: list[str], apply: Callable[..., None]
    ) -> LearnedRoute:
        """Write ``route`` under ``key`` and delete the ``victims`` past the bound, then apply both."""
        client, deadline = self._shared.client, self._health.deadline()
        value = route_value(route, self._shared.router)
        # The leases of what this write replaces or deletes, taken before applying it drops them.
        stale = [self._leases.get(k, 0) for k in (key, *victims)]
        try:
            lease = 0
            if route.expires is not None:
                # Its own lease: etcd removes it at the end of its TTL, whichever Routers are up.
                ttl = max(1, math.ceil(route.expires - self._shared.clock.time()))
                lease = await client.grant(ttl, deadline=deadline)
            revision = await client.put(key, value, lease=lease, deadline=deadline)
            for old in victims:
                await client.delete(old, deadline=deadline)
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the write", write=True) from exc
        apply(KeyValue(key, value, 0, revision, lease), deleted=False)
        for old in victims:
            apply(_gone(old, revision), deleted=True)
        await self._revoke(stale, keep=lease)
        return route

    async def _revoke(self, leases: list[int], *, keep: int = 0) -> None:
        """Revoke the leases of keys written again or deleted (their keys are gone or on a new
        lease, so revoking removes nothing that lives). After the write is applied, and best
        effort: a lease left behind ends with its TTL, and the write did happen."""
        for lease in dict.fromkeys(leases):
            if lease and lease != keep:
                try:
                    await self._shared.client.revoke(lease, deadline=self._health.deadline())
                except (EtcdRejected, RegistryUnavailable) as exc:
                    log.warning("a learned negative's lease was not revoked (its TTL ends it): %s", exc)
                    return

    async def forget(self, phrase: str, owner: str | None = None) -> bool:
        key = self._shared.keys.learned_route(learned_key(phrase, owner))
        return await self._delete(key, self._learned_keys, self.apply_learned)

    async def forget_negative(self, phrase: str, task: str, agent: str | None = None) -> bool:
        phrase_key = normalize_phrase(phrase)
        agents = [
            k[2]
            for k in self._shared.snapshot.negatives
            if k[:2] == (phrase_key, task) and agent in (None, k[2])
        ]
        if agent is not None and agent not in agents:
            agents.append(agent)  # perhaps in etcd and not yet here: the delete says
        found = False
        for one in agents:
            key = self._shared.keys.negative(phrase_key, task, one)
            found = await self._delete(key, self._negative_keys, self.apply_negative) or found
        return found

    async def _delete(self, key: str, known_keys: Mapping[str, object], apply: Callable[..., None]) -> bool:
        """Delete ``key`` and apply that; whether it was there (in etcd, or known here)."""
        lease = self._leases.get(key, 0)  # before the delete: its watch event drops it
        try:
            deleted = await self._shared.client.delete(key, deadline=self._health.deadline())
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the write", write=True) from exc
        known = key in known_keys
        apply(_gone(key, self._shared.revision), deleted=True)
        await self._revoke([lease])
        return bool(deleted) or known

    # -- failure reports ---------------------------------------------------------------------

    def report_failure(self, agent_id: str, reason: str) -> None:
        shared = self._shared
        entry = shared.snapshot.entries.get(agent_id)
        if entry is None:
            return
        now = shared.clock.monotonic()
        ttl = shared.policy.etcd.failure_ttl_seconds
        # Per holder: a new holder of the id that fails is news even while the old report lives.
        reported = (agent_id, entry.backend_lease)
        if now - self._reported.get(reported, -1e9) < ttl / 2:
            return  # the others already know; the key is still alive
        self._reported[reported] = now
        if len(self._reported) > 4 * shared.policy.max_agents:
            self._reported.clear()  # bounded: forgetting only means one more report
        shared.background.spawn(self._publish_failure(agent_id, entry.backend_lease, reason, ttl), "report")

    async def _publish_failure(self, agent_id: str, holder: int, reason: str, ttl: int) -> None:
        shared = self._shared
        value = orjson.dumps(
            {"router": shared.router, "reason": reason, "at": shared.clock.time(), "lease": holder}
        )
        deadline = shared.policy.etcd.attempt_timeout_seconds
        try:
            own = await shared.client.grant(ttl, deadline=deadline)
            await shared.client.put(
                shared.keys.failure(agent_id, shared.router), value, lease=own, deadline=deadline
            )
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not share that %s fails: %s", agent_id, exc)

    # -- capability vectors ------------------------------------------------------------------

    def vectors_for(self, model: str, agent_id: str) -> bytes | None:
        if not self._shared.policy.etcd.share_vectors:
            return None
        return self._blocks.get((quote(model, safe=""), agent_id))

    def publish_vectors(self, model: str, agent_id: str, block: bytes) -> None:
        entry = self._shared.snapshot.entries.get(agent_id)
        if not self._shared.policy.etcd.share_vectors or entry is None or not entry.backend_lease:
            return
        self._blocks[(quote(model, safe=""), agent_id)] = block
        self._shared.background.spawn(self._put_block(model, entry, block), "vectors")

    async def _put_block(self, model: str, entry: AgentEntry, block: bytes) -> None:
        try:
            # On the agent's lease: the vectors leave etcd when the agent does.
            await self._shared.client.put(
                self._shared.keys.vector_block(model, entry.id), block, lease=entry.backend_lease
            )
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not share the vectors of %s: %s", entry.id, exc)
