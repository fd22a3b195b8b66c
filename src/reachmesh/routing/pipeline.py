"""The routing pipeline: candidates, hard filters, rank, affinity.

1. ``targetAgent``: when set, only that agent (it must declare the task);
2. the task mapping table (``routing.task_map``): an alias or phrase becomes its canonical task,
   and wins over anything semantic;
3. exact match: every agent declaring the task (from the registry's task index, no scan);
3b. a learned route (``routing.learning``, opt-in): a phrase confirmed for a task before, matched
   normalized (:func:`~reachmesh.registry.base.normalize_phrase`), while some agent declares
   that task;
4. ``semantic_route``, only where the policy enables it (``routing.semantic_tasks`` patterns, or
   a caller asking for it) and exact match found nobody: the nearest declared task above the
   threshold and clear of the runner-up by the margin; else a refusal listing the best scores.
   An agent whose own declared limit matches the text better than its task (by the limit
   margin), or whose registration declined this phrase before (a live learned negative), is kept
   off; a task is set aside first only when every live agent of it is, and tasks outside the
   caller token's ``reach_tasks`` are not considered at all (docs/security.md). The other
   tasks above the threshold follow the chosen one's agents, tried only after a decline;
5. hard filters: the ``filterAgentIds`` allowlist, status (offline and unhealthy out, suspect
   last), the circuit breaker (open and no probe due: out);
6. rank by the strategy: ``exact_match`` (weighted rotation by ``routing_weight``),
   ``weighted_round_robin`` (weight x merit), or, for a semantic route, similarity then merit;
7. affinity: the agent a ``conversationId`` is bound to goes first while it is routable.

Each decision and rejection is written to the decision record. Nothing here does I/O: the query
vector of a semantic request is fetched by the dispatcher first, and only read from the cache here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from dataclasses import replace
from fnmatch import fnmatchcase
from operator import attrgetter

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RoutingPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import NoAvailableHandler, RegistryLoading, SemanticUnavailable, UnknownTask
from reachmesh.protocol import AgentStatusValue, CandidateReason, ReachRequest, Strategy
from reachmesh.redaction import loggable
from reachmesh.registry.base import AgentEntry, LearnedRoute, Registry, learned_key, normalize_phrase
from reachmesh.resilience.affinity import AffinityTable
from reachmesh.resilience.breaker import BreakerBoard
from reachmesh.resilience.capacity import CapacityBoard
from reachmesh.routing.base import Choice, Ranker
from reachmesh.routing.exact import ExactMatch
from reachmesh.routing.load import load_aware
from reachmesh.routing.stats import StatsBook
from reachmesh.routing.weighted import Merit, WeightedRoundRobin
from reachmesh.semantic.index import Vector, Verdict, Veto
from reachmesh.semantic.vectors import CapabilityVectors

# The veto reason of a task outside the caller's auth.tokens reach_tasks: dropped from what the
# caller is told.
OUT_OF_REACH = "out_of_reach"


# A targetTask of this shape names a task (`update_order_address`, `orders.v2/track`): it is
# exact or refused, never routed by meaning to another task unless asked (see
# RoutingPolicy.semantic_identifiers).
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:/@#-]{1,256}")


def is_identifier(text: str) -> bool:
    """True for text shaped like a task name: no spaces, no CJK, only name characters."""
    return _IDENTIFIER.fullmatch(text) is not None


_ID = attrgetter("id")

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
        stats: StatsBook | None = None,
        vectors: CapabilityVectors | None = None,
        capacity: CapacityBoard | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.registry = registry
        # Requests in flight per agent, and the queue at full ones: read for the load-aware order.
        self.capacity = CapacityBoard() if capacity is None else capacity
        self._clock = clock
        self.policy = policy or RoutingPolicy()
        # `is None`, not `or`: an empty board or table is falsy (it has a length).
        self.breakers = BreakerBoard() if breakers is None else breakers
        self.affinity = AffinityTable() if affinity is None else affinity
        self.vectors = vectors
        self.exact = ExactMatch()
        self.merit = Merit(StatsBook() if stats is None else stats, self.policy.merit)
        self.weighted = WeightedRoundRobin(self.merit)

    def apply(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        self.merit.policy = policy.merit

    def forget(self, agent_id: str) -> None:
        """Drop per-agent ranking state when an agent leaves the registry."""
        self.exact.rotation.forget(agent_id)
        self.weighted.rotation.forget(agent_id)

    # -- strategy and semantic gating ---------------------------------------------------------

    def strategy(self, request: ReachRequest) -> Strategy:
        wanted = request.preferences.strategy
        if wanted is None or not self.policy.allow_caller_strategy:
            return self.policy.default_strategy
        return wanted

    def canonical(self, task: str) -> str:
        return self.policy.task_map.get(task, task)

    def learned_task(self, text: str, caller: str = "-", reach: tuple[str, ...] = ("*",)) -> str | None:
        """The task ``text`` was learned for, for this caller, when learning is on and an agent
        declares it now (a learned route whose task nobody declares any more is kept, unused).

        The caller's own confirmation first, then an operator's; a route held for an operator
        routes nobody, and a task outside the caller's ``reach`` is never one."""
        if not self.policy.learning.enabled:
            return None
        learned = self.registry.learned()
        if not learned:
            return None
        phrase = normalize_phrase(text)
        for key in (learned_key(phrase, caller), phrase):
            route = learned.get(key)
            if route is None or route.pending or not self.registry.by_task(route.task):
                continue
            if any(fnmatchcase(route.task, glob) for glob in reach):
                return route.task
        return None

    def wants_semantic(
        self, request: ReachRequest, caller: str = "-", reach: tuple[str, ...] = ("*",)
    ) -> bool:
        """True when this request would be routed semantically (so it needs a query vector)."""
        if self.vectors is None or request.target_agent:
            return False
        task = request.target_task
        if task in self.policy.task_map or self.registry.by_task(task):
            return False
        if self.learned_task(task, caller, reach) is not None:
            return False
        strategy = self.strategy(request)
        asked = strategy is Strategy.SEMANTIC_ROUTE and request.preferences.strategy is strategy
        if is_identifier(task) and not asked and not self.policy.semantic_identifiers:
            # A task name nobody declares is refused with "did you mean", not run as its
            # neighbour by meaning: the caller believes the task it named ran.
            return False
        if strategy is Strategy.SEMANTIC_ROUTE:
            return True
        return any(fnmatchcase(task, pattern) for pattern in self.policy.semantic_tasks)

    # -- the decision: candidates, filters, rank, affinity -------------------------------------

    def decide(self, request: ReachRequest, record: DecisionRecord) -> list[Choice]:
        """The ranked choices for ``request``, each stage written to ``record``."""
        if not self.registry.loaded:
            reason = self.registry.ready() or "the registry is not loaded yet"
            raise RegistryLoading(f"{reason}; retry in a moment")
        # strategy(), written out: it runs on every call.
        wanted, policy = request.preferences.strategy, self.policy
        strategy = policy.default_strategy if wanted is None or not policy.allow_caller_strategy else wanted
        # The member's value without the enum's property (a Python-level call per read).
        record.strategy = strategy._value_
        record.narrowed = bool(request.target_agent) or request.preferences.filter_agent_ids is not None
        similarity: float | None = None
        # The other tasks above the threshold of a route by meaning: this request's alone, so
        # they travel with it, never on the shared pipeline.
        alternates: list[tuple[str, float]] = []
        if request.target_agent:
            task, target = self._targeted(request, record)
            pool = [target]
        else:
            task, similarity, alternates, found = self._by_task(request, record, strategy)
            pool = list(found)
        record.matched_task = task
        record.candidates = list(map(_ID, pool))  # no comprehension's frame
        groups = self._filter(request, record, task, pool, similarity)
        if similarity is None and strategy is Strategy.EXACT_MATCH and not groups[1]:
            ranked = self.exact.order(task, groups[0])  # _rank(), without the call: no SUSPECT agent
        else:
            ranked = self._rank(record, strategy, task, groups, similarity)
        if request.conversation_id:  # else the order stands: no conversation is bound
            ranked = self._affinity_first(request, record, ranked)
        if len(ranked) > 1:  # one choice has no order to change
            ranked = load_aware(ranked, self.capacity, keep_first=record.affinity is not None)
        if similarity is not None and alternates:
            ranked.extend(self._on_decline(request, record, strategy, alternates))
        return ranked

    def _on_decline(
        self,
        request: ReachRequest,
        record: DecisionRecord,
        strategy: Strategy,
        alternates: list[tuple[str, float]],
    ) -> list[Choice]:
        """The agents of the runner-up tasks above the threshold (``alternates``), each task's
        ranked as usual, to try after a decline (never after a failure)."""
        choices: list[Choice] = []
        for task, score in alternates:
            pool = list(self.registry.by_task(task))
            try:
                groups = self._filter(request, record, task, pool, score)
            except NoAvailableHandler:
                continue
            for choice in self._rank(record, strategy, task, groups, score):
                choice.on_decline = True
                choices.append(choice)
        return choices

    def _targeted(self, request: ReachRequest, record: DecisionRecord) -> tuple[str, AgentEntry]:
        """``targetAgent``: only that agent, and it must declare the task."""
        assert request.target_agent is not None
        record.rule = "target_agent"
        record.route_by = "task_map" if request.target_task in self.policy.task_map else "exact"
        entry = self.registry.get(request.target_agent)
        if entry is None:
            record.reject(request.target_agent, CandidateReason.UNKNOWN_AGENT)
            message = f"targetAgent {request.target_agent!r} is not registered"
            raise _no_handler(record, message + self._agents_near(request.target_agent))
        task = self.canonical(request.target_task)
        if task not in entry.capabilities:
            record.candidates.append(entry.id)
            record.reject(entry.id, CandidateReason.NO_CAPABILITY, task=task)
            raise _no_handler(record, f"targetAgent {entry.id!r} does not declare task {task!r}")
        return task, entry

    def _by_task(
        self, request: ReachRequest, record: DecisionRecord, strategy: Strategy
    ) -> tuple[str, float | None, list[tuple[str, float]], Collection[AgentEntry]]:
        """The declared task that supplies candidates: mapped, exact, or found by meaning; the
        similarity and the runner-up tasks of a route by meaning; the task's entries (looked up
        once for the common case, an exact task, not again by the caller)."""
        task = request.target_task
        mapped = self.policy.task_map.get(task)
        if mapped is not None:
            record.rule = record.route_by = "task_map"
            record.note("task map", f"{task} -> {mapped}")
            task = mapped
        else:
            record.rule = strategy._value_ if strategy is not Strategy.SEMANTIC_ROUTE else "exact_match"
            record.route_by = "exact"
        similarity: float | None = None
        alternates: list[tuple[str, float]] = []
        found = self.registry.by_task(task)
        if not found and mapped is None:
            learned = self.learned_task(task, record.caller, record.reach_tasks)
            if learned is not None:
                # Its own rule, so a learned route is told apart from the operator's task map.
                record.rule = record.route_by = "learned"
                record.note("learned", f"{loggable(task)} -> {learned}")
                task = learned
            elif self.wants_semantic(request, record.caller, record.reach_tasks):
                # Before the search: a refusal by meaning is told by this rule too.
                record.rule, record.route_by = "semantic_route", "meaning"
                task, similarity, alternates = self._semantic(request, record)
            found = self.registry.by_task(task)
        if not found:
            raise UnknownTask(task, list(record.rejected))
        return task, similarity, alternates, found

    def _filter(
        self,
        request: ReachRequest,
        record: DecisionRecord,
        task: str,
        pool: list[AgentEntry],
        similarity: float | None,
    ) -> tuple[list[AgentEntry], list[AgentEntry]]:
        """Hard filters: the allowlist, status and breaker. Available agents, then suspect ones."""
        allow = request.preferences.filter_agent_ids
        allowed = set(allow) if allow is not None else None
        excluded = record.agents_set_aside.get(task, {}) if similarity is not None else {}
        eligible: list[AgentEntry] = []
        last_resort: list[AgentEntry] = []
        for entry in pool:
            status = entry.status
            if allowed is not None and entry.id not in allowed:
                record.reject(entry.id, CandidateReason.FILTERED, similarity, task)
            elif entry.id in excluded:
                why, limit = excluded[entry.id]
                record.reject(entry.id, why, similarity, task, limit)
            elif status is not AgentStatusValue.AVAILABLE and status is not AgentStatusValue.SUSPECT:
                record.reject(entry.id, _OUT[status], similarity, task)  # not entry.routable
            elif self.breakers.blocked(entry.id, task):
                record.reject(entry.id, CandidateReason.CIRCUIT_OPEN, similarity, task)
            elif status is AgentStatusValue.AVAILABLE:
                eligible.append(entry)
            else:
                last_resort.append(entry)
        if not eligible and not last_resort:
            raise _no_handler(record, f"no routable agent for task {task!r}")
        return eligible, last_resort

    def _rank(
        self,
        record: DecisionRecord,
        strategy: Strategy,
        task: str,
        groups: tuple[list[AgentEntry], list[AgentEntry]],
        similarity: float | None,
    ) -> list[Choice]:
        """Each group in order, ranked by the strategy; a semantic route ranks by merit too."""
        if similarity is None and strategy is Strategy.EXACT_MATCH:
            # ExactMatch.rank() without its Ranking: it explains nothing, so only the order counts.
            # Most calls have one group (no SUSPECT agent): its order is the answer, no list built.
            exact, (eligible, last_resort) = self.exact, groups
            if not last_resort or not eligible:
                return exact.order(task, eligible or last_resort)
            return [*exact.order(task, eligible), *exact.order(task, last_resort)]
        ranker: Ranker = self.weighted
        ranked: list[Choice] = []
        for group in groups:
            if group:
                ranking = ranker.rank(task, group, similarity)
                ranked.extend(ranking.choices)
                record.explain.extend(ranking.explain)
        return ranked

    def _affinity_first(
        self, request: ReachRequest, record: DecisionRecord, ranked: list[Choice]
    ) -> list[Choice]:
        """The agent a conversation is bound to goes first while it is routable."""
        if not request.conversation_id:
            return ranked
        bound_agent = self.affinity.get(request.conversation_id, record.caller)
        if bound_agent is None:
            return ranked
        record.affinity = bound_agent
        for i, choice in enumerate(ranked):
            if choice.entry.id == bound_agent:
                if i:
                    ranked.insert(0, ranked.pop(i))
                break
        return ranked

    def _semantic(
        self, request: ReachRequest, record: DecisionRecord
    ) -> tuple[str, float, list[tuple[str, float]]]:
        """The task a free-text request means, its score and the runner-ups above the threshold;
        or a refusal with the best scores."""
        assert self.vectors is not None
        text = request.target_task
        query = self.vectors.cached(text)
        if query is None:
            reason = self.vectors.last_error or "no query vector"
            raise SemanticUnavailable(
                f"semantic routing is unavailable ({reason}); exact task names still work", []
            )
        limits = self.vectors.thresholds()
        if limits is None:
            raise SemanticUnavailable(
                f"no calibrated threshold for embedding model {self.vectors.embedder.model!r}: "
                "run `reach calibrate` and add the calibration it prints to the policy "
                f"(embedding.calibrations holds {sorted(self.vectors.policy.calibrations) or 'none'})",
                [],
            )
        threshold, margin = limits
        baseline = self.vectors.baseline(query)
        veto = self._veto(text, query, baseline, record)
        verdict = self.vectors.index.judge(query, threshold, margin, baseline, veto, self.vectors.head_rule())
        if any(why == OUT_OF_REACH for _, _, why, _ in verdict.vetoed):
            # Another tenant's tasks are not named to this caller, not even as set aside.
            kept = [v for v in verdict.vetoed if v[2] != OUT_OF_REACH]
            verdict = replace(verdict, vetoed=kept)
        self._set_aside(record, verdict)
        record.semantic = {
            "score": round(verdict.score, 4),
            "runnerUp": None if verdict.runner_up is None else round(verdict.runner_up, 4),
            "threshold": threshold,
            "margin": margin,
            "verdict": verdict.reason,
            "best": [{"task": t, "score": round(s, 4)} for t, s in verdict.best],
            "setAside": [
                {"task": t, "score": round(s, 4), "reason": why, "limit": limit}
                for t, s, why, limit in verdict.vetoed
            ],
        }
        if verdict.task is None:
            raise self._refused_by_meaning(record, verdict, text, threshold, margin)
        alternates = [(t, s) for t, s in verdict.best[1:] if s >= threshold]
        return verdict.task, verdict.score, alternates

    def _refused_by_meaning(
        self, record: DecisionRecord, verdict: Verdict, text: str, threshold: float, margin: float
    ) -> NoAvailableHandler:
        """The refusal of a text no capability takes, its best matches listed as candidates."""
        record.semantic_refused = True
        for best_task, score in verdict.best:
            for entry in self.registry.by_task(best_task):
                record.reject(entry.id, verdict.reason, round(score, 4), best_task)
        if not verdict.best and verdict.vetoed:
            return _no_handler(
                record,
                f"no capability takes {text!r}: the nearest ones declare they do not handle it, "
                "or declined it before",
            )
        if not verdict.best:
            # Nothing to compare with: saying "best score 0.000" would blame the question.
            return _no_handler(
                record, f"no capability is ready to route by meaning yet, so {text!r} matches none"
            )
        why = _weak_match(verdict, threshold, margin)
        return _no_handler(record, f"no capability matches {text!r} well enough: {why}")

    def _veto(self, text: str, query: Vector, baseline: float, record: DecisionRecord) -> Veto | None:
        """What sets a task aside for this text: a task the caller may not reach by meaning
        (silently), or every live agent of it having declined the text or declaring a limit it
        matches, beyond what the task itself explains, by more than the limit margin. An agent
        alone in that case is kept off (``record.agents_set_aside``) while the others of its
        task stay."""
        assert self.vectors is not None
        index = self.vectors.index
        negatives = self.registry.negatives()
        phrase = normalize_phrase(text) if negatives else ""
        limit_margin = self.vectors.limit_margin()
        now = self._clock.time()
        reach = record.reach_tasks
        anywhere = reach == ("*",)

        def veto(task: str, score: float) -> tuple[str, str | None] | None:
            if not anywhere and not any(fnmatchcase(task, glob) for glob in reach):
                return OUT_OF_REACH, None
            hits = index.limit_hits(query, task)
            out: dict[str, tuple[str, str | None]] = {}
            live = [e for e in self.registry.by_task(task) if e.routable]
            for entry in live:
                negative = negatives.get((phrase, task, entry.id)) if negatives else None
                hit = hits.get(entry.id)
                if negative is not None and _applies(negative, entry, now):
                    out[entry.id] = (CandidateReason.DECLINED, None)
                elif hit is not None and hit[0] > limit_margin:
                    out[entry.id] = (CandidateReason.DECLARED_LIMIT, hit[1])
            if live and len(out) == len(live):
                limits = [why for why in out.values() if why[0] == CandidateReason.DECLARED_LIMIT]
                return limits[0] if limits else (CandidateReason.DECLINED, None)
            if out:
                record.agents_set_aside[task] = out
            return None

        return veto

    def _set_aside(self, record: DecisionRecord, verdict: Verdict) -> None:
        """Each task a limit or a negative kept the text off, in the record and the trace."""
        for task, score, reason, limit in verdict.vetoed:
            for entry in self.registry.by_task(task):
                record.reject(entry.id, reason, round(score, 4), task, limit)
            why = (
                f"declared limit {loggable(limit)!r}" if limit is not None else "declined this phrase before"
            )
            record.note(reason.replace("_", " "), f"{task} ({why})")

    def _agents_near(self, agent_id: str) -> str:
        """``"; did you mean 'x'?"`` for registered ids spelt like ``agent_id``, else nothing.

        Only ids of about its length are compared, and a bounded number of them: an error path
        a caller can reach at will must not cost a scan of a large registry with difflib.
        """
        alike = [e.id for e in self.registry.agents() if abs(len(e.id) - len(agent_id)) <= 3][:2000]
        near = difflib.get_close_matches(agent_id, alike, n=3, cutoff=0.75)
        return f"; did you mean {', '.join(repr(a) for a in near)}?" if near else ""


