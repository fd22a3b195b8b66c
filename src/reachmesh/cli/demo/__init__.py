"""``reach demo``: the Router and the two demo agents as real processes, with one merged log.

The demo agents and the Router's policy ship inside this package (``price_agent/``,
``promotion_agent/``, ``router.yaml``), so ``reach demo`` works from any folder wherever the
``reachmesh`` distribution is installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import httpx

from reachmesh.exceptions import ConfigError
from reachmesh.ports import free_port

# The packaged demo: the agents' code and configs, and the Router's policy.
DEMO_DIR = Path(__file__).resolve().parent
AGENTS = [("price-query-agent", "price_agent"), ("promotion-agent", "promotion_agent")]
COLOURS = {"router": "\033[36m", "price-query-agent": "\033[32m", "promotion-agent": "\033[35m"}
RESET = "\033[0m"
SAMPLE_PAYLOAD = '{"product_id": "SKU-88231", "currency": "CNY"}'


def _pump(name: str, stream: IO[str], lock: threading.Lock) -> None:
    colour = COLOURS.get(name, "") if sys.stdout.isatty() else ""
    reset = RESET if colour else ""
    for line in stream:
        with lock:
            sys.stdout.write(f"{colour}{name:>18} |{reset} {line}")
            sys.stdout.flush()


def _spawn(name: str, args: list[str], env: dict[str, str], lock: threading.Lock) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reachmesh", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    assert proc.stdout is not None
    threading.Thread(target=_pump, args=(name, proc.stdout, lock), daemon=True).start()
    return proc


def _wait_ready(url: str, want: set[str], procs: list[subprocess.Popen[str]], limit_s: float = 30) -> bool:
    """Poll the registry until every agent in ``want`` is available, or a process dies."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if any(p.poll() is not None for p in procs):
            return False
        try:
            rows = httpx.get(f"{url}/admin/agents", timeout=1).json()
            if want <= {r["id"] for r in rows if r.get("status") == "available"}:
                return True
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.2)
    return False


def _agent_env(env: dict[str, str], free_ports: bool) -> dict[str, str]:
    """An agent's environment; with ``free_ports`` its callback and health ports are free ones."""
    if not free_ports:
        return env
    return {
        **env,
        "REACH_CALLBACK_URL": f"http://127.0.0.1:{free_port()}/reach",
        "REACH_HEALTH_PORT": str(free_port()),
    }


def run_demo(port: int, examples: Path, *, free_ports: bool = False, etcd: bool = False) -> None:
    """Start everything, print how to try it, and stop everything on Ctrl-C or SIGTERM.

    ``free_ports`` moves the agents off their configs' fixed ports (7301/7302, 7311/7312), which
    a running ``make demo`` holds, through the SDK's REACH_CALLBACK_URL and REACH_HEALTH_PORT.
    ``etcd`` runs the shared topology as processes: an etcd member, the embedding service, and
    two Routers over them (the agents register with the first; both route to them).
    """
    configs = {name: examples / folder / "reach_config.yaml" for name, folder in AGENTS}
    missing = [str(p) for p in configs.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"demo files not found: {', '.join(missing)} (check --examples)")
    _check_ports_free(port, configs, free_ports)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "REACH_ROUTER_URL": url, "PYTHONUNBUFFERED": "1"}
    lock = threading.Lock()
    with contextlib.ExitStack() as stack:
        urls = [url]
        if etcd:
            urls.append(f"http://127.0.0.1:{free_port()}")
            env.update(_shared_services(stack, env, lock))
        router_args = (
            ["--config", str(examples / "router.yaml")] if (examples / "router.yaml").is_file() else []
        )
        procs = [
            _spawn(
                "router" if i == 0 else f"router-{i + 1}",
                ["router", "--port", u.rsplit(":", 1)[1], *router_args],
                env,
                lock,
            )
            for i, u in enumerate(urls)
        ]
        # Agents start once the Router answers, so none opens with "Router unreachable, retrying".
        # A Router that cannot start is reported by _run_until_stopped below.
        with contextlib.suppress(ConfigError):
            _wait_healthy(f"{url}/healthz", procs[0], "the Router")
        for name, folder in AGENTS:
            args = [
                "agent",
                "--config",
                str(configs[name]),
                "--app",
                str(examples / folder / "agent.py") + ":agent",
            ]
            procs.append(_spawn(name, args, _agent_env(env, free_ports), lock))
        if not _run_until_stopped(urls, procs, lock, len(urls)):
            raise ConfigError("the demo stopped: a process could not start or ended (see its lines above)")


