"""``exact_match``: the agents that declare the task, spread by ``routing_weight``.

The first choice rotates by smooth weighted round robin, so over N requests each agent leads in
proportion to its weight, evenly interleaved rather than in bursts. The rest follow by weight,
as failover order.
"""

from __future__ import annotations

from reachmesh.registry.base import AgentEntry
from reachmesh.routing.base import Choice, Ranking


class SmoothWeighted:
    """Smooth weighted round robin state, one small table per task.

    Memory is bounded by the registry: a table only exists for a task that some agent declares,
    and it is pruned to the agents currently eligible.
    """

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        self._tables: dict[str, dict[str, float]] = {}

    def pick(self, key: str, weighted: list[tuple[str, float]]) -> int:
        """Index into ``weighted`` of the next pick for ``key``."""
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        elif len(table) > len(weighted):
            live = {agent_id for agent_id, _ in weighted}
            for gone in [a for a in table if a not in live]:
                del table[gone]
        total = 0.0
        best = -1
        best_current = 0.0
        for i, (agent_id, weight) in enumerate(weighted):
            current = table.get(agent_id, 0.0) + weight
            table[agent_id] = current
            total += weight
            if best < 0 or current > best_current:
                best, best_current = i, current
        table[weighted[best][0]] = best_current - total
        return best

    def forget(self, agent_id: str) -> None:
        """Drop an agent from every table (it left the registry)."""
        for table in self._tables.values():
            table.pop(agent_id, None)


# Choices kept for reuse (see ExactMatch._choices): more than any registry holds agents x tasks.
MAX_CHOICES = 8192


class ExactMatch:
    """Rank by declared capability: a weighted rotation first, then by weight."""

    name = "exact_match"

    def __init__(self) -> None:
        self.rotation = SmoothWeighted()
        # The Choice of each (agent, task), made once per registry entry, not on every call: an
        # exact match's has no score and is never changed after (only a choice by meaning gets
        # ``on_decline``), so requests share it. A re-registration is a new entry, and a new
        # Choice; the table is bounded, and emptied when full (agents churn).
        self._choices: dict[tuple[str, str], Choice] = {}

    def rank(self, task: str, entries: list[AgentEntry], similarity: float | None = None) -> Ranking:
        return Ranking(self.order(task, entries))

    def order(self, task: str, entries: list[AgentEntry]) -> list[Choice]:
        """The choices for ``entries``, best first (:meth:`rank` has no explanation to add)."""
        if len(entries) == 1:
            entry = entries[0]
            known = self._choices.get((entry.id, task))  # _choice(), without the call
            return [known if known is not None and known.entry is entry else self._choice(entry, task)]
        weighted = [(e.id, e.capabilities[task].routing_weight) for e in entries]
        first = self.rotation.pick(task, weighted)
        rest = sorted(
            (e for i, e in enumerate(entries) if i != first),
            key=lambda e: e.capabilities[task].routing_weight,
            reverse=True,
        )
        return [self._choice(entries[first], task), *(self._choice(e, task) for e in rest)]

    def _choice(self, entry: AgentEntry, task: str) -> Choice:
        """The shared Choice of ``entry`` for ``task`` (see ``_choices``)."""
        key = (entry.id, task)
        known = self._choices.get(key)
        if known is None or known.entry is not entry:
            if len(self._choices) >= MAX_CHOICES:
                self._choices.clear()
            known = self._choices[key] = Choice.of(entry, task)
        return known
