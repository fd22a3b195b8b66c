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
            # The hint the demo prints works as a user pastes it, from where the demo was started.
            hint = next(line for line in log.read_text().splitlines() if " call query_product_price " in line)
            command = hint.split("Try:")[-1].strip()
            tried = subprocess.run(
                command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60
            )
            assert tried.returncode == 0, (command, tried.stdout, tried.stderr)
            assert '"status": "SUCCESS"' in tried.stdout
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


def test_a_port_left_in_time_wait_is_free_for_the_next_demo() -> None:
    """Ctrl-C then `make demo` again: the ports' old connections linger in TIME-WAIT, and the
    pre-flight check binds as the servers do (SO_REUSEADDR), so it lets the demo start; a port
    something listens on is still refused."""
    import errno
    import socket

    import pytest

    from reachmesh.cli.demo import _check_ports_free
    from reachmesh.exceptions import ConfigError

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server's side closes first, so its port is the one left in TIME-WAIT
        client.recv(1)
        client.close()
    with socket.socket() as plain, pytest.raises(OSError) as taken:
        plain.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE  # the state the demo met: TIME-WAIT only
    _check_ports_free(port, {}, free_ports=True)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(ConfigError, match=f"port {port}, for the Router"):
            _check_ports_free(port, {}, free_ports=True)


def test_the_demo_names_reach_as_the_shell_will_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`reach` when PATH leads to this very command; else its path, relative under the working
    directory (`.venv/bin/reach` after `make demo`); either way it runs as printed."""
    from reachmesh.cli.demo import reach_command

    here = Path(sys.executable).parent / "reach"
    assert here.is_file()
    venv = here.parent.parent
    monkeypatch.chdir(venv.parent)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    named = reach_command()
    assert named == f"{venv.name}/bin/reach"
    ran = subprocess.run(f"{named} --version", shell=True, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.startswith("reach (reachmesh) "), ran
    monkeypatch.setenv("PATH", f"{here.parent}:/usr/bin:/bin")
    assert reach_command() == "reach"
