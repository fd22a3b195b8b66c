"""Shared fixtures: a real Router on loopback, fake agents, and an HTTP client.

Also the suite's rules for a busy machine: in-process Routers start without lag shedding and
without an embedder unless a test asks for them, every process a test starts is stopped after it,
and the run fails if any child of the suite is still alive at the end.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import psutil
import pytest

from reachmesh import ports
from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import TIME_SCALE, scaled
from tests.procs import stop_all

# A test about shedding or routing by meaning says so in its policy; the rest must not depend on
# the host's load (lag shedding) or pay seconds of CPU to load a model they never use.
RouterServer.defaults = {
    "limits": {"loop_lag_shedding": False},
    "embedding": {"backend": "none"},
}


# The slowest suites first, so that every worker is busy until the end instead of one finishing
# a long drill or pip install while the others idle (xdist hands out tests in this order). The
# first packaging test builds the wheel and venv that the module's other tests wait for and share
# (tests/test_packaging.py): those go after the drills, by when the build is done.
SLOW_FIRST = (
    "packaging",
    "drill",
    "packaging-rest",
    "semantic_eval",
    "etcd",
    "integrations",
    "browser",
    "prometheus",
    "e2e",
    "fuzz",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    builder = next((item for item in items if item.get_closest_marker("packaging")), None)

    def rank(item: pytest.Item) -> int:
        marks = {mark.name for mark in item.iter_markers()}
        if "packaging" in marks and item is not builder:
            marks = {"packaging-rest"}
        return next((i for i, name in enumerate(SLOW_FIRST) if name in marks), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: a module's tests stay together, in their own order
    # The hang guard (pytest-timeout, `timeout` in pyproject.toml) scales like every other
    # deadline: the held-out evaluation computes for a minute alone, and a CI machine with two CPU
    # hogs and a demo beside the suite ran it past 120 s (load average 15).
    if TIME_SCALE != 1:
        guard = float(items[0].config.getini("timeout") or 0) if items else 0.0
        for item in items:
            if guard and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(guard * TIME_SCALE))


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker picks free ports from a slice of its own, and so do the processes it
    starts (they inherit the variable): two workers once picked the same port, and the second
    agent process to bind it could not start."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or os.environ.get(ports.RANGE_ENV):
        return
    index = int(str(workerinput["workerid"]).removeprefix("gw"))
    count = int(workerinput["workercount"])
    low, high = 10_000, ports._ephemeral_floor()
    size = (high - low) // count
    os.environ[ports.RANGE_ENV] = f"{low + index * size}-{low + (index + 1) * size}"


def pytest_report_header() -> str:
    return f"REACH_TEST_TIME_SCALE={TIME_SCALE:g} (deadlines of polls and process waits)"


@pytest.fixture(autouse=True)
def _reap_processes() -> Iterator[None]:
    """Own every process a test starts through tests.procs: stop whatever is still running after
    the test and its fixtures, even when it failed before reaching its own clean-up."""
    yield
    stop_all()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Put the process's logging back as it was: an entry point run in-process (``reach router``
    under CliRunner) configures the package's logger and the root's on a stream that is closed
    once the test ends, and the next test's lines would go to it."""
    from reachmesh.observability import logging as reach_logging

    loggers = [logging.getLogger(), logging.getLogger("reachmesh")]
    saved = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    module_state = (reach_logging._handler, reach_logging._format)
    yield
    for lg, (level, propagate, handlers) in zip(loggers, saved, strict=True):
        lg.setLevel(level)
        lg.propagate = propagate
        lg.handlers[:] = handlers
    reach_logging._handler, reach_logging._format = module_state


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


@pytest.fixture(scope="session", autouse=True)
def _no_children_left() -> Iterator[None]:
    """After every other fixture of this process (one xdist worker, or the whole run) has ended:
    no child process of it is still alive. Any that is gets named, killed, and fails the run."""
    yield
    me = psutil.Process(os.getpid())
    end = time.monotonic() + scaled(5)
    left = [p for p in me.children(recursive=True) if _alive(p)]
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    if left:
        names = [_describe(p) for p in left]
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        pytest.fail(f"processes started by the suite still alive at its end (killed now): {names}")


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    """A Router with default policy on a free loopback port (no lag shedding, no embedder)."""
    # The lag limit out of reach too, as the policy an admin page shows for this Router.
    async with RouterServer(RouterConfig.model_validate({"limits": {"loop_lag_ms": 10_000}})) as server:
        yield server


@pytest.fixture
async def http(router: RouterServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client pointed at the Router."""
    async with httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as client:
        yield client


@pytest.fixture
async def make_agent(router: RouterServer) -> AsyncIterator[Callable[..., Awaitable[FakeAgent]]]:
    """Start and register fake agents; all are stopped at the end."""
    started: list[FakeAgent] = []

    async def make(agent_id: str, *, register: bool = True, **kwargs: object) -> FakeAgent:
        agent = await FakeAgent(agent_id, **kwargs).start()  # type: ignore[arg-type]
        started.append(agent)
        if register:
            await agent.register(router.url)
        return agent

    yield make
    for agent in started:
        await agent.stop()
