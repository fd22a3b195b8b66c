"""Schemathesis against the Router's OpenAPI document: no 500, declared statuses, conforming bodies.

The checks, their expected statuses and the bounds of the run are in ``schemathesis.toml`` at the
top of the repository, so ``st run http://HOST:PORT/openapi.json`` from there runs the same.

The schema is built from :func:`openapi_document` at import time, because schemathesis' lazy
(fixture-loaded) schemas do not work with pytest 9; a test checks that the live Router serves
exactly that document at ``/openapi.json``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from reachmesh.config import RouterConfig
from reachmesh.server.openapi import openapi_document
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer
from tests.helpers import scaled

CONFIG = Path(__file__).resolve().parent.parent / "schemathesis.toml"

pytestmark = pytest.mark.fuzz

schema = schemathesis.openapi.from_dict(openapi_document(), config=schemathesis.Config.from_path(CONFIG))


@pytest.fixture(scope="module")
def router_url() -> Iterator[str]:
    """A Router with one agent for task `echo` (the document's example envelope), on loopback."""
    # Generated profiles name random endpoints: no health probes to them. Generated async
    # requests may carry a replyTo: one quick delivery attempt, not five minutes of retries.
    config = RouterConfig.model_validate(
        {
            "health": {"enabled": False},
            "async_mode": {"reply_attempts": 1, "reply_timeout_ms": 200, "reply_window_seconds": 1},
        }
    )
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer(config).__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        agent = bg.run(FakeAgent("st-agent", tasks=("echo",)).start())
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url))
        yield server.url


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


def test_the_router_serves_the_fuzzed_document(router_url: str, session: requests.Session) -> None:
    """GET /openapi.json is the document the schemathesis run below is generated from."""
    resp = session.get(f"{router_url}/openapi.json", timeout=10)
    assert resp.status_code == 200
    assert resp.json() == openapi_document()


@schema.parametrize()
def test_every_operation_answers_as_documented(
    case: schemathesis.Case, router_url: str, session: requests.Session
) -> None:
    """Generated requests get a declared status and a conforming body; no 500 (502/503/504 are answers)."""
    case.call_and_validate(base_url=router_url, session=session, timeout=10)


def test_linked_operations_answer_as_documented(router_url: str, session: requests.Session) -> None:
    """Sequences that follow the document's links (register then renew, reach then poll) stay documented."""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
            return {"base_url": router_url, "session": session, "timeout": 10}

    run_state_machine_as_test(
        Workflow,
        settings=settings(
            max_examples=40, stateful_step_count=6, derandomize=True, deadline=None, database=None
        ),
    )


def test_a_finished_async_result_is_answered_as_documented(
    router_url: str, session: requests.Session
) -> None:
    """An async request that ended in NO_AVAILABLE_HANDLER is polled as a documented 503 ReachResponse."""
    body = {"targetTask": "nobody", "preferences": {"mode": "async"}}
    accepted = session.post(f"{router_url}/reach", json=body, timeout=10)
    assert accepted.status_code == 202
    trace_id = accepted.json()["traceId"]
    poll = schema["/reach/{trace_id}"]["GET"]
    for _ in range(int(scaled(500))):
        resp = poll.Case(path_parameters={"trace_id": trace_id}).call_and_validate(
            base_url=router_url, session=session, timeout=10
        )
        if resp.status_code != 202:
            break
        time.sleep(0.01)
    assert resp.status_code == 503 and resp.json()["status"] == "NO_AVAILABLE_HANDLER"
