"""The ranking contract shared by every strategy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from reachmesh.protocol import Capability
from reachmesh.registry.base import AgentEntry
from reachmesh.schema import PayloadValidator


@dataclass(slots=True)
class Choice:
    """One ranked candidate: the agent, the capability it serves the task with, and its score."""

    entry: AgentEntry
    capability: Capability
    validator: PayloadValidator | None
    score: float | None = None
    # A candidate of a runner-up task by meaning: tried only right after a decline, never as a
    # failover from an agent that failed.
    on_decline: bool = False

    @classmethod
    def of(cls, entry: AgentEntry, task: str, score: float | None = None) -> Choice:
        return cls(entry, entry.capabilities[task], entry.validators[task], score)


@dataclass(slots=True)
class Ranking:
    """A ranker's answer: the choices, best first, and why (one explanation per candidate)."""

    choices: list[Choice]
    explain: list[dict[str, Any]] = field(default_factory=list)


class Ranker(Protocol):
    """Orders the eligible agents for a task, best first. Must not drop any of them.

    ``similarity`` is the semantic score of the task, when the task was found by meaning.
    """

    name: str

    def rank(self, task: str, entries: list[AgentEntry], similarity: float | None = None) -> Ranking: ...
