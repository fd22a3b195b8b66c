"""Near-duplicate capabilities: one token's capability worded like another token's.

Routing by meaning sends a phrase to the task whose texts it is nearest; a tenant who copies
another's description and examples under its own task name competes for that tenant's callers
(and their payloads). Each capability is compared, as its vectors arrive, with the indexed
capabilities of agents registered by other tokens: when most of its texts have a row at
``embedding.duplicate_similarity`` or closer in one other task, it is a near-duplicate of that
task. ``embedding.duplicates`` says what follows: ``flag`` shows it in ``/admin/agents`` and the
admin page, ``refuse`` also keeps the capability out of routes by meaning (its exact task name
still routes to it, as the token's task globs allow).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reachmesh.semantic.index import SemanticIndex, Vector


@dataclass(frozen=True, slots=True)
class NearDuplicate:
    """One capability of an agent that nearly repeats another token's task."""

    task: str
    of: str  # the other task
    similarity: float  # the closest cosine between their texts
    share: float  # the share of this capability's texts with a row that close in the other
    refused: bool  # kept out of routes by meaning

    def to_json(self) -> dict[str, object]:
        return {
            "task": self.task,
            "of": self.of,
            "similarity": round(self.similarity, 4),
            "share": round(self.share, 3),
            "refused": self.refused,
        }


def near_duplicate(
    index: SemanticIndex,
    task: str,
    rows: Vector,
    holder: str | None,
    holder_of: Callable[[str], str | None],
    similarity: float,
) -> tuple[str, float, float] | None:
    """The other token's task that ``task``'s ``rows`` most repeat, with the closest cosine and
    the share of rows; None when none does for most of them. ``holder`` is the registering
    token; a task any of whose agents that same token registered is its own, never a duplicate."""
    if holder is None or len(rows) == 0:
        return None  # auth off: one principal, no other token to copy from
    found = index.close_tasks(rows, similarity)
    best: tuple[str, float, float] | None = None
    for other, (count, closest) in found.items():
        share = count / len(rows)
        if other == task or share < 0.5:
            continue
        holders = {holder_of(agent) for agent in index.declaring(other)}
        if holder in holders:
            continue
        if best is None or (share, closest) > (best[2], best[1]):
            best = (other, closest, share)
    return best


__all__ = ["NearDuplicate", "near_duplicate"]
