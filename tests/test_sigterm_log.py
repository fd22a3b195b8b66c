"""The Router says in its log that a SIGTERM arrived and that it stopped (a real process)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import yaml

from reachmesh.testing import free_port
from tests.helpers import scaled
from tests.procs import Proc, wait_for


@pytest.mark.e2e
def test_sigterm_is_a_line_in_the_log_and_so_is_the_stop(tmp_path: Path) -> None:
    port = free_port()
    policy = tmp_path / "router.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "server": {"drain_timeout_seconds": 2},
                "embedding": {"backend": "none"},
                "health": {"enabled": False},
            }
        )
    )
    router = Proc(["router", "--port", str(port), "--config", str(policy)], tmp_path / "router.log")
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200, timeout=20)
        router.signal(signal.SIGTERM)
        router.popen.wait(scaled(15))
    finally:
        router.stop()
    log = router.text()
    assert "[router] SIGTERM received: draining for up to 2 s, then stopping" in log, log[-2000:]
    assert "[router] stopped" in log, log[-2000:]
    assert log.index("SIGTERM received") < log.index("[router] stopped")
