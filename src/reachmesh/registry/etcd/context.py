"""What the etcd registry's parts share: one client, one key layout, one snapshot, one clock.

Each part (the watch, the writes, the shared knowledge, the health of the connection) holds this
rather than the registry itself, so none of them can reach into another's state.
"""

from __future__ import annotations

import asyncio

from reachmesh.clock import Clock
from reachmesh.config import RegistryPolicy
from reachmesh.lifecycle import Background
from reachmesh.registry.etcd.keys import Keys
from reachmesh.registry.etcdclient import EtcdClient
from reachmesh.registry.snapshot import Snapshot


class Shared:
    """The client, the layout and the snapshot, and where the watch stands."""

    def __init__(
        self,
        policy: RegistryPolicy,
        *,
        client: EtcdClient,
        snapshot: Snapshot,
        clock: Clock,
        router: str,
        background: Background,
    ) -> None:
        # Replaced on reload; the endpoints and prefix are read at start and kept.
        self.policy = policy
        self.client = client
        self.keys = Keys(policy.etcd.prefix)
        self.snapshot = snapshot
        self.clock = clock
        self.router = router
        self.background = background
        self.revision = 0  # the last revision applied to the snapshot
        # True while the first full read installs what etcd holds (see Registry.replaying).
        self.replaying = False
        self.last_error = "not connected yet"
        # Set to make the watch follow another member, or to resume after an outage.
        self.restart = asyncio.Event()
        self.watching: str | None = None  # the member whose stream the watch follows now
