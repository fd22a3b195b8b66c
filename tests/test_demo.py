"""`reach demo` from the repository: the Router and both demo agents in one command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from reachmesh.testing import free_port
from tests.helpers import scaled
from tests.procs import exit_code_within

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_demo_runs_the_reference_session(tmp_path: Path) -> None:
    """The demo comes up, answers the §3 call, and stops cleanly on Ctrl-C with agents deregistered."""
    # --free-ports: the agents' fixed ports (7301/7311) may be held by a `make demo` running beside.
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reachmesh", "demo", "--port", str(port), "--free-ports"],
            # Any folder: the demo's agents and policy ship inside the package.
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            end = time.monotonic() + scaled(30)
            while "demo is up" not in log.read_text() and time.monotonic() < end:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            assert "demo is up" in log.read_text(), log.read_text()
            url = f"http://127.0.0.1:{port}"
            rows = httpx.get(f"{url}/admin/agents").json()
            assert {r["id"]: r["status"] for r in rows} == {
                "price-query-agent": "available",
                "promotion-agent": "available",
            }
            assert not {r["endpoint"] for r in rows} & {
                "http://127.0.0.1:7301/reach",
                "http://127.0.0.1:7311/reach",
            }
            body = httpx.post(
                f"{url}/reach",
                json={
                    "traceId": "trace-demo-001",
                    "sourceAgent": "user-proxy",
                    "targetTask": "query_product_price",
                    "payload": {"product_id": "SKU-88231", "currency": "CNY"},
                },
            ).json()
            assert body["status"] == "SUCCESS"
            assert body["result"]["price"] == 199.9
        finally:
            proc.send_signal(signal.SIGINT)
            code = exit_code_within(proc, 20)
        assert code == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert "[trace-demo-001] select price-query-agent by exact_match" in text
    assert "[reach-client] deregistered agent: price-query-agent" in text
    assert "[reach-client] deregistered agent: promotion-agent" in text


@pytest.mark.etcd
def test_demo_with_etcd_runs_two_routers_over_one_registry(tmp_path: Path) -> None:
    """`reach demo --etcd`: both Routers route the demo call; one Ctrl-C stops all, etcd last."""
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reachmesh", "demo", "--etcd", "--port", str(port), "--free-ports"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            end = time.monotonic() + scaled(90)
            while "demo is up" not in log.read_text() and time.monotonic() < end:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            text = log.read_text()
            assert "demo is up" in text, text
            second = text.split("Second Router at ", 1)[1].split(",", 1)[0]
            for url in (f"http://127.0.0.1:{port}", second):
                body = httpx.post(
                    f"{url}/reach",
                    json={"targetTask": "query_product_price", "payload": {"product_id": "SKU-88231"}},
                    timeout=scaled(10),
                ).json()
                assert body["status"] == "SUCCESS", body
        finally:
            proc.send_signal(signal.SIGINT)
            code = exit_code_within(proc, 30)
        assert code == 0, log.read_text()[-2000:]
    text = log.read_text()
    # The agents deregistered through a Router that still reached etcd: stopped before etcd.
    assert "[reach-client] deregistered agent: price-query-agent" in text
    assert "[reach-client] deregistered agent: promotion-agent" in text
    assert "Traceback" not in text


def test_demo_on_a_taken_port_says_so_and_fails(tmp_path: Path) -> None:
    """A Router port already in use: one line naming it and a non-zero exit, never "demo is up"."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "reachmesh", "demo", "--port", str(port), "--free-ports"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"port {port}" in text and "is taken" in text
    assert "demo is up" not in text and "Traceback" not in text
