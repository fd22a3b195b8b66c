"""The etcd registry: several Routers share one registry that outlives each of them.

Keys, under ``registry.etcd.prefix`` (``/agent-reach/v1`` by default)::

    {prefix}/agents/{agent_id}             the profile and its lease (JSON), on the agent's etcd lease
    {prefix}/health/{agent_id}/{router}    a Router's report that the agent fails (short lease)
    {prefix}/vectors/{model}/{agent_id}    capability vectors embedded by one Router, for the others
    {prefix}/learned/{sha256(phrase)}      a learned route (JSON: phrase, task, source, at), no lease
    {prefix}/negative/{sha256(phrase\0task)} a learned negative: that task declined that phrase

- An agent's lease *is* an etcd lease: registration grants it, a renewal (on any Router) keeps
  it alive, and when it runs out etcd deletes the key by itself. The lease id given to the agent
  is a random secret; the store keeps only its SHA-256, so reading etcd does not let anyone renew
  or drop someone else's lease through a Router.
- The id-conflict rule is a transaction on the key's create (or mod) revision, so two Routers can
  never both accept one id.
- Every Router keeps a snapshot (the in-memory registry it extends), fed by one prefix watch
  that resumes from its last revision after a disconnect and reads everything again when that
  revision was compacted. Routing reads only the snapshot: no etcd round trip per request.
- When etcd does not answer, the Router is *degraded*: it routes from the snapshot, and writes
  fail fast with 503 ``REGISTRY_UNAVAILABLE``. When etcd is back, it resumes the watch.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import secrets
import socket
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import orjson
from pydantic import ValidationError

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import (
    AgentIdConflict,
    AgentNotFound,
    ConfigError,
    LeaseMismatch,
    LeaseNotFound,
    RegistryUnavailable,
)
from reachmesh.ports import is_loopback
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.base import (
    AgentEntry,
    Claim,
    LearnedRoute,
    RegistryEvent,
    compile_capabilities,
    holds_lease,
    normalize_phrase,
)
from reachmesh.registry.etcdclient import (
    Compacted,
    EtcdClient,
    EtcdRejected,
    Event,
    KeyValue,
    compare_create,
    compare_mod,
    compare_never,
    put_op,
    range_op,
)
from reachmesh.registry.memory import MemoryRegistry

log = logging.getLogger("reachmesh.registry")

_LIVE = "live"
_GONE = "deregistered"  # a deregistration's last word before its lease is revoked


def new_secret_lease() -> str:
    """A lease id for an agent: 128 random bits (the store keeps only their digest)."""
    return "0x" + secrets.token_hex(16)


def router_name() -> str:
    """This Router's name in failure reports: host, process and a random tag (unique per start)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Keys:
    """The key layout under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.root = prefix + "/"
        self.agents = prefix + "/agents/"
        self.health = prefix + "/health/"
        self.vectors = prefix + "/vectors/"
        self.learned = prefix + "/learned/"
        self.negatives = prefix + "/negative/"
        # Never written: a read of it, and a write to it that is checked but never done, tell
        # whether etcd lets this Router read and write the prefix.
        self.access_check = prefix + "/access-check"

    def agent(self, agent_id: str) -> str:
        return self.agents + agent_id

    def failure(self, agent_id: str, router: str) -> str:
        return f"{self.health}{agent_id}/{router}"

    def vector_block(self, model: str, agent_id: str) -> str:
        return f"{self.vectors}{quote(model, safe='')}/{agent_id}"

    def negative(self, phrase_key: str, task: str) -> str:
        return self.negatives + hashlib.sha256(f"{phrase_key}\0{task}".encode()).hexdigest()

    def learned_route(self, phrase_key: str) -> str:
        # A digest, not the phrase: caller text never becomes part of a key.
        return self.learned + hashlib.sha256(phrase_key.encode()).hexdigest()


class EtcdRegistry(MemoryRegistry):
    """The registry contract over etcd, read from a watched local snapshot."""

    def __init__(
        self,
        policy: RegistryPolicy | None = None,
        *,
        endpoints: Sequence[str],
        clock: Clock = SYSTEM_CLOCK,
        router: str | None = None,
        tls: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(policy, clock=clock)
        etcd = self.policy.etcd
        self.keys = Keys(etcd.prefix)
        self.client = EtcdClient(
            endpoints,
            attempt_timeout=etcd.attempt_timeout_seconds,
            deadline=etcd.request_timeout_seconds,
            tls=tls,
            credentials=credentials,
        )
        self._user = credentials[0] if credentials else None
        # Why etcd refuses this Router now (its login or permission), while it does: the snapshot
        # no longer follows etcd, so the Router says it is degraded until etcd serves it again.
        self._refused: str | None = None
        # The refusal was of a write: only a write that etcd allows clears it (a read-only role
        # still reads, and must not look ready).
        self._refused_write = False
        self._pings = 0
        self.router = router or router_name()
        self.revision = 0  # the last revision applied to the snapshot
        self.loaded = False  # a first full read has been applied
        self._degraded: str | None = None
        self._misses = 0  # ping rounds in a row that no member answered
        self._last_error = "not connected yet"
        self._watching: str | None = None
        self._restart = asyncio.Event()
        self._blocks: dict[tuple[str, str], bytes] = {}
        self._reported: dict[str, float] = {}
        # etcd key -> normalized phrase, and the revision applied for it (a watch event of a
        # write this Router made itself is not applied twice).
        self._learned_keys: dict[str, tuple[str, int]] = {}
        self._negative_keys: dict[str, tuple[tuple[str, str], int]] = {}
        self.resyncs = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._warn_plain_login()
        await self.client.open()
        try:
            await self._resync()
            await self._may_write()
        except EtcdRejected as exc:
            # etcd answered, and said no (a wrong password, a role without the prefix): nothing
            # would work, so the Router stops with a line saying what to change.
            await self.client.close()
            raise ConfigError(self._refusal_hint(exc)) from exc
        except RegistryUnavailable as exc:
            # Serve anyway: /readyz says why not ready, and the watch loop keeps trying.
            self._last_error = exc.message
            log.warning("[registry] etcd at %s: %s; retrying", ", ".join(self.client.endpoints), exc.message)
        if self.client.auth_off:
            log.warning(
                "[registry] registry.etcd.username is set but etcd has authentication off: "
                "whoever reaches etcd can change the registry"
            )
        await super().start()
        etcd = self.policy.etcd
        self._background.spawn(self._watch_loop(), "watch")
        self._background.every(lambda: etcd.ping_interval_seconds, self._ping, "ping")

    def _warn_plain_login(self) -> None:
        if self._user is None:
            return
        exposed = [
            e
            for e in self.client.endpoints
            if e.startswith("http://") and not is_loopback(urlsplit(e).hostname or "")
        ]
        if exposed:
            log.warning(
                "[registry] the etcd password for %r goes unencrypted to %s: use https:// endpoints",
                self._user,
                ", ".join(exposed),
            )

    def _refusal_hint(self, exc: EtcdRejected) -> str:
        """etcd's refusal, and the setting that fixes it."""
        where = ", ".join(self.client.endpoints)
        prefix = self.keys.root.rstrip("/")
        if exc.token_refused and self._user is None:
            hint = (
                "etcd has authentication on: name a user in registry.etcd.username "
                f"(or REACH_ETCD_USERNAME) and its password in {self.policy.etcd.password_env}"
            )
        elif "authentication failed" in exc.message:
            hint = (
                f"check registry.etcd.username (or REACH_ETCD_USERNAME) and the password in "
                f"{self.policy.etcd.password_env}"
            )
        elif exc.code == 7 or "permission denied" in exc.message:
            hint = (
                f"the etcd user {self._user or '(none)'} needs read and write on the prefix {prefix}/, e.g. "
                f"etcdctl role grant-permission ROLE --prefix=true readwrite {prefix}/"
            )
        else:
            hint = "see etcd's log"
        return f"etcd at {where} refused the Router: {exc.message}; {hint}"

    def apply(self, policy: RegistryPolicy) -> None:
        # The endpoints and prefix are read at start: a shared store is not switched under load.
        self.policy = policy.model_copy(update={"etcd": self.policy.etcd})

    async def close(self) -> None:
        await super().close()
        await self.client.close()

    def ready(self) -> str | None:
        if not self.loaded:
            return f"the registry is not loaded from etcd yet ({self._last_error})"
        return None

    def degraded(self) -> str | None:
        return self._degraded or self._refused

    def _deadline(self) -> float:
        # Degraded: one member's timeout, not the whole deadline: the caller learns at once.
        etcd = self.policy.etcd
        return etcd.attempt_timeout_seconds if self._degraded else etcd.request_timeout_seconds

    # -- the snapshot ------------------------------------------------------------------------

    def sweep(self) -> None:
        """Drop offline entries after their grace period; etcd itself expires the leases."""
        now = self._clock.monotonic()
        for entry in list(self.snapshot.entries.values()):
            if entry.status is AgentStatusValue.OFFLINE:
                self.snapshot.drop_if_gone(entry, now, self.policy.offline_grace_seconds)

    async def _resync(self) -> None:
        """Read every key under the prefix and bring the snapshot to that revision."""
        revision, kvs = await self.client.get_prefix(self.keys.root)
        self._blocks.clear()
        # Vector blocks first: installing an agent schedules its vectors, which looks for a block.
        # Keys come sorted otherwise, so agents/ is applied before the health/ reports naming them.
        first = [kv for kv in kvs if kv.key.startswith(self.keys.vectors)]
        rest = [kv for kv in kvs if not kv.key.startswith(self.keys.vectors)]
        self.replaying = not self.loaded
        try:
            self._apply([Event(kv, deleted=False) for kv in first + rest])
        finally:
            self.replaying = False
        present = {kv.key[len(self.keys.agents) :] for kv in kvs if kv.key.startswith(self.keys.agents)}
        learned = {kv.key for kv in kvs if kv.key.startswith(self.keys.learned)}
        for key in [k for k in self._learned_keys if k not in learned]:
            self._apply_learned(KeyValue(key, b"", 0, revision, 0), deleted=True)  # forgotten meanwhile
        negatives = {kv.key for kv in kvs if kv.key.startswith(self.keys.negatives)}
        for key in [k for k in self._negative_keys if k not in negatives]:
            self._apply_negative(KeyValue(key, b"", 0, revision, 0), deleted=True)
        for entry in list(self.snapshot.entries.values()):
            # Gone from etcd while this Router was not watching: its lease ran out meanwhile.
            if entry.id not in present and entry.status is not AgentStatusValue.OFFLINE:
                self.snapshot.go_offline(entry, self._clock.monotonic())
        self.revision = revision
        if self.loaded:
            log.info("[registry] resynced from etcd: %d agents at revision %d", len(present), revision)
        else:
            log.info("[registry] read back from etcd: %d agents at revision %d", len(present), revision)
        self.loaded = True
        self._serving()
        self.resyncs += 1

    def _apply(self, events: list[Event]) -> None:
        for event in events:
            kv = event.kv
            if kv.key.startswith(self.keys.agents):
                self._apply_agent(kv.key[len(self.keys.agents) :], kv, deleted=event.deleted)
            elif kv.key.startswith(self.keys.vectors):
                block = self._block_key(kv.key)
                if block is not None:
                    if event.deleted:
                        self._blocks.pop(block, None)
                    else:
                        self._blocks[block] = kv.value
            elif kv.key.startswith(self.keys.health) and not event.deleted:
                self._apply_failure(kv)
            elif kv.key.startswith(self.keys.learned):
                self._apply_learned(kv, deleted=event.deleted)
            elif kv.key.startswith(self.keys.negatives):
                self._apply_negative(kv, deleted=event.deleted)
            self.revision = max(self.revision, kv.mod_revision)

    def _apply_agent(self, agent_id: str, kv: KeyValue, *, deleted: bool) -> bool:
        """Bring one agent's snapshot entry to ``kv``; True when the agent is live there."""
        current = self.snapshot.entries.get(agent_id)
        if current is not None and current.revision >= kv.mod_revision:
            return current.status is not AgentStatusValue.OFFLINE  # this Router wrote it already
        if deleted:
            if current is not None and current.status is not AgentStatusValue.OFFLINE:
                current.revision = kv.mod_revision
                # The lease ran out (a deregistration says so first).
                self.snapshot.go_offline(current, self._clock.monotonic())
            return False
        record = self._decode(kv)
        if record is None:
            return False
        if record.get("state") == _GONE:
            if current is not None:
                self.snapshot.remove(current, RegistryEvent.DEREGISTERED)
            return False
        entry = self._entry(record, kv, expect_id=agent_id)
        if entry is None:
            return False
        self.snapshot.install(entry, current is not None and current.status is not AgentStatusValue.OFFLINE)
        return True

    def _decode(self, kv: KeyValue) -> dict[str, Any] | None:
        try:
            record = orjson.loads(kv.value)
        except orjson.JSONDecodeError:
            log.warning("[registry] skipping %s: not JSON (written by something else?)", kv.key)
            return None
        if not isinstance(record, dict):
            log.warning("[registry] skipping %s: not a JSON object (written by something else?)", kv.key)
            return None
        return record

    def _entry(
        self, record: dict[str, Any], kv: KeyValue, lease_id: str = "", expect_id: str | None = None
    ) -> AgentEntry | None:
        try:
            profile = AgentProfile.model_validate(record["profile"])
            ttl = float(record["ttl"])
            lease_digest = str(record["leaseDigest"])
            if not (ttl == 0 or 0 < ttl < 1e9):  # NaN, infinities and negatives fail both
                raise ValueError("ttl")
            if expect_id is not None and profile.id != expect_id:
                # A record under another id's key would route that id to its endpoint while
                # etcd holds the real one, and never leave the snapshot.
                raise ValueError(f"the key holds the profile of {profile.id!r}")
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            why = type(exc).__name__ if isinstance(exc, ValidationError) else str(exc) or type(exc).__name__
            log.warning("[registry] skipping %s: not an agent record (%s)", kv.key, why)
            return None
        caps, validators = compile_capabilities(profile)
        now = self._clock.monotonic()
        managed = bool(record.get("managed", False))
        return AgentEntry(
            profile=profile,
            lease_id=lease_id,
            ttl_seconds=ttl,
            last_heartbeat=now,
            last_heartbeat_wall=float(record.get("at") or self._clock.time()),
            expires_at=math.inf if managed else now + ttl,
            capabilities=caps,
            validators=validators,
            holder=record.get("holder"),
            lease_digest=lease_digest,
            instance_digest=record.get("instanceDigest"),
            lease_tag=str(record.get("leaseTag") or "-"),
            revision=kv.mod_revision,
            backend_lease=kv.lease,
            managed=managed,
        )

    # -- the watch ---------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        delay = 0.1
        while True:
            try:
                if not self.loaded:
                    await self._resync()
                    await self._check_write()  # etcd was out of reach at start: check it now
                await self._watch_once()
                delay = 0.1
            except Compacted as exc:
                log.warning(
                    "[registry] etcd compacted revision %d away (at %d); reading everything again",
                    self.revision + 1,
                    exc.compact_revision,
                )
                self.loaded = False
                continue
            except RegistryUnavailable as exc:
                self._last_error = exc.message
                log.debug("[registry] watch: %s", exc.message)
                self.client.rotate()
            except EtcdRejected as exc:
                # Keep trying: an operator may grant the permission back.
                self._note_refusal(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _watch_once(self) -> None:
        """Follow one member's watch stream until it ends, breaks, or the ping asks to restart."""
        endpoint = self.client.current
        self._restart.clear()
        self._watching = endpoint
        stream = asyncio.ensure_future(self._consume(endpoint))
        restart = asyncio.ensure_future(self._restart.wait())
        try:
            await asyncio.wait({stream, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._watching = None
            for task in (stream, restart):
                task.cancel()
            await asyncio.gather(restart, return_exceptions=True)
        if stream.done() and not stream.cancelled():
            stream.result()  # raises what broke the stream
        else:
            await asyncio.gather(stream, return_exceptions=True)

    async def _consume(self, endpoint: str) -> None:
        # A watch that etcd creates has passed its login and permission check: etcd serves again.
        async for events in self.client.watch(
            endpoint, self.keys.root, self.revision + 1, on_created=self._serving
        ):
            self._apply(events)

    def _serving(self, *, wrote: bool = False) -> None:
        """etcd served this Router (a read or a watch went through; ``wrote``: a write did)."""
        if self._refused is not None and (wrote or not self._refused_write):
            log.warning("[registry] etcd accepts the Router again")
            self._refused = None
            self._refused_write = False

    async def _may_write(self) -> None:
        """Raise EtcdRejected unless etcd lets this Router write the prefix (a read-only role
        would otherwise pass the start and fail each registration)."""
        key = self.keys.access_check
        await self.client.txn([compare_never(key)], [put_op(key, b"")], deadline=self._deadline())

    async def _check_write(self) -> None:
        """:meth:`_may_write`, noting a refusal instead of raising it."""
        try:
            await self._may_write()
        except EtcdRejected as exc:
            self._refused_call(exc, "the write", write=True)
        else:
            self._serving(wrote=True)

    async def _check_access(self) -> None:
        """A logged-in read: etcd's status answers anyone, so only this notices that etcd stopped
        accepting the Router (a changed password, a revoked role, authentication turned on).

        While refused, it checks every fifth ping only (a failed etcd login costs etcd a password
        hash), and with a write when a write was refused: that checked-but-never-run write is a
        raft entry, so it is not sent while all is well."""
        self._pings += 1
        if self._refused is not None and self._pings % 5:
            return
        if self._refused is not None and self._refused_write:
            await self._check_write()
            return
        try:
            # Serializable: the member checks the login and permission itself, no leader round trip.
            await self.client.get(
                self.keys.access_check, deadline=self.policy.etcd.attempt_timeout_seconds, serializable=True
            )
        except EtcdRejected as exc:
            self._refused_call(exc, "the read")
        except RegistryUnavailable:
            pass  # reachability is the status check's to judge
        else:
            self._serving()

    async def _ping(self) -> None:
        """Is etcd there? Degraded when no member answers twice running; a silent watch member
        is left for one that answers."""
        timeout = self.policy.etcd.attempt_timeout_seconds
        watching = self._watching
        if watching is not None and await self.client.status(watching, timeout):
            self._answered()
            await self._check_access()
            return
        for endpoint in self.client.endpoints:
            if endpoint != watching and await self.client.status(endpoint, timeout):
                self.client.prefer(endpoint)
                self._restart.set()  # the stream's member is silent (frozen?): follow another
                self._answered()
                await self._check_access()
                return
        # One slow answer on a loaded machine is not an outage: two misses in a row are.
        self._misses += 1
        if self._misses >= 2:
            self._set_degraded(f"etcd unreachable at {', '.join(self.client.endpoints)}")

    def _answered(self) -> None:
        self._misses = 0
        self._set_degraded(None)

    def _set_degraded(self, reason: str | None) -> None:
        if reason is not None and self._degraded is None:
            log.warning(
                "[registry] %s: routing from the snapshot (%d agent%s, revision %d); "
                "registrations and renewals fail until it is back",
                reason,
                len(self.snapshot.entries),
                "" if len(self.snapshot.entries) == 1 else "s",
                self.revision,
            )
        elif reason is None and self._degraded is not None:
            log.info("[registry] etcd answers again; resuming the watch from revision %d", self.revision)
            self._restart.set()
        self._degraded = reason

    # -- writes ------------------------------------------------------------------------------

    async def register(
        self,
        profile: AgentProfile,
        *,
        lease_id: str | None = None,
        instance_id: str | None = None,
        holder: str | None = None,
        managed: bool = False,
    ) -> tuple[AgentEntry, bool]:
        key = self.keys.agent(profile.id)
        deadline = self._deadline()
        for _ in range(3):
            _, kv = await self._get(key, deadline)
            record = self._decode(kv) if kv is not None else None
            current = None
            if kv is not None and record is not None and record.get("state") != _GONE:
                current = self._entry(record, kv)
            claim = self.check_replace(current, profile, lease_id, instance_id)
            replacing = claim is Claim.IN_PLACE
            # Replacing with the lease: it stays. The same registrant, whose answer was lost: a new
            # lease id on the same etcd lease (the store does not know the old one, only its digest).
            secret = lease_id if replacing and lease_id is not None else None
            if secret is None and replacing and current is not None:
                secret = self._known_lease(profile.id, current)
            secret = secret or new_secret_lease()
            if managed:
                ttl = 0.0
            else:
                ttl = current.ttl_seconds if replacing and current else self.policy.lease_ttl_seconds
            entry, value = self._draft(profile, secret, ttl, instance_id, holder, managed)
            if replacing and current is not None and kv is not None:
                done = await self._replace(key, value, kv, deadline)
                entry.backend_lease = kv.lease
            elif claim is Claim.TAKEOVER and kv is not None:
                done, entry.backend_lease = await self._take_over(key, value, kv, entry, deadline)
            else:
                done, entry.backend_lease = await self._create(key, value, entry, deadline)
            if done is None:
                continue  # someone else wrote the key meanwhile: decide again on what is there now
            entry.revision = done
            current_local = self.snapshot.entries.get(profile.id)
            if current_local is None or current_local.revision < done:
                self.snapshot.install(
                    entry, current_local is not None and current_local.status is not AgentStatusValue.OFFLINE
                )
            elif current_local.revision == done and not current_local.lease_id:
                # The watch brought this very write in before its answer did: it could not know
                # the lease, only its digest. Keep it, so a retry here gets the same lease back.
                current_local.lease_id = entry.lease_id
            self.revision = max(self.revision, done)
            return entry, claim is not Claim.IN_PLACE
        raise AgentIdConflict(f"agent id {profile.id!r} is being registered concurrently elsewhere; retry")

    def _known_lease(self, agent_id: str, current: AgentEntry) -> str | None:
        """The lease itself, when this Router granted ``current``'s (it keeps what it gave out):
        a same-registrant retry through it gets the same lease back. Another Router knows only
        the digest, so it can only issue a new lease id on the same etcd lease."""
        local = self.snapshot.entries.get(agent_id)
        if local is not None and local.lease_id and local.lease_digest == current.lease_digest:
            return local.lease_id
        return None

    def _draft(
        self,
        profile: AgentProfile,
        secret: str,
        ttl: float,
        instance_id: str | None,
        holder: str | None,
        managed: bool,
    ) -> tuple[AgentEntry, bytes]:
        """The entry this Router will hold, and the record etcd will (digests, never secrets)."""
        now = self._clock.monotonic()
        entry = AgentEntry(
            profile=profile,
            lease_id=secret,
            ttl_seconds=ttl,
            last_heartbeat=now,
            last_heartbeat_wall=self._clock.time(),
            expires_at=math.inf if managed else now + ttl,
            instance_id=instance_id,
            holder=holder,
            managed=managed,
        )
        entry.capabilities, entry.validators = compile_capabilities(profile)
        record = {
            "state": _LIVE,
            "profile": profile.model_dump(mode="json", by_alias=True, exclude_none=True),
            "ttl": ttl,
            "managed": managed,
            "leaseDigest": entry.lease_digest,
            "leaseTag": entry.lease_tag,
            "instanceDigest": entry.instance_digest,
            "holder": holder,
            "at": entry.last_heartbeat_wall,
            "router": self.router,
        }
        return entry, orjson.dumps(record)

    async def _replace(self, key: str, value: bytes, kv: KeyValue, deadline: float) -> int | None:
        try:
            result = await self.client.txn(
                [compare_mod(key, kv.mod_revision)], [put_op(key, value, kv.lease)], deadline=deadline
            )
        except EtcdRejected as exc:
            if exc.not_found:  # its etcd lease ran out between the read and the write
                return None
            raise self._refused_call(exc, "the write", write=True) from exc
        return result.revision if result.succeeded else None

    async def _create(
        self, key: str, value: bytes, entry: AgentEntry, deadline: float
    ) -> tuple[int | None, int]:
        try:
            # A managed entry has no lease: its key stays until it is deregistered.
            lease = 0 if entry.managed else await self.client.grant(entry.ttl_seconds, deadline=deadline)
            result = await self.client.txn(
                [compare_create(key, 0)], [put_op(key, value, lease)], [range_op(key)], deadline=deadline
            )
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        self._serving(wrote=True)
        if result.succeeded:
            return result.revision, lease
        held = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if held is not None and lease and held.lease == lease:
            # Our own write, applied on a member whose answer was lost and then retried.
            return held.mod_revision, lease
        if lease:
            self._background.spawn(self._revoke_quietly(lease), "revoke")
        return None, 0

    async def _take_over(
        self, key: str, value: bytes, kv: KeyValue, entry: AgentEntry, deadline: float
    ) -> tuple[int | None, int]:
        """Write ``entry`` over a dead holder's key on a new etcd lease, unless the key changed
        since it was read; then end the holder's lease (its keys left with it: the record moved)."""
        try:
            lease = await self.client.grant(entry.ttl_seconds, deadline=deadline)
            result = await self.client.txn(
                [compare_mod(key, kv.mod_revision)], [put_op(key, value, lease)], deadline=deadline
            )
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        self._serving(wrote=True)
        if not result.succeeded:
            self._background.spawn(self._revoke_quietly(lease), "revoke")
            return None, 0
        if kv.lease:
            self._background.spawn(self._revoke_quietly(kv.lease), "revoke")
        return result.revision, lease

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self.client.revoke(lease)
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not revoke an unused lease (%s); it expires by itself", exc)

    async def _get(self, key: str, deadline: float) -> tuple[int, KeyValue | None]:
        try:
            found = await self.client.get(key, deadline=deadline)
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the read") from exc
        self._serving()
        return found

    def _refused_call(self, exc: EtcdRejected, what: str, *, write: bool = False) -> RegistryUnavailable:
        """A call etcd refused, as the 503 its caller gets; a refused login or permission also
        makes the Router degraded until etcd serves it again."""
        if exc.token_refused or exc.code == 7 or "authentication failed" in exc.message:
            self._note_refusal(exc, write=write)
            return RegistryUnavailable(self._refusal_hint(exc))
        return RegistryUnavailable(f"etcd refused {what}: {exc.message}")

    def _note_refusal(self, exc: EtcdRejected, *, write: bool = False) -> None:
        self._refused_write = write
        message = self._refusal_hint(exc)
        self._last_error = message
        if message != self._refused:
            # Once per refusal: an operator changed users or roles under a running Router.
            log.warning("[registry] %s; routing from the snapshot until it is fixed", message)
            self._refused = message

    async def _authoritative(self, agent_id: str) -> AgentEntry | None:
        """The entry as etcd has it now (the snapshot may lag by a watch event)."""
        _, kv = await self._get(self.keys.agent(agent_id), self._deadline())
        record = self._decode(kv) if kv is not None else None
        if kv is None or record is None or record.get("state") == _GONE:
            return None
        return self._entry(record, kv)

    async def _holder_of(self, agent_id: str, lease_id: str) -> AgentEntry:
        """The live entry ``lease_id`` holds: from the snapshot, else from etcd; raises otherwise."""
        entry = self.snapshot.entries.get(agent_id)
        if entry is None or entry.status is AgentStatusValue.OFFLINE or not holds_lease(entry, lease_id):
            # Registered, or re-registered, through another Router a moment ago: ask etcd.
            entry = await self._authoritative(agent_id)
            if entry is None:
                raise LeaseNotFound(f"no live lease for agent {agent_id!r}; register again")
            if not holds_lease(entry, lease_id):
                raise LeaseMismatch(f"leaseId does not match the lease agent {agent_id!r} holds")
        return entry

    async def renew(self, agent_id: str, lease_id: str) -> AgentEntry:
        entry = await self._holder_of(agent_id, lease_id)
        if entry.managed:
            return self.snapshot.entries.get(agent_id) or entry  # no lease to extend; it never expires
        try:
            ttl = await self.client.keepalive(entry.backend_lease, deadline=self._deadline())
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the renewal") from exc
        if ttl <= 0:
            raise LeaseNotFound(f"the lease of agent {agent_id!r} has expired; register again")
        local = self.snapshot.entries.get(agent_id)
        if local is not None and local.backend_lease == entry.backend_lease:
            local.last_heartbeat = self._clock.monotonic()
            local.last_heartbeat_wall = self._clock.time()
            local.expires_at = local.last_heartbeat + local.ttl_seconds
            return local
        return entry

    async def deregister(self, agent_id: str, lease_id: str) -> None:
        try:
            entry = await self._holder_of(agent_id, lease_id)
        except LeaseNotFound as exc:
            raise AgentNotFound(f"no agent {agent_id!r} is registered") from exc
        key = self.keys.agent(agent_id)
        _, kv = await self._get(key, self._deadline())
        if kv is not None and kv.lease == entry.backend_lease:
            tombstone = orjson.dumps({"state": _GONE, "router": self.router})
            try:
                result = await self.client.txn(
                    [compare_mod(key, kv.mod_revision)],
                    [put_op(key, tombstone, kv.lease)],
                    deadline=self._deadline(),
                )
                if kv.lease:
                    await self.client.revoke(kv.lease, deadline=self._deadline())
                else:  # a managed entry's key has no lease to take it away
                    await self.client.delete(key, deadline=self._deadline())
            except EtcdRejected as exc:
                raise self._refused_call(exc, "the write", write=True) from exc
            if result.succeeded:
                self.revision = max(self.revision, result.revision)
        local = self.snapshot.entries.get(agent_id)
        if local is not None:
            local.revision = max(local.revision, self.revision)
            self.snapshot.remove(local, RegistryEvent.DEREGISTERED)

    # -- shared failure knowledge ------------------------------------------------------------

    def set_health(self, agent_id: str, health: AgentStatusValue) -> None:
        super().set_health(agent_id, health)
        if health is AgentStatusValue.UNHEALTHY:
            self.report_failure(agent_id, "unhealthy")

    def report_failure(self, agent_id: str, reason: str) -> None:
        now = self._clock.monotonic()
        ttl = self.policy.etcd.failure_ttl_seconds
        if now - self._reported.get(agent_id, -1e9) < ttl / 2:
            return  # the others already know; the key is still alive
        self._reported[agent_id] = now
        if len(self._reported) > 4 * self.policy.max_agents:
            self._reported.clear()  # bounded: forgetting only means one more report
        self._background.spawn(self._publish_failure(agent_id, reason, ttl), "report")

    async def _publish_failure(self, agent_id: str, reason: str, ttl: int) -> None:
        value = orjson.dumps({"router": self.router, "reason": reason, "at": self._clock.time()})
        deadline = self.policy.etcd.attempt_timeout_seconds
        try:
            lease = await self.client.grant(ttl, deadline=deadline)
            await self.client.put(
                self.keys.failure(agent_id, self.router), value, lease=lease, deadline=deadline
            )
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not share that %s fails: %s", agent_id, exc)

    def _apply_failure(self, kv: KeyValue) -> None:
        agent_id, _, router = kv.key[len(self.keys.health) :].partition("/")
        if router == self.router or agent_id not in self.snapshot.entries:
            return
        record = self._decode(kv) or {}
        self.snapshot.emit_failure(agent_id, str(record.get("reason", "failing")), router)

    # -- learned routes ----------------------------------------------------------------------

    def _apply_learned(self, kv: KeyValue, *, deleted: bool) -> None:
        known = self._learned_keys.get(kv.key)
        if known is not None and known[1] >= kv.mod_revision and not deleted:
            return  # this Router wrote it already
        if deleted:
            if known is not None:
                del self._learned_keys[kv.key]
                self.snapshot.drop_learned(known[0])
            return
        record = self._decode(kv) or {}
        try:
            route = LearnedRoute(
                str(record["phrase"]), str(record["task"]), str(record["source"]), float(record["at"])
            )
        except (KeyError, TypeError, ValueError):
            log.warning("[registry] skipping %s: not a learned route", kv.key)
            return
        self._learned_keys[kv.key] = (self.snapshot.keep(route), kv.mod_revision)

    async def remember(self, phrase: str, task: str, source: str, *, limit: int) -> LearnedRoute:
        route = LearnedRoute(phrase, task, source, self._clock.time())
        phrase_key = normalize_phrase(phrase)
        key = self.keys.learned_route(phrase_key)
        value = orjson.dumps({**route.to_json(), "router": self.router})
        # The bound holds across Routers: whoever writes past it removes the oldest.
        room = limit if phrase_key in self.snapshot.learned else limit - 1
        victims = [old for old in self.snapshot.excess(room) if old != phrase_key]
        try:
            revision = await self.client.put(key, value, deadline=self._deadline())
            for old in victims:
                await self.client.delete(self.keys.learned_route(old), deadline=self._deadline())
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        self._apply_learned(KeyValue(key, value, 0, revision, 0), deleted=False)
        for old in victims:
            self._apply_learned(KeyValue(self.keys.learned_route(old), b"", 0, revision, 0), deleted=True)
        return route

    async def forget(self, phrase: str) -> bool:
        key = self.keys.learned_route(normalize_phrase(phrase))
        try:
            deleted = await self.client.delete(key, deadline=self._deadline())
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        known = key in self._learned_keys
        self._apply_learned(KeyValue(key, b"", 0, self.revision, 0), deleted=True)
        return bool(deleted) or known

    # -- learned negatives -------------------------------------------------------------------

    def _apply_negative(self, kv: KeyValue, *, deleted: bool) -> None:
        known = self._negative_keys.get(kv.key)
        if known is not None and known[1] >= kv.mod_revision and not deleted:
            return  # this Router wrote it already
        if deleted:
            if known is not None:
                del self._negative_keys[kv.key]
                self.snapshot.drop_negative(known[0])
            return
        record = self._decode(kv) or {}
        try:
            route = LearnedRoute(
                str(record["phrase"]), str(record["task"]), str(record["source"]), float(record["at"])
            )
        except (KeyError, TypeError, ValueError):
            log.warning("[registry] skipping %s: not a learned negative", kv.key)
            return
        self._negative_keys[kv.key] = (self.snapshot.keep_negative(route), kv.mod_revision)

    async def remember_negative(self, phrase: str, task: str, source: str, *, limit: int) -> LearnedRoute:
        route = LearnedRoute(phrase, task, source, self._clock.time())
        pair = (normalize_phrase(phrase), task)
        key = self.keys.negative(*pair)
        value = orjson.dumps({**route.to_json(), "router": self.router})
        room = limit if pair in self.snapshot.negatives else limit - 1
        victims = [old for old in self.snapshot.excess_negatives(room) if old != pair]
        try:
            revision = await self.client.put(key, value, deadline=self._deadline())
            for old in victims:
                await self.client.delete(self.keys.negative(*old), deadline=self._deadline())
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        self._apply_negative(KeyValue(key, value, 0, revision, 0), deleted=False)
        for old in victims:
            self._apply_negative(KeyValue(self.keys.negative(*old), b"", 0, revision, 0), deleted=True)
        return route

    async def forget_negative(self, phrase: str, task: str) -> bool:
        key = self.keys.negative(normalize_phrase(phrase), task)
        try:
            deleted = await self.client.delete(key, deadline=self._deadline())
        except EtcdRejected as exc:
            raise self._refused_call(exc, "the write", write=True) from exc
        known = key in self._negative_keys
        self._apply_negative(KeyValue(key, b"", 0, self.revision, 0), deleted=True)
        return bool(deleted) or known

    # -- shared capability vectors -----------------------------------------------------------

    def _block_key(self, key: str) -> tuple[str, str] | None:
        model, _, agent_id = key[len(self.keys.vectors) :].partition("/")
        return (model, agent_id) if agent_id else None

    def vectors_for(self, model: str, agent_id: str) -> bytes | None:
        if not self.policy.etcd.share_vectors:
            return None
        return self._blocks.get((quote(model, safe=""), agent_id))

    def publish_vectors(self, model: str, agent_id: str, block: bytes) -> None:
        entry = self.snapshot.entries.get(agent_id)
        if not self.policy.etcd.share_vectors or entry is None or not entry.backend_lease:
            return
        self._blocks[(quote(model, safe=""), agent_id)] = block
        self._background.spawn(self._put_block(model, entry, block), "vectors")

    async def _put_block(self, model: str, entry: AgentEntry, block: bytes) -> None:
        try:
            # On the agent's lease: the vectors leave etcd when the agent does.
            await self.client.put(self.keys.vector_block(model, entry.id), block, lease=entry.backend_lease)
        except (RegistryUnavailable, EtcdRejected) as exc:
            log.debug("[registry] could not share the vectors of %s: %s", entry.id, exc)
