"""Every expected failure of the command line is one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from reachmesh.testing import BackgroundLoop, RouterServer, free_port
from tests.helpers import scaled

AGENT_PY = """
from reachmesh import ReachAgent

agent = ReachAgent()


@agent.capability("echo")
async def echo(payload: dict) -> dict:
    return payload
"""


def reach(*args: str, cwd: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "REACH_ROUTER_URL": f"http://127.0.0.1:{free_port()}"}
    return subprocess.run(
        [sys.executable, "-m", "reachmesh", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )


def agent_config(tmp_path: Path, agent_id: str = "echo-agent", port: int | None = None) -> Path:
    port = port or free_port()
    config = {
        "agent": {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
            "capabilities": [{"task": "echo"}],
            "health_check": {"port": free_port()},
        }
    }
    path = tmp_path / "reach_config.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    (tmp_path / "my_agent.py").write_text(AGENT_PY)
    return path


def one_line_failure(result: subprocess.CompletedProcess[str]) -> str:
    """The failure's text, after checking it is short, non-zero and free of tracebacks."""
    text = (result.stdout + result.stderr).strip()
    assert result.returncode != 0, text
    assert "Traceback" not in text and "╭─" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


def test_a_missing_attribute_is_named(tmp_path: Path) -> None:
    """--app my_agent.py:nope says the module has no attribute 'nope'."""
    config = agent_config(tmp_path)
    line = one_line_failure(
        reach("agent", "--config", str(config), "--app", "my_agent.py:nope", cwd=tmp_path)
    )
    assert "no attribute 'nope'" in line


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    """--app gone.py:agent says there is no such file."""
    config = agent_config(tmp_path)
    line = one_line_failure(reach("agent", "--config", str(config), "--app", "gone.py:agent", cwd=tmp_path))
    assert "no such file 'gone.py'" in line


@pytest.mark.parametrize("spec", ["broken.py:agent", "broken:agent"])
def test_a_syntax_error_in_the_app_is_one_line_naming_file_and_line(tmp_path: Path, spec: str) -> None:
    """A typo in the agent's own file is named (file, line, what) as an import error is, not a
    traceback box through reach's loader (the user's file was in none of its frames)."""
    config = agent_config(tmp_path)
    (tmp_path / "broken.py").write_text("from reachmesh import ReachAgent\n\nagent = ReachAgent(\n")
    line = one_line_failure(reach("agent", "--config", str(config), "--app", spec, cwd=tmp_path))
    assert "broken.py" in line and "line 3" in line, line


def test_a_bad_agent_id_prints_its_rule_with_brackets(tmp_path: Path) -> None:
    """An invalid id names the rule in full: the brackets are not eaten as markup."""
    config = agent_config(tmp_path, agent_id="Bad Id!")
    line = one_line_failure(
        reach("agent", "--config", str(config), "--app", "my_agent.py:agent", cwd=tmp_path)
    )
    assert "agent.id" in line
    assert "[a-z0-9]" in line


def test_a_taken_port_is_one_line_for_an_agent(tmp_path: Path) -> None:
    """An agent whose callback port is in use says so in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = agent_config(tmp_path, port=taken.getsockname()[1])
        line = one_line_failure(
            reach("agent", "--config", str(config), "--app", "my_agent.py:agent", cwd=tmp_path)
        )
    assert "could not start" in line and "in use" in line


def test_a_taken_port_stops_the_router_before_it_says_it_listens(tmp_path: Path) -> None:
    """A Router whose port is in use exits non-zero, without claiming to listen, without a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = reach("router", "--port", str(port), cwd=tmp_path)
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "listening on" not in text
    assert "Traceback" not in text
    # The project's one error line, not uvicorn's "ERROR: [Errno 98] ..." record.
    assert f"error: cannot bind 127.0.0.1:{port}: address already in use" in text
    assert "Errno" not in text and "ERROR" not in text


def test_a_bad_policy_file_is_one_line(tmp_path: Path) -> None:
    """reach router --config with a wrong value names the key."""
    bad = tmp_path / "router.yaml"
    bad.write_text("limits: {max_inflight: -1}\n")
    line = one_line_failure(reach("router", "--config", str(bad), cwd=tmp_path))
    assert "limits.max_inflight" in line


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    """reach agent without a reach_config.yaml says where it looked."""
    (tmp_path / "my_agent.py").write_text(AGENT_PY)
    line = one_line_failure(reach("agent", "--app", "my_agent.py:agent", cwd=tmp_path))
    assert "reach_config.yaml" in line


@pytest.mark.parametrize("args", [["agents"], ["call", "echo"], ["trace", "t-1"]])
def test_a_router_out_of_reach_is_one_line(tmp_path: Path, args: list[str]) -> None:
    """agents, call and trace against a Router nobody runs: one line, exit 1."""
    result = reach(*args, cwd=tmp_path)
    line = one_line_failure(result)
    assert result.returncode == 1
    assert "127.0.0.1" in line


@pytest.fixture
def background() -> Iterator[BackgroundLoop]:
    """An event loop on a thread, for a Router the CLI subprocesses talk to."""
    with BackgroundLoop() as bg:
        yield bg


@pytest.mark.parametrize("args", [["agents"], ["agents", "--json"], ["trace", "t-1"]])
def test_a_router_that_refuses_the_token_is_one_line(
    tmp_path: Path, args: list[str], background: BackgroundLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agents and trace against a Router with auth on and no token: one line naming REACH_TOKEN."""
    monkeypatch.setenv("REACH_ADMIN_TOKEN", "cli-admin-token-3141")
    router: RouterServer = background.run(RouterServer().__aenter__())
    background.on_close(lambda: router.__aexit__(None, None, None))
    monkeypatch.delenv("REACH_ADMIN_TOKEN")
    env = {**os.environ, "COLUMNS": "80", "REACH_ROUTER_URL": router.url}
    env.pop("REACH_TOKEN", None)
    result = subprocess.run(
        [sys.executable, "-m", "reachmesh", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(20),
    )
    line = one_line_failure(result)
    assert result.returncode == 1
    assert "401" in line and "REACH_TOKEN" in line


def test_a_light_install_is_told_how_to_add_the_router_without_asking_pypi(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reach router` on an agent's light install names the extra to add where the package came
    from. It said `pip install 'reachmesh[router]'`, which asks PyPI, where reachmesh is not (the
    docs warn against exactly that line: the name there may be someone else's)."""
    import typer

    from reachmesh.cli import console

    monkeypatch.setattr(console, "_ROUTER_MODULES", ("reachmesh_no_such_module",))
    with pytest.raises(typer.Exit):
        console.need_router("reach router")
    line = " ".join(capsys.readouterr().err.split())
    assert "[router]" in line and "not on PyPI" in line, line
    assert "pip install 'reachmesh[router]'" not in line, line


@pytest.mark.parametrize(("origins", "warned"), [(["*"], True), (["http://page.example"], False)])
def test_a_router_open_to_every_page_with_auth_off_says_so(
    tmp_path: Path, origins: list[str], warned: bool
) -> None:
    """allowed_origins "*" with auth off lets any page a local browser opens drive the Router,
    loopback or not: the start says so (printed before the bind, so a taken port ends it)."""
    policy = tmp_path / "router.yaml"
    policy.write_text(yaml.safe_dump({"server": {"allowed_origins": origins}}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = reach("router", "--port", str(port), "--config", str(policy), cwd=tmp_path)
    text = result.stdout + result.stderr
    assert "cannot bind" in text, text
    assert ('admits every origin ("*") with auth off' in text) is warned, text
