"""The routing pipeline: candidates, then hard filters, then rank.

1. candidates: ``targetAgent`` when set, else every agent that declares ``targetTask``
   (from the registry's task index);
2. filters: the ``filterAgentIds`` allowlist, then status (offline and unhealthy are out,
   suspect agents go last), then the circuit breaker (open and not due for a probe: out);
3. rank: the strategy orders what is left;
4. affinity: the agent a ``conversationId`` is bound to goes first while it is routable.

Each rejection is written to the decision record with its reason. Later steps add stages here
(breaker state, affinity, the task mapping table, semantic candidates) rather than rewrite it.
"""

from __future__ import annotations

from agent_reach.config import RoutingPolicy
from agent_reach.exceptions import NoAvailableHandler
from agent_reach.observability.record import DecisionRecord
from agent_reach.protocol import AgentStatusValue, CandidateReason, ReachRequest, Strategy
from agent_reach.registry.base import AgentEntry, Registry
from agent_reach.resilience.affinity import AffinityTable
from agent_reach.resilience.breaker import BreakerBoard
from agent_reach.routing.base import Choice, Ranker
from agent_reach.routing.exact import ExactMatch

_OUT = {
    AgentStatusValue.OFFLINE: CandidateReason.OFFLINE,
    AgentStatusValue.UNHEALTHY: CandidateReason.UNHEALTHY,
}


class Pipeline:
    """Turns a request into an ordered list of :class:`Choice`, or raises NoAvailableHandler."""

    def __init__(
        self,
        registry: Registry,
        policy: RoutingPolicy | None = None,
        *,
        breakers: BreakerBoard | None = None,
        affinity: AffinityTable | None = None,
    ) -> None:
        self.registry = registry
        self.policy = policy or RoutingPolicy()
        # `is None`, not `or`: an empty board or table is falsy (it has a length).
        self.breakers = BreakerBoard() if breakers is None else breakers
        self.affinity = AffinityTable() if affinity is None else affinity
        exact = ExactMatch()
        # Strategies that later steps implement fall back to exact match until then; the
        # decision record names the strategy that actually ranked.
        self._rankers: dict[Strategy, Ranker] = {
            Strategy.EXACT_MATCH: exact,
            Strategy.WEIGHTED_ROUND_ROBIN: exact,
            Strategy.SEMANTIC_ROUTE: exact,
        }

    def forget(self, agent_id: str) -> None:
        """Drop per-agent ranking state when an agent leaves the registry."""
        for ranker in {id(r): r for r in self._rankers.values()}.values():
            rotation = getattr(ranker, "rotation", None)
            if rotation is not None:
                rotation.forget(agent_id)

    def decide(self, request: ReachRequest, record: DecisionRecord) -> list[Choice]:
        task = request.target_task
        ranker = self._ranker(request)
        record.strategy = ranker.name

        # 1. candidates
        pool: list[AgentEntry]
        if request.target_agent:
            entry = self.registry.get(request.target_agent)
            record.rule = "target_agent"
            if entry is None:
                record.reject(request.target_agent, CandidateReason.UNKNOWN_AGENT)
                raise self._none(record, f"targetAgent {request.target_agent!r} is not registered")
            if task not in entry.capabilities:
                record.candidates.append(entry.id)
                record.reject(entry.id, CandidateReason.NO_CAPABILITY)
                raise self._none(record, f"targetAgent {entry.id!r} does not declare task {task!r}")
            pool = [entry]
            record.matched_task = task
        else:
            record.rule = ranker.name
            pool = list(self.registry.by_task(task))
            if not pool:
                raise self._none(record, f"no agent declares task {task!r}")
            record.matched_task = task
        record.candidates = [e.id for e in pool]

        # 2. hard filters
        allow = request.preferences.filter_agent_ids
        allowed = set(allow) if allow is not None else None
        breakers = self.breakers
        eligible: list[AgentEntry] = []
        last_resort: list[AgentEntry] = []
        for entry in pool:
            if allowed is not None and entry.id not in allowed:
                record.reject(entry.id, CandidateReason.FILTERED)
            elif not entry.routable:
                record.reject(entry.id, _OUT[entry.status])
            elif breakers.blocked(entry.id, task):
                record.reject(entry.id, CandidateReason.CIRCUIT_OPEN)
            elif entry.status is AgentStatusValue.AVAILABLE:
                eligible.append(entry)
            else:
                last_resort.append(entry)
        if not eligible and not last_resort:
            raise self._none(record, f"no routable agent for task {task!r}")

        # 3. rank
        ranked = ranker.rank(task, eligible) if eligible else []
        if last_resort:
            ranked.extend(ranker.rank(task, last_resort))

        # 4. affinity
        if request.conversation_id:
            bound = self.affinity.get(request.conversation_id)
            if bound is not None:
                record.affinity = bound
                for i, choice in enumerate(ranked):
                    if choice.entry.id == bound:
                        if i:
                            ranked.insert(0, ranked.pop(i))
                        break
        return ranked

    def _ranker(self, request: ReachRequest) -> Ranker:
        wanted = request.preferences.strategy
        if wanted is None or not self.policy.allow_caller_strategy:
            wanted = self.policy.default_strategy
        return self._rankers[wanted]

    @staticmethod
    def _none(record: DecisionRecord, message: str) -> NoAvailableHandler:
        return NoAvailableHandler(message, list(record.rejected))
