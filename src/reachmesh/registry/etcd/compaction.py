"""Compaction of etcd's history, which etcd 3.4 keeps whole unless told.

Every change of an agent's record is a new revision that etcd keeps until it is compacted; with
no compaction, re-registrations fill its backend quota and etcd raises NOSPACE, refusing every
write. Each tick compacts up to the revision this Router had seen at the previous tick: its own
watch is past it, and so is any other Router's that is not a whole interval behind (one that is
resyncs in full, as after any compaction). Several Routers compacting the same etcd is harmless:
a revision already compacted is skipped.
"""

from __future__ import annotations

import logging

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.registry.etcd.availability import Health
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcdclient import EtcdRejected

log = logging.getLogger("reachmesh.registry")


class Compactor:
    """One tick every ``registry.etcd.compact_interval_seconds``."""

    def __init__(self, shared: Shared, health: Health) -> None:
        self._shared = shared
        self._health = health
        self._seen = 0  # the revision the watch had applied at the previous tick
        self.compacted = 0  # the revision the last compaction reached (0: none yet)

    async def tick(self) -> None:
        target, self._seen = self._seen, self._shared.revision
        if target <= self.compacted or self._health.degraded() is not None:
            return
        try:
            await self._shared.client.compact(target, deadline=self._health.deadline())
        except EtcdRejected as exc:
            # A role without the right to compact, say: the operator's flags must do it instead.
            log.warning(
                "[registry] etcd refused to compact its history (%s): run etcd with "
                "--auto-compaction-retention, or its quota fills (see docs/etcd.md)",
                exc.message,
            )
            return
        except RegistryUnavailable:
            return  # the ping reports it; the next tick tries again
        self.compacted = target
        log.debug("[registry] compacted etcd's history up to revision %d", target)