def _shared_services(
    stack: contextlib.ExitStack, env: dict[str, str], lock: threading.Lock
) -> dict[str, str]:
    """Start etcd and the embedding service for ``--etcd``; their addresses as Router environment."""
    from reachmesh.cli.etcd import EtcdCluster

    data = Path(tempfile.mkdtemp(prefix="reach-demo-etcd-"))
    stack.callback(shutil.rmtree, data, True)
    cluster = EtcdCluster(data, 1).start()
    stack.callback(cluster.stop)  # last out: the Routers and agents stop before it
    embed_port = free_port()
    embedder = _spawn("embedding", ["embed-server", "--port", str(embed_port)], env, lock)
    stack.callback(_stop, embedder)
    # The Routers start once it answers: otherwise each warns that its embedder failed.
    _wait_healthy(f"http://127.0.0.1:{embed_port}/healthz", embedder, "the embedding service")
    with lock:
        print(f"  etcd at {cluster.endpoints}; embedding service on port {embed_port}", flush=True)
    return {
        "REACH_ETCD_ENDPOINTS": cluster.endpoints,
        "REACH_EMBEDDING_URL": f"http://127.0.0.1:{embed_port}",
    }


def _wait_healthy(url: str, proc: subprocess.Popen[str], what: str, limit_s: float = 60) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise ConfigError(f"{what} did not answer at {url} (see its lines above)")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def _check_ports_free(port: int, configs: dict[str, Path], free_ports: bool) -> None:
    """Refuse to start on a taken port: the demo would otherwise find another Router there and
    say it is up while its own processes fail to bind."""
    from reachmesh.sdk.config import AgentConfig

    wanted = {port: "the Router (--port)"}
    if not free_ports:
        for name, path in configs.items():
            config = AgentConfig.load(path, env={})
            wanted[config.port] = f"{name} (--free-ports moves it)"
            if config.profile.health_check.port:
                wanted[config.profile.health_check.port] = f"{name}'s health port (--free-ports moves it)"
    for number, who in wanted.items():
        with socket.socket() as probe:
            # As the Router and the agents bind: a port whose last connections linger in TIME-WAIT
            # (the demo stopped a moment ago) is free for them, and so for this check.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", number))
            except OSError as exc:
                raise ConfigError(f"port {number}, for {who}, is taken: {exc.strerror or exc}") from exc


def reach_command() -> str:
    """How to run this ``reach`` from the user's shell: ``reach`` when that name on PATH is this
    very command, else its path (relative when it is under the working directory, as
    ``.venv/bin/reach`` is after ``make demo``), so the hints the demo prints work as typed."""
    here = Path(sys.executable).parent / "reach"
    if not here.is_file():
        return f"{sys.executable} -m reachmesh"
    found = shutil.which("reach")
    if found is not None and Path(found).resolve() == here.resolve():
        return "reach"
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


def _run_until_stopped(
    urls: list[str], procs: list[subprocess.Popen[str]], lock: threading.Lock, routers: int
) -> bool:
    """Run until Ctrl-C or SIGTERM; False when the demo did not come up or a process ended."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = urls[0]
    try:
        came_up = all(_wait_ready(u, {name for name, _ in AGENTS}, procs) for u in urls)
        if came_up:
            shared = (
                f"\n  Second Router at {urls[1]}, sharing the registry through etcd." if len(urls) > 1 else ""
            )
            reach = reach_command()
            with lock:
                print(
                    f"\n  Agent-Reach demo is up: Router at {url} with {len(AGENTS)} agents.{shared}\n"
                    f"  Try:  curl -s {urls[-1]}/admin/agents\n"
                    f"        {reach} call query_product_price --router {url} --payload '{SAMPLE_PAYLOAD}'\n"
                    f"        {reach} agents --router {url}\n"
                    f"  Page: {url}/admin/ui  (the admin page, in a browser)\n"
                    "  Ctrl-C stops everything.\n",
                    flush=True,
                )
        else:
            with lock:
                print("\n  the demo did not come up; see the log above\n", flush=True)
            stop.set()
        while not stop.is_set() and all(p.poll() is None for p in procs):
            stop.wait(0.5)
        return stop.is_set() and all(p.poll() is None for p in procs) and came_up
    finally:
        # Agents first, so they deregister while the Routers still listen.
        for proc in procs[routers:] + procs[:routers]:
            _stop(proc)
