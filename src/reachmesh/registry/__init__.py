"""Where agents live: a small async contract (:mod:`.base`) and its backends.

The in-memory backend is the embedded default and also the test double; the etcd backend
(:mod:`.etcd`) implements the same contract, with watches feeding the same local snapshot, so
that several Routers share one registry.
"""

from reachmesh.registry.base import AgentEntry, Registry, RegistryEvent
from reachmesh.registry.memory import MemoryRegistry

__all__ = ["AgentEntry", "MemoryRegistry", "Registry", "RegistryEvent"]
