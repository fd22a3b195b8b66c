"""The compose deployment agrees with the code: variables it sets are read, commands exist, ports meet.

There is no container engine here, so nothing is started; instead every fact the containers
would depend on is checked against the code that would run in them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from reachmesh.cli.agentapp import load_app
from reachmesh.cli.main import app
from reachmesh.config import RouterConfig
from reachmesh.sdk.agent import callback_trap
from reachmesh.sdk.config import AgentConfig

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Services that run someone else's image, not `reach`.
THIRD_PARTY = {"etcd", "prometheus", "grafana"}
# What the Dockerfile does: the repository is copied to /app.
IN_IMAGE = {"/app": ROOT}


def variables_the_code_reads() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "src" / "reachmesh").rglob("*.py"):
        found |= set(re.findall(r"\"(REACH_[A-Z_]+)\"", path.read_text()))
    return found


def on_host(path: str) -> Path:
    for inside, outside in IN_IMAGE.items():
        if path.startswith(inside + "/"):
            return outside / path[len(inside) + 1 :]
    raise AssertionError(f"{path} is not inside the image's /app")


def command_of(service: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The click command a service runs and its parsed options (as the CLI would parse them)."""
    argv = service["command"]
    assert argv[0] == "reach", argv
    group = typer.main.get_command(app)
    command = group.commands.get(argv[1])  # type: ignore[attr-defined]
    assert command is not None, f"no `reach {argv[1]}` command"
    context = command.make_context(f"reach {argv[1]}", list(argv[2:]), resilient_parsing=False)
    return command, context.params


def env_of(service: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def test_the_reference_services_are_there():
    """etcd (3.5), reach-router on 7200, the embedding service, and the demo agents."""
    assert {"etcd", "reach-router", "embedding-service", "price-query-agent", "promotion-agent"} <= set(
        SERVICES
    )
    assert re.search(r"etcd:v3\.5\.", SERVICES["etcd"]["image"])
    assert "127.0.0.1:7200:7200" in SERVICES["reach-router"]["ports"]  # loopback: auth is off


def test_every_reach_variable_the_compose_file_sets_is_read_by_the_code():
    """A misspelt REACH_* variable would be silently ignored in a container."""
    known = variables_the_code_reads()
    for name, service in SERVICES.items():
        for key in env_of(service):
            assert key in known, f"{name} sets {key}, which nothing reads"


def test_every_command_exists_and_parses():
    """Each service's command is a real `reach` subcommand with options it accepts."""
    for name, service in SERVICES.items():
        if name in THIRD_PARTY:
            continue
        command, params = command_of(service)
        assert command.name, name
        assert params is not None


def test_the_router_listens_where_the_others_look_and_reads_its_policy():
    """The Router's port, etcd's client port and the embedding service's port all line up."""
    _, router = command_of(SERVICES["reach-router"])
    assert router["host"] == "0.0.0.0" and router["port"] == 7200
    RouterConfig.load(on_host(str(router["config"])))  # the mounted policy validates
    env = env_of(SERVICES["reach-router"])
    etcd_listen = next(a for a in SERVICES["etcd"]["command"] if a.startswith("--listen-client-urls="))
    assert env["REACH_ETCD_ENDPOINTS"] == f"etcd:{urlsplit(etcd_listen.split('=', 1)[1]).port}"
    _, embed = command_of(SERVICES["embedding-service"])
    embedding_url = urlsplit(env["REACH_EMBEDDING_URL"])
    assert (embedding_url.hostname, embedding_url.port) == ("embedding-service", embed["port"])
    assert embed["host"] == "0.0.0.0"


@pytest.mark.parametrize("name", ["price-query-agent", "promotion-agent"])
def test_each_agent_binds_what_it_announces_and_the_router_can_reach_it(name):
    """Config + environment as the SDK reads them: service-name callback, port bound, no trap."""
    service = SERVICES[name]
    _, params = command_of(service)
    env = env_of(service)
    config = AgentConfig.load(on_host(str(params["config"])), env=env)
    assert config.profile.id == env["REACH_SELF_ID"] == name
    callback = urlsplit(config.profile.network.endpoint)
    assert callback.hostname == name  # a service name, never localhost
    assert config.port == callback.port  # the SDK listens on the port it announces
    assert params["host"] == "0.0.0.0"  # and on the container's network, not its loopback
    assert config.profile.health_check.port == int(env["REACH_HEALTH_PORT"])
    router = urlsplit(config.router_url)
    assert (router.hostname, router.port) == ("reach-router", 7200)
    assert callback_trap(config.profile.network.endpoint, config.router_url) is None
    load_app(str(params["app_spec"]))  # the app spec imports from the installed package


def test_the_dockerfile_installs_the_package_and_starts_a_router():
    """The image copies what pyproject needs and runs `reach router` on 7200 by default."""
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY src ./src" in text and "pip install '.[router]'" in text
    assert 'CMD ["reach", "router", "--host", "0.0.0.0", "--port", "7200"]' in text


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_accepts_the_file():
    """Debian's docker-compose parses and validates the file offline."""
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
