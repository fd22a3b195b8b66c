"""The suite's process helpers: a process is owned from its spawn, and a failed start says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.procs import LIVE, Drill


def test_a_router_that_cannot_start_is_reported_at_once_and_stopped(tmp_path: Path) -> None:
    """A Drill whose Router exits during start-up fails with the Router's own words, not a
    timeout, and leaves no process behind (the spawn was owned before the wait began)."""
    with pytest.raises(AssertionError, match=r"exited with .*limits\.max_inflight"):
        Drill(tmp_path, {"limits": {"max_inflight": -1}})
    # Stopped by the Drill itself (Proc.stop takes it out of LIVE), not left to the reaper.
    assert not [proc for proc in LIVE if tmp_path in proc.log.parents]
