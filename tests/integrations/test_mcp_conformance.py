"""`reach mcp --http` against the MCP project's own conformance suite, at both wire versions.

@modelcontextprotocol/conformance (npm, pinned in scripts/mcp-conformance, with the Node 22 it
needs) runs every server scenario of a spec version against a real `reach mcp` process over a
real Router. The fixture tools the scenarios call are capabilities of real agents. Each
scenario must pass unless tests/integrations/mcp_conformance_expected.yaml names it for that
version, with the reason; a named scenario that starts passing fails the test too, so the file
never goes stale. A pass that rests on an error result (an ``isError`` tool answer) counts as a
failure, outside the one scenario about error results.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.procs import ROOT

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
VERSIONS = ("2025-11-25", "2026-07-28")
EXPECTED = Path(__file__).with_name("mcp_conformance_expected.yaml")
# Where an error result is the point of the scenario.
ERROR_SCENARIOS = {"tools-call-error"}
RESULT_DIR = re.compile(r"^server-(?P<name>.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")

# The suite's fixture tools, each a capability of its own agent (facts from the suite's
# scenario descriptions: names, schemas and answers).
SIMPLE_TEXT = "This is a simple text response for testing."
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}
# A capability that puts one argument in a header (SEP-2243 `x-mcp-header`).
HEADER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
    "required": ["region"],
}


def fixture_agents() -> dict[str, FakeAgent]:
    agents = {
        # Listed first (tools are sorted by name): the header scenarios call the first tool with
        # no arguments, and an echo answers that with a result, not a schema refusal.
        "echo": FakeAgent("echo-agent", tasks=("echo",)),
        "test_simple_text": FakeAgent("text-agent", tasks=("test_simple_text",), result=SIMPLE_TEXT),
        "test_error_handling": FakeAgent("error-agent", tasks=("test_error_handling",), mode="error"),
        "json_schema_2020_12_tool": FakeAgent(
            "schema-agent", tasks=("json_schema_2020_12_tool",), input_schema=SCHEMA_2020_12
        ),
        "test_header_param": FakeAgent(
            "header-agent", tasks=("test_header_param",), input_schema=HEADER_SCHEMA
        ),
    }
    for task, agent in agents.items():
        agent.descriptions[task] = f"conformance fixture {task}, served by a Reach agent"
    return agents


@pytest.fixture(scope="module")
def suite() -> Path:
    """The installed suite (scripts/mcp-conformance installs it once, then only finds it)."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: scripts/test-deps installs it, and then the MCP conformance suite")
    done = subprocess.run(
        [str(ROOT / "scripts" / "mcp-conformance")], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"installing the MCP conformance suite failed:\n{done.stderr}"
    return Path(done.stdout.strip())


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, FakeAgent]]]:
    """A Router with the fixture agents, and `reach mcp --http` following it, as a process."""
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agents = fixture_agents()
        for agent in agents.values():
            await agent.start()
            await agent.register(router.url, vectors=False)
        port = free_port()
        log = (tmp_path / "reach-mcp.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *(
                "-m",
                "reachmesh",
                "mcp",
                "--router",
                router.url,
                "--http",
                str(port),
                "--poll-interval",
                "0.2",
            ),
            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            await wait_listening(url, proc)
            yield url, agents
        finally:
            proc.terminate()
            await proc.wait()
            log.close()
            for agent in agents.values():
                await agent.stop()
    # Whatever the suite sent, the bridge answered it in its own words, never with a traceback.
    printed = (tmp_path / "reach-mcp.log").read_text(errors="replace")
    assert "Traceback" not in printed, printed[-3000:]


