"""Conversation affinity: which agent holds a conversation, for a while.

Bounded twice: entries expire after ``ttl_seconds``, and past ``max_conversations`` the least
recently used go first, so a flood of new conversation ids cannot grow memory.
"""

from __future__ import annotations

from collections import OrderedDict

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import AffinityPolicy


class AffinityTable:
    """conversationId -> (agentId, expiry)."""

    def __init__(self, policy: AffinityPolicy | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy or AffinityPolicy()
        self._clock = clock
        self._bound: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, conversation_id: str) -> str | None:
        """The agent bound to the conversation, if the binding is still fresh."""
        found = self._bound.get(conversation_id)
        if found is None:
            return None
        agent_id, expires = found
        if self._clock.monotonic() >= expires:
            del self._bound[conversation_id]
            return None
        return agent_id

    def bind(self, conversation_id: str, agent_id: str) -> None:
        """Bind (or refresh) the conversation to ``agent_id``."""
        self._bound[conversation_id] = (agent_id, self._clock.monotonic() + self.policy.ttl_seconds)
        self._bound.move_to_end(conversation_id)
        while len(self._bound) > self.policy.max_conversations:
            self._bound.popitem(last=False)

    def forget_agent(self, agent_id: str) -> None:
        """Drop every binding to an agent that left the registry."""
        for conversation_id in [c for c, (a, _) in self._bound.items() if a == agent_id]:
            del self._bound[conversation_id]

    def __len__(self) -> int:
        return len(self._bound)
