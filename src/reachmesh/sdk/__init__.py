"""The agent SDK: :class:`ReachAgent` to serve capabilities, :class:`ReachClient` to call them.

It speaks HTTP through three stacks, each for a reason the others cannot serve:

- **aiohttp** (:mod:`.agent`, :class:`ReachClient`): the agent's own event loop, which serves
  ``POST /reach`` and makes ``ctx.call`` hops, pooled and non-blocking.
- **httpx, synchronous** (:mod:`.lease`, :class:`SyncReachClient`): the lease keeper runs on its
  own thread so that a handler holding the loop or the CPU never costs the agent its lease, and
  a thread needs a blocking client; plain scripts get the same one. aiohttp has no sync client.
- **http.server** (:mod:`.health`): the health endpoint answers from its own thread, outside the
  event loop, so a busy-but-alive agent keeps passing its health checks. It is the standard
  library, so it adds no dependency.
"""

from reachmesh.sdk.agent import AgentError, Decline, ReachAgent, ReachContext
from reachmesh.sdk.client import ReachClient, SyncReachClient
from reachmesh.sdk.config import AgentConfig

__all__ = [
    "AgentConfig",
    "AgentError",
    "Decline",
    "ReachAgent",
    "ReachClient",
    "ReachContext",
    "SyncReachClient",
]