def _no_handler(record: DecisionRecord, message: str) -> NoAvailableHandler:
    return NoAvailableHandler(message, list(record.rejected))


def _applies(negative: LearnedRoute, entry: AgentEntry, now: float) -> bool:
    """A negative speaks for the registration that declined, until it expires: the same agent
    registered afresh (fixed, restarted) is offered the phrase again."""
    return negative.live(now) and negative.lease == entry.lease_tag


def _weak_match(verdict: Verdict, threshold: float, margin: float) -> str:
    """Why the best match was not enough, and what was set aside before judging."""
    why = (
        f"best score {verdict.score:.3f} is below the threshold {threshold:.3f}"
        if verdict.reason == "below_threshold"
        else f"best score {verdict.score:.3f} is within {margin:.3f} of the runner-up"
    )
    return why + _set_aside_note(verdict)


def _set_aside_note(verdict: Verdict) -> str:
    """What was kept off before judging, so a refusal does not read as a weak match alone: a
    phrase that routed before and was then declined would otherwise be blamed on its score."""
    if not verdict.vetoed:
        return ""
    notes = [
        f"{task} (declared limit {limit!r})" if limit is not None else f"{task} (declined this phrase before)"
        for task, _, _, limit in verdict.vetoed[:3]
    ]
    more = f" and {len(verdict.vetoed) - 3} more" if len(verdict.vetoed) > 3 else ""
    return f"; set aside first: {', '.join(notes)}{more}"
