"""The ``reach`` command line: the Router, agents, calls, traces, the demo and calibration."""

from reachmesh.cli.main import main

__all__ = ["main"]