async def wait_listening(url: str, proc: asyncio.subprocess.Process, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            assert proc.returncode is None, "reach mcp exited before serving"
            try:
                await http.get(url)
                return
            except httpx.TransportError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def run_suite(suite: Path, url: str, version: str, out: Path) -> str:
    """Every server scenario of ``version`` against ``url``; results under ``out``; the log."""
    proc = await asyncio.create_subprocess_exec(
        str(suite / "node"),
        str(suite / "conformance.js"),
        *("server", "--url", url, "--suite", "all", "--spec-version", version, "-o", str(out)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=out.parent,
    )
    try:
        printed, _ = await asyncio.wait_for(proc.communicate(), timeout=900)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return printed.decode(errors="replace")


def has_error_result(node: Any) -> bool:
    """Whether a check's details hold a tool result with ``isError: true`` anywhere."""
    if isinstance(node, dict):
        return node.get("isError") is True or any(has_error_result(v) for v in node.values())
    if isinstance(node, list):
        return any(has_error_result(v) for v in node)
    return False


def verdict(name: str, checks: list[dict[str, Any]]) -> str:
    """``pass``, or why the scenario does not count as passed.

    A scenario passes when no check failed, at least one check of its own succeeded (the
    suite's ``wire-schema-valid`` only checks message shapes), and no check rests on an error:
    neither on the bridge's answer for a fixture it lacks (an unknown tool or prompt) nor on an
    ``isError`` tool result, outside the scenarios whose subject is that error.
    """
    failed = [c for c in checks if c["status"] == "FAILURE"]
    if failed:
        return "; ".join(f"{c['id']}: {c.get('errorMessage', '')}"[:200] for c in failed)
    if not any(c["status"] == "SUCCESS" and c["id"] != "wire-schema-valid" for c in checks):
        return "no check of the scenario succeeded: nothing was exercised"
    for check in checks:
        text = json.dumps(check.get("details")) + str(check.get("errorMessage") or "")
        if "Unknown tool" in text or "Unknown prompt" in text:
            return f"{check['id']} rests on a fixture the bridge lacks: {text[:160]}"
        if name not in ERROR_SCENARIOS and has_error_result(check.get("details")):
            return f"{check['id']} passed only on an error result"
    return "pass"


def outcomes(out: Path) -> dict[str, str]:
    """Scenario name -> ``pass`` or why it does not count, from the suite's checks.json files."""
    found: dict[str, str] = {}
    for result in sorted(out.iterdir()):
        match = RESULT_DIR.match(result.name)
        if match is not None:
            checks = json.loads((result / "checks.json").read_text())
            found[match["name"]] = verdict(match["name"], checks)
    return found


def expected_failures(version: str) -> dict[str, dict[str, str]]:
    listed: dict[str, dict[str, dict[str, str]]] = yaml.safe_load(EXPECTED.read_text())
    return listed.get(version) or {}


def test_the_expected_failures_file_gives_every_scenario_a_reason() -> None:
    """Each scenario left out names its reason: a kind and the words of why."""
    kinds = {"not-declared", "json-only", "not-testable"}
    for version in VERSIONS:
        for name, entry in expected_failures(version).items():
            assert entry["kind"] in kinds, (version, name)
            assert len(entry["why"]) > 20, (version, name)


@pytest.mark.parametrize("version", VERSIONS)
async def test_reach_mcp_passes_the_conformance_suite(
    suite: Path, bridge: tuple[str, dict[str, FakeAgent]], version: str, tmp_path: Path
) -> None:
    """Every applicable scenario passes at ``version``; the rest fail exactly as expected."""
    url, agents = bridge
    out = tmp_path / f"results-{version}"
    out.mkdir()
    printed = await run_suite(suite, url, version, out)
    found = outcomes(out)
    assert found, f"the suite ran no scenario:\n{printed[-3000:]}"
    expected = expected_failures(version)
    passed = sorted(name for name, outcome in found.items() if outcome == "pass")
    failed = {name: outcome for name, outcome in found.items() if outcome != "pass"}
    print(
        f"\nMCP conformance {version}: {len(passed)} passed, {len(failed)} failed (expected {len(expected)})"
    )
    unexpected = {name: why for name, why in failed.items() if name not in expected}
    assert not unexpected, f"unexpected failures at {version}: {json.dumps(unexpected, indent=1)}"
    stale = sorted(name for name in expected if found.get(name) == "pass")
    assert not stale, f"expected to fail at {version} but passed (update the expected file): {stale}"
    # The fixture tools were really served by their agents, through the Router.
    assert agents["test_simple_text"].received and agents["test_error_handling"].received
    assert "tools-call-simple-text" in passed and "tools-list" in passed
