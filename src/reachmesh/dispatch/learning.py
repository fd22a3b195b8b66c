"""Learning from confirmed routes: a caller refused by meaning that then names the task itself.

A caller asks "where's my stuff", the Router refuses it by meaning (``NO_AVAILABLE_HANDLER``
after ``semantic_route``), and within ``routing.learning.window_seconds`` the same caller, in the
same conversation, sends ``targetTask: "track_parcel"`` and it succeeds. That retry confirms the
phrase: the Router remembers "where's my stuff" -> ``track_parcel`` in the registry (so every
Router on a shared one learns it), where it routes that phrase exactly and serves as one more
example of the task for its paraphrases.

What does *not* teach anything:

- a retry that failed, in any way (only ``SUCCESS`` confirms);
- a retry from another caller (principal key), or in another conversation (``conversationId``,
  or ``sourceAgent`` when there is none); a request with neither is never matched;
- a retry that was itself routed by meaning, by the task map or by a learned route: only a task
  named exactly, as declared, confirms;
- a call the guard refused (no token, a role that may not call): it never reaches the dispatcher.

- a retry by an agent token to a task that token may serve: an agent never confirms a route to
  its own capability.

Whom a confirmed route serves is the policy's (``routing.learning.scope``): the caller who
confirmed it alone, or nobody until an operator confirms it (docs/security.md, the trust table).

A decline teaches the opposite: when an agent found by meaning declined the phrase (and the
request did not end handled by that same capability), the Router remembers (phrase, task, agent)
as a learned negative (``routing.learning.negatives``, on by default), and routes by meaning keep
that phrase off that agent's registration for ``negative_ttl_seconds``, on every Router sharing
the registry; the task is set aside only while every live agent of it has declined. A request
that narrowed its own candidates (``filterAgentIds``, ``targetAgent``) teaches nothing: it chose
who would answer, so its decline says nothing of the others.

This is an :class:`~reachmesh.decision.Observer`: it reads finished decision records and never
sits on the request path; the registry write runs in the background.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from fnmatch import fnmatchcase

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import LearningPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import RegistryError
from reachmesh.lifecycle import Background
from reachmesh.protocol import Status
from reachmesh.redaction import loggable
from reachmesh.registry.base import LearnedRoute, Registry

log = logging.getLogger("reachmesh.learning")

# Refusals remembered while their window is open, at most: a flood of refused phrases from many
# callers costs a bounded table, the oldest refusals leaving first.
MAX_OPEN_REFUSALS = 10_000

# The rules by which a request names its task itself (exact_match, or the ranking strategy used
# for an exact task); task_map, learned, semantic_route and target_agent with an alias do not.
_EXPLICIT = frozenset({"exact_match", "weighted_round_robin", "target_agent"})

Thread = tuple[str, str, str]


class RouteLearner:
    """Pairs a refusal by meaning with the same caller's explicit, successful retry."""

    def __init__(self, registry: Registry, policy: LearningPolicy, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.registry = registry
        self.policy = policy
        self._clock = clock
        self._refused: OrderedDict[Thread, tuple[str, float]] = OrderedDict()
        self._background = Background("reach-learning")
        self.learned = 0  # routes learned from callers by this Router

    def apply(self, policy: LearningPolicy) -> None:
        """Take a reloaded policy; learned routes already held stay."""
        self.policy = policy

    @property
    def pending(self) -> int:
        """Registry writes still under way (what a finished request taught, not yet kept)."""
        return len(self._background)

    @staticmethod
    def thread(record: DecisionRecord) -> Thread | None:
        """Who asked, and in which conversation; None when the request names neither."""
        if record.conversation_id:
            return (record.caller, "conversation", record.conversation_id)
        if record.source and record.source != "-":
            return (record.caller, "source", record.source)
        return None

    def __call__(self, record: DecisionRecord) -> None:
        if record.declines and self.policy.negatives:
            self._negatives(record)
        if not self.policy.enabled:
            return
        thread = self.thread(record)
        if thread is None:
            return
        if record.semantic_refused and record.status is Status.NO_AVAILABLE_HANDLER:
            self._refused[thread] = (record.task, self._clock.monotonic())
            self._refused.move_to_end(thread)
            while len(self._refused) > MAX_OPEN_REFUSALS:
                self._refused.popitem(last=False)
        elif record.status is Status.SUCCESS:
            # Never from a failed call: the refusal stays open for a later success instead.
            phrase = self._confirmed(thread, record)
            if phrase is not None:
                self._background.spawn(self._remember(phrase, record), "remember")

    def _confirmed(self, thread: Thread, record: DecisionRecord) -> str | None:
        """The refused phrase a successful ``record`` confirms, if it confirms one."""
        open_refusal = self._refused.get(thread)
        if open_refusal is None:
            return None
        phrase, at = open_refusal
        if self._clock.monotonic() - at > self.policy.window_seconds:
            del self._refused[thread]
            return None
        task = record.matched_task
        if record.rule not in _EXPLICIT or task is None or task != record.task or task == phrase:
            return None
        if any(fnmatchcase(task, glob) for glob in record.caller_serves):
            # An agent token naming its own task: a confirmation no one else made.
            del self._refused[thread]
            return None
        del self._refused[thread]
        return phrase

    def _negatives(self, record: DecisionRecord) -> None:
        """The agents found by meaning that declined this phrase: each one's own negative (even
        when another agent of its task took the phrase: that one is not kept off it)."""
        if record.semantic is None or record.narrowed:
            return  # an exact task route, or a caller who picked its own candidates
        now = self._clock.time()
        for agent_id, task in dict.fromkeys(record.declines):
            entry = self.registry.get(agent_id)
            if entry is None:
                continue
            route = LearnedRoute(
                record.task,
                task,
                "decline",
                now,
                agent=agent_id,
                lease=entry.lease_tag,
                by=record.caller,
                expires=now + self.policy.negative_ttl_seconds,
            )
            self._background.spawn(self._remember_negative(route), "negative")

    async def _remember_negative(self, route: LearnedRoute) -> None:
        policy = self.policy
        try:
            await self.registry.remember_negative(
                route, limit=policy.max_negatives, quota=_quota(route, policy.negatives_per_token)
            )
        except RegistryError as exc:
            log.warning(
                "[learning] could not remember %r -/-> %s: %s",
                loggable(route.phrase),
                route.task,
                exc.message,
            )
            return
        log.info(
            "[learning] learned %r is not for %s on %s (declined)",
            loggable(route.phrase),
            route.task,
            route.agent,
        )

    async def _remember(self, phrase: str, record: DecisionRecord) -> None:
        task, policy = record.matched_task, self.policy
        assert task is not None
        held = policy.scope == "operator"
        # While auth is off every caller is the same one ("-"): its route is everyone's.
        owner = None if held or record.caller == "-" else record.caller
        route = LearnedRoute(
            phrase, task, "caller", self._clock.time(), owner=owner, pending=held, by=record.caller
        )
        known = self.registry.learned().get(route.key)
        if held and known is not None and not known.pending:
            return  # an operator's route stands; a caller's confirmation never replaces it
        try:
            await self.registry.remember(
                route, limit=policy.max_phrases, quota=_quota(route, policy.phrases_per_token)
            )
        except RegistryError as exc:
            log.warning("[learning] could not remember %r -> %s: %s", loggable(phrase), task, exc.message)
            return
        self.learned += 1
        how = "held for an operator" if held else "for that caller"
        log.info("[learning] learned %r -> %s (a caller's confirmed retry, %s)", loggable(phrase), task, how)

    async def close(self) -> None:
        await self._background.close()


def _quota(route: LearnedRoute, quota: int) -> int | None:
    """The per-token quota for what ``route.by`` made; none while auth is off (one principal,
    "-", whom the overall bound already holds)."""
    return None if route.by == "-" else quota
