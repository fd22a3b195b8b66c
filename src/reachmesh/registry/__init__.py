"""Where agents live: a small async contract (:mod:`.base`) over a snapshot, and its backends.

Both backends keep a :class:`~reachmesh.registry.snapshot.Snapshot`, the in-memory view the
Router reads on every request. The in-memory backend is the embedded default and also the test
double; the etcd backend (:mod:`.etcd`) implements the same contract, with a watch feeding its
snapshot, so that several Routers share one registry.
"""

from reachmesh.registry.base import AgentEntry, Registry, RegistryEvent
from reachmesh.registry.memory import MemoryRegistry

__all__ = ["AgentEntry", "MemoryRegistry", "Registry", "RegistryEvent"]
