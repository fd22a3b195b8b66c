"""A port claimed by one `reach router --workers` supervisor cannot be joined by a second."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_reach.cli.workers import PortClaimed, claim_port


def test_a_second_claim_on_a_port_names_the_holder_and_a_freed_port_can_be_claimed(tmp_path: Path) -> None:
    """The first claim holds; a second is refused naming the holder's pid; once the first is
    released, the port can be claimed again, and another port never conflicts."""
    first = claim_port(7399, tmp_path)
    try:
        with pytest.raises(PortClaimed, match=rf"port 7399 is already served .*\(pid {os.getpid()}\)"):
            claim_port(7399, tmp_path)
        other = claim_port(7400, tmp_path)
        other.close()
    finally:
        first.close()
    again = claim_port(7399, tmp_path)
    again.close()
