"""The alerting rules and the dashboard shipped in deploy/ are built from what a Router exports.

- promtool checks the rules and runs their unit tests (every alert fires when it should and stays
  quiet when it should not);
- every metric a rule or a dashboard panel reads is one a live Router serves at /metrics;
- a real Prometheus scraping a live Router sees the breaker and retry-budget alerts go pending
  when an agent dies and the retry budget is spent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import scaled, until

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "agent-reach.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "agent-reach.rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-reach.json"
ALERTS_PAGE = ROOT / "docs" / "alerts.md"
# Prometheus's own series that rules may read beside the Router's.
PROMETHEUS_OWN = {"up"}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def names_in(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (ours start with reach); label values
    in quotes are not names."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\breach[a-z0-9_:]*", expr)) | (PROMETHEUS_OWN & set(re.findall(r"\b\w+\b", expr)))


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert shutil.which("promtool"), "promtool is missing: scripts/test-deps installs Debian's prometheus"
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.prometheus
def test_promtool_accepts_the_rules_and_the_compose_config() -> None:
    checked = promtool("check", "rules", str(RULES), cwd=ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with tempfile.TemporaryDirectory() as tmp:
        config = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
        (Path(tmp) / "prometheus.yml").write_text(
            config.replace("/etc/prometheus/agent-reach.rules.yml", str(RULES))
        )
        checked = promtool("check", "config", "prometheus.yml", cwd=Path(tmp))
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.prometheus
def test_every_alert_passes_its_promtool_unit_tests() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook() -> None:
    """Each alert has a unit test where it fires and one where it stays quiet, a summary, and a
    runbook section in docs/alerts.md."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in ALERTS_PAGE.read_text().splitlines()
        if line.startswith("#")
    }
    expected = {
        "ReachRouterDown", "ReachBreakerOpenLong", "ReachShedding", "ReachErrorRateHigh",
        "ReachRetryBudgetExhausted", "ReachAgentsFlapping", "ReachLeaseChurn",
        "ReachRegistryDegraded", "ReachEmbedderDown", "ReachAsyncResultsNearBound",
    }  # fmt: skip
    assert {rule["alert"] for rule in alerts()} == expected
    for rule in alerts():
        name = rule["alert"]
        fires = [c for c in cases if c["alertname"] == name and c["exp_alerts"]]
        quiet = [c for c in cases if c["alertname"] == name and not c["exp_alerts"]]
        assert fires and quiet, f"{name}: tested firing {len(fires)} times, quiet {len(quiet)} times"
        assert rule["annotations"]["summary"] and rule["labels"]["severity"] in ("warning", "critical")
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, f"{name}: no section #{anchor} in docs/alerts.md"


def exported(metrics_text: str) -> set[str]:
    """Every series name a scrape of this text can hold: each family's name, and for a histogram
    its _bucket, _sum and _count."""
    names: set[str] = set()
    for kind, name in re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, re.M):
        names.add(kind)
        if name == "histogram":
            names |= {f"{kind}_bucket", f"{kind}_sum", f"{kind}_count"}
    return names


async def test_rules_and_dashboard_read_only_metrics_a_router_exports() -> None:
    """A misspelt metric in a rule or a panel would be an alert that never fires, a panel that
    stays empty: each name is checked against a live Router's /metrics (after some traffic)."""
    # The bundled embedder: reach_embedding_up is absent without one.
    config = RouterConfig.model_validate(
        {"health": {"enabled": False}, "embedding": {"backend": "local"}, "limits": {"loop_lag_ms": 10_000}}
    )
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = await FakeAgent("echo-agent").start()
        try:
            await agent.register(router.url, vectors=False)
            await http.post("/reach", json={"targetTask": "echo", "payload": {}})
            text = (await http.get("/metrics")).text
        finally:
            await agent.stop()
    known = exported(text) | recorded() | PROMETHEUS_OWN
    assert "reach_end_to_end_latency_seconds_bucket" in known  # the check can tell
    for rule in rules():
        missing = names_in(rule["expr"]) - known
        assert not missing, f"{rule.get('alert') or rule.get('record')} reads {missing}"
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for expr in exprs:
        missing = names_in(expr) - known
        assert not missing, f"dashboard query {expr!r} reads {missing}"
    panels = " ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for topic in ("status", "latency", "breaker", "shedding", "retries", "in flight per agent"):
        assert topic in panels, topic


@pytest.fixture
def prometheus_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reach-prom-") as tmp:
        yield Path(tmp)


def start_prometheus(folder: Path, port: int) -> subprocess.Popen[bytes]:
    assert shutil.which("prometheus"), "prometheus is missing: scripts/test-deps installs it"
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def firing_or_pending(http: httpx.AsyncClient) -> dict[str, str]:
    answer = (await http.get("/api/v1/alerts")).json()
    return {a["labels"]["alertname"]: a["state"] for a in answer["data"]["alerts"]}


@pytest.mark.prometheus
async def test_a_real_prometheus_sees_the_breaker_and_budget_alerts(prometheus_dir: Path) -> None:
    """An agent dies under traffic with the retry budget at zero: Prometheus, scraping the Router
    every second with the shipped rules, holds ReachBreakerOpenLong and ReachRetryBudgetExhausted
    pending (or firing), and ReachRegistryDegraded stays quiet."""
    config = RouterConfig.model_validate(
        {
            "health": {"enabled": False},
            "embedding": {"backend": "none"},
            "limits": {"loop_lag_ms": 10_000},
            "retry_budget": {"ratio": 0, "min_per_second": 0},
        }
    )
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agents = [await FakeAgent(f"doomed-{i}", tasks=("doomed",)).start() for i in range(2)]
        for agent in agents:
            await agent.register(router.url, vectors=False)
        port = free_port()
        (prometheus_dir / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "agent-reach",
                            "static_configs": [{"targets": [router.url.removeprefix("http://")]}],
                        }
                    ],
                }
            )
        )
        server = start_prometheus(prometheus_dir, port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as prom:

                async def ready() -> bool:
                    try:
                        return (await prom.get("/-/ready")).status_code == 200
                    except httpx.TransportError:
                        return False

                await until(ready, "Prometheus to be ready", within=30)

                async def scraped() -> bool:
                    up = (await prom.get("/api/v1/query", params={"query": 'up{job="agent-reach"}'})).json()
                    return any(r["value"][1] == "1" for r in up["data"]["result"])

                await until(scraped, "a first scrape of the Router", within=30)
                for agent in agents:
                    await agent.stop()  # both refuse connections from now on
                for _ in range(12):  # five failures open a breaker; each failover is refused
                    await http.post("/reach", json={"targetTask": "doomed", "payload": {}})
                states = await until(
                    lambda: _both(prom),
                    "ReachBreakerOpenLong and ReachRetryBudgetExhausted to be pending or firing",
                    within=60,
                    interval=0.5,
                )
                assert set(states.values()) <= {"pending", "firing"}
                assert "ReachRegistryDegraded" not in await firing_or_pending(prom)
        finally:
            server.terminate()
            server.wait(timeout=scaled(20))


async def _both(prom: httpx.AsyncClient) -> dict[str, str] | None:
    states = await firing_or_pending(prom)
    wanted = {k: v for k, v in states.items() if k in ("ReachBreakerOpenLong", "ReachRetryBudgetExhausted")}
    return wanted if len(wanted) == 2 else None
