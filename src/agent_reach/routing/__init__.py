"""Choosing agents: the pipeline (candidates, filters, rank) and its ranking strategies.

Nothing here does I/O or knows HTTP; the dispatcher runs the attempts.
"""

from agent_reach.routing.base import Choice, Ranker
from agent_reach.routing.exact import ExactMatch
from agent_reach.routing.pipeline import Pipeline

__all__ = ["Choice", "ExactMatch", "Pipeline", "Ranker"]
