"""Conversation affinity: which agent holds a conversation, for a while.

Bounded twice: entries expire after ``ttl_seconds``, and past ``max_conversations`` the least
recently used go first, so a flood of new conversation ids cannot grow memory.

Keyed by the caller (its token's key; ``-`` for everyone while auth is off) and the
conversationId: a conversation id is the caller's own word, and another caller who sends the
same id must neither follow nor move its binding.

Each caller has a share, ``max_conversations_per_caller``: past it the caller's own least recently
used binding goes, nobody else's (with auth off every caller is ``-``, whose share is the whole
table). With the global bound alone, one caller sending a flood of new
conversation ids pushed every other caller's bindings out, and their next turns went to agents
that did not hold their conversations.
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
        # Each caller's bindings, least recently used first, for its share.
        self._by_caller: dict[str, OrderedDict[str, None]] = {}

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
            self._unbind(key)
            return None
        return agent_id

    def bind(self, conversation_id: str, agent_id: str, caller: str = "-") -> None:
        """Bind (or refresh) ``caller``'s conversation to ``agent_id``."""
        key = (caller, conversation_id)
        self._bound[key] = (agent_id, self._clock.monotonic() + self.policy.ttl_seconds)
        self._bound.move_to_end(key)
        mine = self._by_caller.setdefault(caller, OrderedDict())
        mine[conversation_id] = None
        mine.move_to_end(conversation_id)
        # "-" is every caller at once (auth off): its share is the whole table.
        while caller != "-" and len(mine) > self.policy.max_conversations_per_caller:
            self._unbind((caller, next(iter(mine))))
        while len(self._bound) > self.policy.max_conversations:
            self._unbind(next(iter(self._bound)))

    def held_by(self, caller: str) -> int:
        """How many conversations ``caller`` has bound now."""
        return len(self._by_caller.get(caller, ()))

    def _unbind(self, key: tuple[str, str]) -> None:
        self._bound.pop(key, None)
        caller, conversation_id = key
        mine = self._by_caller.get(caller)
        if mine is not None:
            mine.pop(conversation_id, None)
            if not mine:
                del self._by_caller[caller]

    def forget_agent(self, agent_id: str) -> None:
        """Drop every binding to an agent that left the registry."""
        for key in [k for k, (a, _) in self._bound.items() if a == agent_id]:
            self._unbind(key)

    def __len__(self) -> int:
        return len(self._bound)
