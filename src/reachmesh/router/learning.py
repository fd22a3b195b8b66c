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

A decline teaches the opposite: when a capability found by meaning declined the phrase (and the
request did not end handled by that same capability), the Router remembers (phrase, task) as a
learned negative (``routing.learning.negatives``, on by default), and routes by meaning keep that
phrase off that task from then on, on every Router sharing the registry.

This is an :class:`~reachmesh.record.Observer`: it reads finished decision records and never
sits on the request path; the registry write runs in the background.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import LearningPolicy
from reachmesh.exceptions import RegistryError
from reachmesh.lifecycle import Background
from reachmesh.protocol import Status
from reachmesh.record import DecisionRecord
from reachmesh.registry.base import Registry
from reachmesh.secrets import loggable

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
                assert record.matched_task is not None
                self._background.spawn(self._remember(phrase, record.matched_task), "remember")

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
        del self._refused[thread]
        return phrase

    def _negatives(self, record: DecisionRecord) -> None:
        """The capabilities found by meaning that declined this phrase, and did not take it."""
        if record.semantic is None:
            return  # an exact task route: the phrase is a task name, nothing to keep off it
        took = record.matched_task if record.status is Status.SUCCESS else None
        for task in dict.fromkeys(task for _, task in record.declines):
            if task != took:
                self._background.spawn(self._remember_negative(record.task, task), "negative")

    async def _remember_negative(self, phrase: str, task: str) -> None:
        try:
            await self.registry.remember_negative(phrase, task, "decline", limit=self.policy.max_negatives)
        except RegistryError as exc:
            log.warning("[learning] could not remember %r -/-> %s: %s", loggable(phrase), task, exc.message)
            return
        log.info("[learning] learned %r is not for %s (declined)", loggable(phrase), task)

    async def _remember(self, phrase: str, task: str) -> None:
        try:
            await self.registry.remember(phrase, task, "caller", limit=self.policy.max_phrases)
        except RegistryError as exc:
            log.warning("[learning] could not remember %r -> %s: %s", loggable(phrase), task, exc.message)
            return
        self.learned += 1
        log.info("[learning] learned %r -> %s (a caller's confirmed retry)", loggable(phrase), task)

    async def close(self) -> None:
        await self._background.close()
