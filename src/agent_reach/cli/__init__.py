"""The ``reach`` command line: the Router, agents, calls, traces, the demo and calibration."""

from agent_reach.cli.main import main

__all__ = ["main"]
