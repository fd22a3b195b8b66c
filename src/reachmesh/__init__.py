"""Agent-Reach: the communication layer for multi-agent systems.

A Router keeps a leased registry of agents and forwards each ReachRequest to the agent that
should handle it; the SDK (:mod:`reachmesh.sdk`) registers agents and calls through it.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
