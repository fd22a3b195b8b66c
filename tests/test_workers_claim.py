"""A port claimed by one `reach router --workers` supervisor cannot be joined by a second, and
the claim never follows a path someone else prepared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reachmesh.cli.workers import PortClaimed, claim_port
from reachmesh.exceptions import ConfigError


def test_a_second_claim_on_a_port_names_the_holder_and_a_freed_port_can_be_claimed(tmp_path: Path) -> None:
    """The first claim holds; a second is refused naming the holder's pid; once the first is
    released, the port can be claimed again, and another port never conflicts."""
    folder = tmp_path / "locks"
    first = claim_port(7399, folder)
    try:
        with pytest.raises(PortClaimed, match=rf"port 7399 is already served .*\(pid {os.getpid()}\)"):
            claim_port(7399, folder)
        claim_port(7400, folder).close()
    finally:
        first.close()
    claim_port(7399, folder).close()
    assert oct(os.stat(folder).st_mode & 0o777) == oct(0o700)


def test_a_folder_others_may_write_or_a_symlinked_lock_is_refused(tmp_path: Path) -> None:
    """A lock folder open to others, a lock file that is a symlink, or a file where the folder
    should be: a one-line ConfigError, and the symlink's target is left as it was."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="is not a private folder of this user"):
        claim_port(7399, shared)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (private / "router-port-7399.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"cannot claim port 7399: .*router-port-7399\.lock"):
        claim_port(7399, private)
    assert victim.read_text() == "precious"
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(ConfigError, match="cannot claim port 7399"):
        claim_port(7399, not_a_folder)
