"""Choosing agents: the pipeline (candidates, filters, rank) and its ranking strategies.

Nothing here does I/O or knows HTTP; the dispatcher runs the attempts.
"""

from reachmesh.routing.base import Choice, Ranker
from reachmesh.routing.exact import ExactMatch
from reachmesh.routing.pipeline import Pipeline

__all__ = ["Choice", "ExactMatch", "Pipeline", "Ranker"]
