"""Conversation affinity: which agent holds a conversation, for a while.

Bounded twice: entries expire after ``ttl_seconds``, and past ``max_conversations`` the least
recently used go first, so a flood of new conversation ids cannot grow memory.

Keyed by the caller (its token's key; ``-`` for everyone while auth is off) and the
conversationId: a conversation id is the caller's own word, and another caller who sends the
same id must neither follow nor move its binding.
"""

from __future__ import annotations

from collections import OrderedDict

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import AffinityPolicy


class AffinityTable:
    """(caller, conversationId) -> (agentId, expiry)."""

    def __init__(self, policy: AffinityPolicy | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy or AffinityPolicy()
        self._clock = clock
        self._bound: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def apply(self, policy: AffinityPolicy) -> None:
        """Take a reloaded policy; conversations already bound keep their agent."""
        self.policy = policy

    def get(self, conversation_id: str, caller: str = "-") -> str | None:
        """The agent bound to ``caller``'s conversation, if the binding is still fresh."""
        key = (caller, conversation_id)
        found = self._bound.get(key)
        if found is None:
            return None
        agent_id, expires = found
        if self._clock.monotonic() >= expires:
            del self._bound[key]
            return None
        return agent_id

    def bind(self, conversation_id: str, agent_id: str, caller: str = "-") -> None:
        """Bind (or refresh) ``caller``'s conversation to ``agent_id``."""
        key = (caller, conversation_id)
        self._bound[key] = (agent_id, self._clock.monotonic() + self.policy.ttl_seconds)
        self._bound.move_to_end(key)
        while len(self._bound) > self.policy.max_conversations:
            self._bound.popitem(last=False)

    def forget_agent(self, agent_id: str) -> None:
        """Drop every binding to an agent that left the registry."""
        for key in [k for k, (a, _) in self._bound.items() if a == agent_id]:
            del self._bound[key]

    def __len__(self) -> int:
        return len(self._bound)
