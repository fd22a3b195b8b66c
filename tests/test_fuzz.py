"""Fuzzing: no envelope or profile, however malformed, gets a 500 or loses its answer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reachmesh.protocol import HTTP_STATUS, Status
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer

pytestmark = pytest.mark.fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)

envelopes = st.fixed_dictionaries(
    {},
    optional={
        "version": json_values,
        "traceId": st.one_of(st.text(max_size=140), json_values),
        "conversationId": json_values,
        "sourceAgent": st.one_of(st.text(max_size=40), json_values),
        "targetTask": st.one_of(st.sampled_from(["echo", "checked"]), st.text(max_size=60), json_values),
        "targetAgent": st.one_of(st.sampled_from(["", "fuzz-agent", "Nope"]), json_values),
        "payload": st.one_of(st.dictionaries(st.text(max_size=10), json_values, max_size=4), json_values),
        "preferences": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "timeoutMs": st.one_of(st.integers(-10, 5000), json_values),
                    "overallTimeoutMs": json_values,
                    "retryCount": json_values,
                    "filterAgentIds": json_values,
                    "strategy": st.one_of(st.sampled_from(["exact_match", "semantic_route"]), json_values),
                    "mode": json_values,
                    "contextBound": json_values,
                },
            ),
            json_values,
        ),
    },
)

profiles = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.sampled_from(["fuzz-profile", "x"]), st.text(max_size=20), json_values),
        "display_name": json_values,
        "network": st.one_of(
            st.fixed_dictionaries(
                {
                    "endpoint": st.one_of(
                        st.sampled_from(["http://127.0.0.1:9/r", "ftp://x", "http://", "https://h:99999/"]),
                        st.text(max_size=30),
                        json_values,
                    )
                }
            ),
            json_values,
        ),
        "capabilities": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"task": st.one_of(st.text(max_size=12), json_values)},
                    optional={
                        "input_schema": json_values,
                        "routing_weight": json_values,
                        "examples": json_values,
                    },
                ),
                max_size=3,
            ),
            json_values,
        ),
        "health_check": json_values,
        "leaseId": json_values,
    },
)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KNOWN = {(s.value, code) for s, code in HTTP_STATUS.items()} | {
    ("INVALID_REQUEST", 413),
    ("INVALID_REQUEST", 415),
}


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """A Router with one agent (task `checked` has an input_schema), driven from sync code."""
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer().__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        agent = bg.run(
            FakeAgent("fuzz-agent", tasks=("echo", "checked"), input_schema={"product_id": "string"}).start()
        )
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url))
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client


@FUZZ
@given(envelope=envelopes)
def test_fuzzed_envelopes_always_get_one_reach_response(http: httpx.Client, envelope: dict) -> None:
    """Random envelopes always get a ReachResponse whose status matches its HTTP code; never a 500."""
    resp = http.post("/reach", content=json.dumps(envelope), headers={"Content-Type": "application/json"})
    body = resp.json()
    assert (body["status"], resp.status_code) in KNOWN
    assert body["status"] != Status.INTERNAL_ERROR
    assert body["traceId"]
    if body["status"] != "SUCCESS":
        assert body["error"]["code"] and body["error"]["message"]


@FUZZ
@given(body=json_values)
def test_fuzzed_bodies_of_any_shape(http: httpx.Client, body: object) -> None:
    """Any JSON value as the body gets a structured answer."""
    resp = http.post("/reach", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert (resp.json()["status"], resp.status_code) in KNOWN


@FUZZ
@given(profile=profiles)
def test_fuzzed_profiles_are_accepted_or_refused_cleanly(http: httpx.Client, profile: dict) -> None:
    """Random registration bodies are accepted (201/200) or refused with a JSON 4xx error."""
    resp = http.post("/agents", content=json.dumps(profile), headers={"Content-Type": "application/json"})
    assert resp.status_code in (200, 201, 400, 409, 422), resp.text
    if resp.status_code >= 400:
        assert resp.json()["error"]["code"]
    else:
        assert resp.json()["leaseId"]
