"""``weighted_round_robin``: smooth weighted round robin over weight x merit.

Each agent's effective weight is its ``routing_weight`` times a success factor and a latency
factor from time-decayed EWMAs (:class:`~reachmesh.routing.stats.StatsBook`), so within seconds a slow
or failing agent's share drops, and it comes back as it heals. The factors are kept in the
decision record, so every choice can be explained.
"""

from __future__ import annotations

from typing import Any

from reachmesh.config import MeritPolicy
from reachmesh.registry.base import AgentEntry
from reachmesh.routing.base import Choice, Ranking
from reachmesh.routing.exact import SmoothWeighted
from reachmesh.routing.stats import StatsBook


class Merit:
    """Turns an agent's EWMAs into the factors that scale its weight."""

    def __init__(self, stats: StatsBook, policy: MeritPolicy | None = None) -> None:
        self.stats = stats
        self.policy = policy or MeritPolicy()

    def factors(self, agent_id: str) -> tuple[float, float]:
        """``(success factor, latency factor)``, each in ``[min_factor, 1]``."""
        policy = self.policy
        success, latency = self.stats.merit(agent_id)
        success_factor = max(success**policy.success_exponent, policy.min_factor)
        latency_factor = 1.0 if latency is None else 1.0 / (1.0 + latency / policy.latency_scale_ms)
        return success_factor, max(latency_factor, policy.min_factor)


class WeightedRoundRobin:
    """Rank by effective weight: a smooth rotation picks the first, the rest follow by weight."""

    name = "weighted_round_robin"

    def __init__(self, merit: Merit) -> None:
        self.merit = merit
        self.rotation = SmoothWeighted()

    def effective(
        self, task: str, entries: list[AgentEntry]
    ) -> list[tuple[AgentEntry, float, dict[str, Any]]]:
        out = []
        for entry in entries:
            weight = entry.capabilities[task].routing_weight
            success, latency = self.merit.factors(entry.id)
            effective = weight * success * latency
            out.append(
                (
                    entry,
                    effective,
                    {
                        "agentId": entry.id,
                        "weight": weight,
                        "success": round(success, 4),
                        "latency": round(latency, 4),
                        "effective": round(effective, 4),
                    },
                )
            )
        return out

    def rank(self, task: str, entries: list[AgentEntry], similarity: float | None = None) -> Ranking:
        scored = self.effective(task, entries)
        total = sum(e for _, e, _ in scored) or 1.0
        explained = []
        for _, effective, explain in scored:
            explain["share"] = round(effective / total, 4)
            if similarity is not None:
                explain["similarity"] = round(similarity, 4)
            explained.append(explain)
        return Ranking(self._order(task, scored, total, similarity), explained)

    def _order(
        self,
        task: str,
        scored: list[tuple[AgentEntry, float, dict[str, Any]]],
        total: float,
        similarity: float | None,
    ) -> list[Choice]:
        if len(scored) == 1:
            entry = scored[0][0]
            return [Choice.of(entry, task, similarity if similarity is not None else 1.0)]
        first = self.rotation.pick(task, [(e.id, eff) for e, eff, _ in scored])
        head = scored[first]
        rest = sorted((s for i, s in enumerate(scored) if i != first), key=lambda s: s[1], reverse=True)

        def score(effective: float) -> float:
            return similarity if similarity is not None else round(effective / total, 4)

        return [
            Choice.of(head[0], task, score(head[1])),
            *(Choice.of(e, task, score(eff)) for e, eff, _ in rest),
        ]
