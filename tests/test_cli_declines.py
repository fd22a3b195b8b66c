"""A decline's reason, the agent's own words, where a person reads the CLI: the summary line of
`reach call` and `reach trace`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from reachmesh.cli.main import app
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer

runner = CliRunner()


@pytest.fixture(scope="module")
def router_url() -> Iterator[str]:
    """A Router whose one agent for `quote_fare` declines everything."""
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer().__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        agent = FakeAgent("picky-agent", tasks=("quote_fare",), mode="decline")
        bg.run(agent.start())
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url))
        yield server.url


def test_the_call_summary_line_quotes_the_decline(router_url: str) -> None:
    args = ["call", "quote_fare", "--router", router_url, "--trace-id", "cli-decline-1"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("NO_AVAILABLE_HANDLER: ")
    assert 'declined by picky-agent: "picky-agent declines on purpose"' in summary


def test_reach_trace_shows_the_decline_reason(router_url: str) -> None:
    runner.invoke(app, ["call", "quote_fare", "--router", router_url, "--trace-id", "cli-decline-2"])
    result = runner.invoke(app, ["trace", "cli-decline-2", "--router", router_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert 'not used: picky-agent (declined: "picky-agent declines on purpose")' in result.output
