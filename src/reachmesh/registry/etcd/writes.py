"""Registrations, renewals and deregistrations, each a transaction on the agent's key.

An agent's lease *is* an etcd lease: registration grants it, a renewal (on any Router) keeps it
alive, and when it runs out etcd deletes the key by itself. The id-conflict rule is a comparison
on the key's create (or mod) revision, so two Routers can never both accept one id.
"""

from __future__ import annotations

import logging

import orjson

from reachmesh.exceptions import (
    AgentIdConflict,
    AgentNotFound,
    LeaseNotFound,
    RegistryUnavailable,
)
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.entry import AgentEntry, Claim, RegistryEvent, holds_lease, require_lease
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcd.keys import new_secret_lease
from reachmesh.registry.etcd.stored import GONE, draft, live_record, read_entry, same_record
from reachmesh.registry.etcdclient import (
    EtcdRejected,
    KeyValue,
    compare_create,
    compare_mod,
    put_op,
    range_op,
)

log = logging.getLogger("reachmesh.registry")


class Writer:
    """The write side of the etcd registry; each write lands in the snapshot when it succeeds."""

    def __init__(self, shared: Shared, health: Health) -> None:
        self._shared = shared
        self._health = health

    # -- register ----------------------------------------------------------------------------

    async def register(
        self,
        profile: AgentProfile,
        *,
        lease_id: str | None,
        instance_id: str | None,
        holder: str | None,
        managed: bool,
    ) -> tuple[AgentEntry, bool]:
        shared = self._shared
        key = shared.keys.agent(profile.id)
        deadline = self._health.deadline()
        for _ in range(3):
            kv, current = await self._read(key, deadline)
            claim = shared.snapshot.claim(
                current, profile, lease_id, instance_id, max_agents=shared.policy.max_agents
            )
            replacing = claim is Claim.IN_PLACE
            secret = self._secret(profile.id, current, lease_id, replacing)
            if managed:
                ttl = 0.0
            else:
                ttl = current.ttl_seconds if replacing and current else shared.policy.lease_ttl_seconds
            entry, value = draft(
                profile,
                secret,
                ttl,
                instance_id=instance_id,
                holder=holder,
                managed=managed,
                clock=shared.clock,
                router=shared.router,
            )
            if replacing and current is not None and kv is not None and same_record(kv.value, value):
                # Nothing changed: a new revision would only fill etcd's history (and quota).
                done = await self._unchanged(kv, deadline)
                entry.backend_lease = kv.lease
            elif replacing and current is not None and kv is not None:
                done = await self._replace(key, value, kv, deadline)
                entry.backend_lease = kv.lease
            elif claim is Claim.TAKEOVER and kv is not None:
                done, entry.backend_lease = await self._take_over(key, value, kv, entry, deadline)
            else:
                done, entry.backend_lease = await self._create(key, value, entry, deadline)
            if done is None:
                continue  # someone else wrote the key meanwhile: decide again on what is there now
            self._written(entry, done)
            return self._heard_from(entry), claim is not Claim.IN_PLACE
        raise AgentIdConflict(f"agent id {profile.id!r} is being registered concurrently elsewhere; retry")

    def _secret(
        self, agent_id: str, current: AgentEntry | None, lease_id: str | None, replacing: bool
    ) -> str:
        """The lease id to give the registrant. Replacing with the lease: it stays. The same
        registrant, whose answer was lost: a new lease id on the same etcd lease (the store does
        not know the old one, only its digest), unless this Router granted it."""
        secret = lease_id if replacing and lease_id is not None else None
        if secret is None and replacing and current is not None:
            secret = self._known_lease(agent_id, current)
        return secret or new_secret_lease()

    def _known_lease(self, agent_id: str, current: AgentEntry) -> str | None:
        """The lease itself, when this Router granted ``current``'s (it keeps what it gave out):
        a same-registrant retry through it gets the same lease back. Another Router knows only
        the digest, so it can only issue a new lease id on the same etcd lease."""
        local = self._shared.snapshot.entries.get(agent_id)
        if local is not None and local.lease_id and local.lease_digest == current.lease_digest:
            return local.lease_id
        return None

    def _written(self, entry: AgentEntry, done: int) -> None:
        """Put ``entry``, written at revision ``done``, in the snapshot unless the watch is ahead."""
        shared = self._shared
        entry.revision = done
        local = shared.snapshot.entries.get(entry.id)
        if local is None or local.revision < done:
            shared.snapshot.install(entry, local is not None and local.status is not AgentStatusValue.OFFLINE)
        elif local.revision == done and not local.lease_id:
            # The watch brought this very write in before its answer did: it could not know
            # the lease, only its digest. Keep it, so a retry here gets the same lease back.
            local.lease_id = entry.lease_id
        # shared.revision is left to the watch: it resumes from there after a reconnect, and
        # other Routers' writes below ``done`` may not have arrived yet.

    async def _unchanged(self, kv: KeyValue, deadline: float) -> int | None:
        """A re-registration in place that changes nothing: it renews the etcd lease (as the
        write would have) and writes nothing; None when the lease ran out meanwhile."""
        if kv.lease:
            try:
                ttl = await self._shared.client.keepalive(kv.lease, deadline=deadline)
            except EtcdRejected as exc:
                raise self._health.refused_call(exc, "the renewal") from exc
            if ttl <= 0:
                return None
        return kv.mod_revision

    def _heard_from(self, entry: AgentEntry) -> AgentEntry:
        """The snapshot's entry for ``entry`` when it is the same registration (an unchanged
        re-registration keeps it), with its heartbeat renewed; else ``entry``."""
        snapshot = self._shared.snapshot
        local = snapshot.entries.get(entry.id)
        if local is None or local.revision != entry.revision or local.lease_digest != entry.lease_digest:
            return entry
        if local.status is AgentStatusValue.OFFLINE:
            snapshot.install(entry, False)  # its lease is live in etcd: it is back
            return entry
        if local is not entry:
            local.last_heartbeat = entry.last_heartbeat
            local.last_heartbeat_wall = entry.last_heartbeat_wall
            local.expires_at = entry.expires_at
        return local

    async def _replace(self, key: str, value: bytes, kv: KeyValue, deadline: float) -> int | None:
        try:
            result = await self._shared.client.txn(
                [compare_mod(key, kv.mod_revision)], [put_op(key, value, kv.lease)], deadline=deadline
            )
        except EtcdRejected as exc:
            if exc.not_found:  # its etcd lease ran out between the read and the write
                return None
            raise self._health.refused_call(exc, "the write", write=True) from exc
        return result.revision if result.succeeded else None

    async def _create(
        self, key: str, value: bytes, entry: AgentEntry, deadline: float
    ) -> tuple[int | None, int]:
        client = self._shared.client
        try:
            # A managed entry has no lease: its key stays until it is deregistered.
            lease = 0 if entry.managed else await client.grant(entry.ttl_seconds, deadline=deadline)
            result = await client.txn(
                [compare_create(key, 0)], [put_op(key, value, lease)], [range_op(key)], deadline=deadline
            )
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the write", write=True) from exc
        self._health.serving(wrote=True)
        if result.succeeded:
            return result.revision, lease
        held = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if held is not None and lease and held.lease == lease:
            # Our own write, applied on a member whose answer was lost and then retried.
            return held.mod_revision, lease
        if lease:
            self._shared.background.spawn(self._revoke_quietly(lease), "revoke")
        return None, 0

    async def _take_over(
        self, key: str, value: bytes, kv: KeyValue, entry: AgentEntry, deadline: float
    ) -> tuple[int | None, int]:
        """Write ``entry`` over a dead holder's key on a new etcd lease, unless the key changed
        since it was read; then end the holder's lease (its keys left with it: the record moved)."""
        client = self._shared.client
        try:
            # A managed entry has no lease: its key stays until it is deregistered.
            lease = 0 if entry.managed else await client.grant(entry.ttl_seconds, deadline=deadline)
            result = await client.txn(
                [compare_mod(key, kv.mod_revision)], [put_op(key, value, lease)], deadline=deadline
            )
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the write", write=True) from exc
        self._health.serving(wrote=True)
        if not result.succeeded:
            if lease:
                self._shared.background.spawn(self._revoke_quietly(lease), "revoke")
            return None, 0
        if kv.lease:
            # Before answering: a Router whose watch has not yet seen the move would otherwise
            # keep renewing the old holder's lease, and its answer must already be 403. The write
            # is done whatever happens here: an etcd too slow for it gets the revoke later.
            await self._revoke_now_or_later(kv.lease)
        return result.revision, lease

    async def _revoke_now_or_later(self, lease: int) -> None:
        try:
            await self._shared.client.revoke(lease, deadline=self._health.deadline())
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not revoke a replaced holder's lease yet (%s); retrying", exc)
            self._shared.background.spawn(self._revoke_quietly(lease), "revoke")

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self._shared.client.revoke(lease)
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not revoke an unused lease (%s); it expires by itself", exc)

    # -- reads for a write -------------------------------------------------------------------

    async def _get(self, key: str, deadline: float) -> tuple[int, KeyValue | None]:
        try:
            found = await self._shared.client.get(key, deadline=deadline)
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the read") from exc
        self._health.serving()
        return found

    async def _read(self, key: str, deadline: float) -> tuple[KeyValue | None, AgentEntry | None]:
        """An agent's key, and its live entry as etcd has it now (the snapshot may lag by a
        watch event); None for a key that is absent or says the agent deregistered."""
        _, kv = await self._get(key, deadline)
        record = live_record(kv)
        if kv is None or record is None:
            return kv, None
        return kv, read_entry(record, kv, self._shared.clock)

    async def _authoritative(self, agent_id: str) -> AgentEntry | None:
        return (await self._read(self._shared.keys.agent(agent_id), self._health.deadline()))[1]

    async def _holder_of(self, agent_id: str, lease_id: str) -> AgentEntry:
        """The live entry ``lease_id`` holds: from the snapshot, else from etcd; raises otherwise."""
        entry = self._shared.snapshot.entries.get(agent_id)
        if entry is None or entry.status is AgentStatusValue.OFFLINE or not holds_lease(entry, lease_id):
            # Registered, or re-registered, through another Router a moment ago: ask etcd.
            entry = await self._authoritative(agent_id)
            if entry is None:
                raise LeaseNotFound(f"no live lease for agent {agent_id!r}; register again")
            require_lease(entry, lease_id)
        return entry

    # -- renew and deregister ----------------------------------------------------------------

    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        shared = self._shared
        entry = await self._holder_of(agent_id, lease_id)
        if entry.managed:
            return shared.snapshot.entries.get(agent_id) or entry  # no lease to extend; it never expires
        try:
            ttl = await shared.client.keepalive(entry.backend_lease, deadline=self._health.deadline())
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the renewal") from exc
        if ttl <= 0:
            moved = await self._authoritative(agent_id)
            if moved is not None:
                # Taken over through another Router; this one's watch has not shown it yet.
                require_lease(moved, lease_id)
            raise LeaseNotFound(f"the lease of agent {agent_id!r} has expired; register again")
        local = shared.snapshot.entries.get(agent_id)
        if local is not None and local.backend_lease == entry.backend_lease:
            local.last_heartbeat = shared.clock.monotonic()
            local.last_heartbeat_wall = shared.clock.time()
            local.expires_at = local.last_heartbeat + local.ttl_seconds
            if local.lease_status is AgentStatusValue.OFFLINE:
                # etcd just kept this lease alive, so the key is live whatever this snapshot
                # concluded (a full read that missed it): the entry is listed and routable again.
                local.lease_status = AgentStatusValue.AVAILABLE
                local.offline_since = None
                shared.snapshot.changed(local)
            return local
        return entry

    async def deregister(self, agent_id: str, lease_id: str) -> None:
        shared = self._shared
        try:
            entry = await self._holder_of(agent_id, lease_id)
        except LeaseNotFound as exc:
            self._drop_offline(agent_id, lease_id, exc)
            return
        key = shared.keys.agent(agent_id)
        kv, current = await self._read(key, self._health.deadline())
        if current is not None:
            # Taken over, or re-registered with a new leaseId, through another Router; this
            # one's snapshot has not shown it yet. (The etcd lease alone cannot tell: a managed
            # entry has none, and a same-registrant retry keeps it.)
            require_lease(current, lease_id)
        done = 0
        if kv is not None and (current is not None or kv.lease == entry.backend_lease):
            done = await self._tombstone(key, kv)
        local = shared.snapshot.entries.get(agent_id)
        if local is not None:
            local.revision = max(local.revision, done)
            shared.snapshot.remove(local, RegistryEvent.DEREGISTERED)

    def _drop_offline(self, agent_id: str, lease_id: str, exc: LeaseNotFound) -> None:
        """Deregistering an entry whose lease ran out (etcd has no key): as in memory, its own
        lease removes it from the listing, another is refused; raises when nothing is listed."""
        local = self._shared.snapshot.entries.get(agent_id)
        if local is None or local.status is not AgentStatusValue.OFFLINE:
            raise AgentNotFound(f"no agent {agent_id!r} is registered") from exc
        require_lease(local, lease_id)
        self._shared.snapshot.remove(local, RegistryEvent.DEREGISTERED)

    async def _tombstone(self, key: str, kv: KeyValue) -> int:
        """Say the agent deregistered (so every watcher drops it at once), then end its lease;
        the revision of the tombstone, 0 when the key changed meanwhile."""
        shared, deadline = self._shared, self._health.deadline()
        tombstone = orjson.dumps({"state": GONE, "router": shared.router})
        try:
            result = await shared.client.txn(
                [compare_mod(key, kv.mod_revision)], [put_op(key, tombstone, kv.lease)], deadline=deadline
            )
            if not result.succeeded:
                # The key changed since it was read (a re-registration on the same lease, a
                # takeover): its lease and key now belong to that write, so neither is ended here.
                return 0
            if kv.lease:
                await shared.client.revoke(kv.lease, deadline=deadline)
            else:  # a managed entry's key has no lease to take it away
                await shared.client.delete(key, deadline=deadline)
        except EtcdRejected as exc:
            raise self._health.refused_call(exc, "the write", write=True) from exc
        return result.revision
