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
- Every Router keeps a snapshot (the same :class:`~reachmesh.registry.snapshot.Snapshot` the
  in-memory registry keeps), fed by one prefix watch that resumes from its last revision after
  a disconnect and reads everything again when that revision was compacted. Routing reads only
  the snapshot: no etcd round trip per request.
- When etcd does not answer, the Router is *degraded*: it routes from the snapshot, and writes
  fail fast with 503 ``REGISTRY_UNAVAILABLE``. When etcd is back, it resumes the watch.

The modules, one concern each: :mod:`.registry` (the contract, composing the rest),
:mod:`.watch` (the snapshot: full read, watch, resync after compaction), :mod:`.writes`
(register, renew, deregister, takeover transactions), :mod:`.knowledge` (learned routes,
negatives, vectors, failure reports), :mod:`.health` (ping, degraded, refused logins),
:mod:`.records` (what is stored under a key), :mod:`.keys` and :mod:`.shared`.
"""

from __future__ import annotations

from reachmesh.registry.etcd.keys import Keys, new_secret_lease, router_name
from reachmesh.registry.etcd.registry import EtcdRegistry

__all__ = ["EtcdRegistry", "Keys", "new_secret_lease", "router_name"]
