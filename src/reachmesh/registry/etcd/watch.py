"""The snapshot kept in step with etcd: one full read, then one prefix watch.

The watch resumes from its last revision after a disconnect, and reads everything again when
that revision was compacted away. Routing reads only the snapshot: no etcd round trip per request.
"""

from __future__ import annotations

import asyncio
import logging

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.protocol import AgentStatusValue
from reachmesh.registry.entry import RegistryEvent
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcd.knowledge import SharedKnowledge
from reachmesh.registry.etcd.stored import GONE, decode, read_entry
from reachmesh.registry.etcdclient import Compacted, EtcdRejected, Event, KeyValue

log = logging.getLogger("reachmesh.registry")

_OFFLINE = AgentStatusValue.OFFLINE


class Watcher:
    """Applies what etcd holds, and every change after it, to the snapshot."""

    def __init__(self, shared: Shared, health: Health, knowledge: SharedKnowledge) -> None:
        self._shared = shared
        self._health = health
        self._knowledge = knowledge
        self.loaded = False  # a first full read has been applied
        self.resyncs = 0

    # -- the full read -----------------------------------------------------------------------

    async def resync(self, *, once: bool = False) -> None:
        """Read every key under the prefix and bring the snapshot to that revision (``once``:
        each member tried once at most)."""
        shared, keys = self._shared, self._shared.keys
        revision, kvs = await shared.client.get_prefix(keys.root, once=once)
        self._knowledge.reset_blocks()
        # Vector blocks first: installing an agent schedules its vectors, which looks for a block.
        # Keys come sorted otherwise, so agents/ is applied before the health/ reports naming them.
        first = [kv for kv in kvs if kv.key.startswith(keys.vectors)]
        rest = [kv for kv in kvs if not kv.key.startswith(keys.vectors)]
        shared.replaying = not self.loaded
        try:
            self.apply([Event(kv, deleted=False) for kv in first + rest])
        finally:
            shared.replaying = False
        present = {kv.key[len(keys.agents) :] for kv in kvs if kv.key.startswith(keys.agents)}
        self._knowledge.forget_missing({kv.key for kv in kvs}, revision)
        now = shared.clock.monotonic()
        for entry in list(shared.snapshot.entries.values()):
            # Gone from etcd while this Router was not watching: its lease ran out meanwhile.
            # An entry written after the read's revision (registered through this Router while
            # the read was in flight) is newer than the read, not missing from it.
            missing = entry.id not in present and entry.revision <= revision
            if missing and entry.status is not _OFFLINE:
                shared.snapshot.go_offline(entry, now)
        shared.revision = revision
        how = "resynced from etcd" if self.loaded else "read back from etcd"
        log.info("[registry] %s: %d agents at revision %d", how, len(present), revision)
        self.loaded = True
        self._health.serving()
        self.resyncs += 1

    def apply(self, events: list[Event]) -> None:
        keys, knowledge = self._shared.keys, self._knowledge
        for event in events:
            kv = event.kv
            if kv.key.startswith(keys.agents):
                self.apply_agent(kv.key[len(keys.agents) :], kv, deleted=event.deleted)
            elif kv.key.startswith(keys.vectors):
                knowledge.apply_block(kv, deleted=event.deleted)
            elif kv.key.startswith(keys.health) and not event.deleted:
                knowledge.apply_failure(kv)
            elif kv.key.startswith(keys.learned):
                knowledge.apply_learned(kv, deleted=event.deleted)
            elif kv.key.startswith(keys.negatives):
                knowledge.apply_negative(kv, deleted=event.deleted)
            self._shared.revision = max(self._shared.revision, kv.mod_revision)

    def apply_agent(self, agent_id: str, kv: KeyValue, *, deleted: bool) -> bool:
        """Bring one agent's snapshot entry to ``kv``; True when the agent is live there."""
        snapshot = self._shared.snapshot
        current = snapshot.entries.get(agent_id)
        if current is not None and current.revision >= kv.mod_revision:
            return current.status is not _OFFLINE  # this Router wrote it already
        if deleted:
            if current is not None and current.status is not _OFFLINE:
                current.revision = kv.mod_revision
                # The lease ran out (a deregistration says so first).
                snapshot.go_offline(current, self._shared.clock.monotonic())
            return False
        record = decode(kv)
        if record is None:
            return False
        if record.get("state") == GONE:
            if current is not None:
                snapshot.remove(current, RegistryEvent.DEREGISTERED)
            return False
        entry = read_entry(record, kv, self._shared.clock, expect_id=agent_id)
        if entry is None:
            return False
        snapshot.install(entry, current is not None and current.status is not _OFFLINE)
        return True

    # -- the watch ---------------------------------------------------------------------------

    async def loop(self) -> None:
        shared = self._shared
        delay = 0.1
        while True:
            try:
                if not self.loaded:
                    await self.resync()
                    await self._health.check_write()  # etcd was out of reach at start: check it now
                await self._watch_once()
                delay = 0.1
            except Compacted as exc:
                log.warning(
                    "[registry] etcd compacted revision %d away (at %d); reading everything again",
                    shared.revision + 1,
                    exc.compact_revision,
                )
                self.loaded = False
                continue
            except RegistryUnavailable as exc:
                shared.last_error = exc.message
                log.debug("[registry] watch: %s", exc.message)
                shared.client.rotate()
            except EtcdRejected as exc:
                # Keep trying: an operator may grant the permission back.
                self._health.note_refusal(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _watch_once(self) -> None:
        """Follow one member's watch stream until it ends, breaks, or the ping asks to restart."""
        shared = self._shared
        endpoint = shared.client.current
        shared.restart.clear()
        shared.watching = endpoint
        stream = asyncio.ensure_future(self._consume(endpoint))
        restart = asyncio.ensure_future(shared.restart.wait())
        try:
            await asyncio.wait({stream, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            shared.watching = None
            for task in (stream, restart):
                task.cancel()
            await asyncio.gather(restart, return_exceptions=True)
        if stream.done() and not stream.cancelled():
            stream.result()  # raises what broke the stream
        else:
            await asyncio.gather(stream, return_exceptions=True)

    async def _consume(self, endpoint: str) -> None:
        # A watch that etcd creates has passed its login and permission check: etcd serves again.
        shared = self._shared
        async for events in shared.client.watch(
            endpoint, shared.keys.root, shared.revision + 1, on_created=self._health.serving
        ):
            self.apply(events)
