"""The reach command line as a newcomer first meets it: --version, -h, help texts, table widths."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from reachmesh import __version__
from reachmesh.cli.main import app
from reachmesh.testing import free_port
from tests.procs import Proc, wait_for
from tests.test_cli import router_url  # noqa: F401 - the module's Router with two agents

runner = CliRunner()


def commands() -> Iterator[tuple[list[str], Any]]:
    """Every command and group of `reach`, with the words that invoke it."""
    root = typer.main.get_command(app)

    def walk(path: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        # A group by what it has (typer may bring its own click, whose classes are not click's).
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk([*path, name], sub)

    yield from walk([], root)


def test_version_flag_and_command_print_the_same_line() -> None:
    for args in (["--version"], ["version"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert result.output == f"reach (reachmesh) {__version__}\n"


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=lambda p: " ".join(p) or "reach")
def test_every_command_takes_dash_h(path: list[str]) -> None:
    """`-h` is `--help` on every command and group."""
    short = runner.invoke(app, [*path, "-h"])
    long = runner.invoke(app, [*path, "--help"])
    assert short.exit_code == 0, short.output
    assert short.output == long.output and "Usage: " in short.output
    assert "-h, --help" in short.output


def test_help_texts_write_defaults_and_variables_one_way() -> None:
    """As click writes the defaults it shows: `[default: X]`, `[env var: X]`, `[env var: X; default: Y]`."""
    bracket = re.compile(r"\[([^\]]*)\]")
    allowed = re.compile(r"^(env var: [A-Z_]+(; default: .+)?|default: .+)$")
    seen = 0
    for path, command in commands():
        for param in command.params:
            text = getattr(param, "help", None) or ""
            assert "(default" not in text, (path, param.name, text)
            for inside in bracket.findall(text):
                seen += 1
                assert allowed.match(inside), (path, param.name, text)
    assert seen >= 5  # the check found the texts it is about


@pytest.mark.parametrize("command", ["call", "agents", "trace"])
def test_commands_that_talk_to_the_router_name_reach_token(command: str) -> None:
    result = runner.invoke(app, [command, "-h"], env={"COLUMNS": "100"})
    assert "REACH_TOKEN" in result.output


def test_agents_piped_fits_80_columns(router_url: str) -> None:  # noqa: F811
    """Piped with no COLUMNS (CliRunner's output is no terminal): 80 columns, not 96 or 160."""
    result = runner.invoke(app, ["agents", "--router", router_url], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "price-query-agent" in result.output


def test_agents_wide_never_breaks_an_endpoint(router_url: str) -> None:  # noqa: F811
    """--wide in a narrow terminal: every endpoint stays whole on one line, to be copied."""
    import httpx

    endpoints = [row["endpoint"] for row in httpx.get(f"{router_url}/admin/agents").json()]
    result = runner.invoke(app, ["agents", "--router", router_url, "--wide"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    for endpoint in endpoints:
        assert endpoint in result.output
    assert "ENDPOINT" in result.output and "INFLIGHT" in result.output


@pytest.mark.parametrize(
    ("env", "said"), [({"REACH_ADMIN_TOKEN": "admin-token-for-the-start-line"}, "auth on"), ({}, "auth off")]
)
def test_the_routers_start_line_says_whether_auth_is_on(
    tmp_path: Path, env: dict[str, str], said: str
) -> None:
    """The line an operator reads first tells them whether requests need a bearer token."""
    policy = tmp_path / "router.yaml"
    policy.write_text("embedding:\n  backend: none\n")
    clean = {
        k: "" for k in ("REACH_ADMIN_TOKEN", "REACH_AGENT_TOKEN", "REACH_CALLER_TOKEN", "REACH_TOKENS_FILE")
    }
    proc = Proc(
        ["router", "--port", str(free_port()), "--config", str(policy)],
        tmp_path / "router.log",
        {**clean, **env},
    )
    try:
        line = wait_for(
            lambda: next((x for x in proc.text().splitlines() if "listening on" in x), None), timeout=60
        )
        assert said in line, line
    finally:
        proc.stop()


def test_the_command_line_starts_without_the_drills_or_numpy() -> None:
    """`reach` loads aiohttp, matplotlib and numpy only for the commands that use them (a drill,
    a calibration, a Router with an embedder): every other command starts about twice as fast."""
    probe = (
        "import sys, reachmesh.cli.main; print(sorted({'aiohttp', 'matplotlib', 'numpy'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
