"""Hypothesis at the Router's limits: each side of every boundary gets the documented answer, never a 500.

Each property picks values around a limit (body size, JSON depth, schema depth, profile sizes,
the timeout cap, the `limit` query parameter, the request head, a stalled body) and asserts the
exact status on each side, with a whole ReachResponse from /reach and an error object from the
registry and admin API.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reachmesh.config import RouterConfig
from reachmesh.protocol import (
    MAX_CAPABILITIES,
    MAX_EXAMPLE_CHARS,
    MAX_EXAMPLES,
    MAX_PROFILE_EXAMPLES,
    MAX_SCHEMA_DEPTH,
)
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer

pytestmark = pytest.mark.fuzz

BODY_LIMIT = 1024 * 1024
MAX_DEPTH = 64
TIMEOUT_CAP_MS = 300_000
MAX_HEADERS = 100
MAX_HEAD_BYTES = 64 * 1024
REACH_KEYS = {
    "version",
    "traceId",
    "status",
    "handlerAgentId",
    "durationMs",
    "result",
    "error",
    "attempts",
    "route",
}

# Few examples each, derandomized: the boundaries are in the strategies, not found by luck.
LIMITS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def limits_config(**server: Any) -> RouterConfig:
    """The default limits, checked to be the ones this module names, with ``server`` overrides."""
    # No embedder: the limits are validation, and embedding registered examples would only burn
    # CPU. No health probes of the profiles registered here.
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "server": server}
    )
    assert config.server.body_limit_bytes == BODY_LIMIT and config.server.max_json_depth == MAX_DEPTH
    assert config.limits.max_timeout_ms == TIMEOUT_CAP_MS
    assert (config.server.max_headers, config.server.max_header_bytes) == (MAX_HEADERS, MAX_HEAD_BYTES)
    return config


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[str, int]]:
    """A Router at its default limits, with one `echo` agent: (url, port)."""
    # The default body timeout too: a megabyte body on a busy machine may take longer than a
    # short timeout to arrive, and the answer would then be 408 instead of the limit under test.
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer(limits_config()).__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        agent = bg.run(FakeAgent("limits-agent", tasks=("echo",)).start())
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url, vectors=False))
        yield server.url, server.port


@pytest.fixture(scope="module")
def stalling_router() -> Iterator[int]:
    """A Router whose body timeout is short, for bodies that stop arriving: its port."""
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer(limits_config(body_timeout_seconds=0.3)).__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        yield server.port


@pytest.fixture(scope="module")
def http(router: tuple[str, int]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router[0], timeout=10) as client:
        yield client


def post_json(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def reach_response(resp: httpx.Response) -> dict[str, Any]:
    """The body of a /reach answer, checked to be one whole ReachResponse; never a 500."""
    assert resp.status_code != 500, resp.text
    body: dict[str, Any] = resp.json()
    assert set(body) == REACH_KEYS, body
    assert body["traceId"]
    return body


def error_object(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The `error` of a registry or admin refusal, checked to be ``status`` with ``code``."""
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["code"] == code and error["message"]
    return error


def nested(levels: int) -> Any:
    """A value that nests ``levels`` objects deep (0: a scalar)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


# Every registration gets a fresh id: hypothesis may repeat a value, and a live id is a 409.
_ids = itertools.count()


def profile(prefix: str, capabilities: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {
            "id": f"{prefix}-{next(_ids)}",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": capabilities,
        }
    ).encode()


# -- /reach ----------------------------------------------------------------------------------


@LIMITS
@given(size=st.integers(BODY_LIMIT - 64, BODY_LIMIT + 64) | st.integers(BODY_LIMIT + 65, 2 * BODY_LIMIT))
@example(size=BODY_LIMIT)
@example(size=BODY_LIMIT + 1)
def test_reach_body_limit(http: httpx.Client, size: int) -> None:
    """A /reach body of exactly the limit is served; one byte over is 413 PAYLOAD_TOO_LARGE."""
    # No agent declares the task: a body within the limit is read, decoded and routed (to no one),
    # without forwarding a megabyte to an agent with limits of its own.
    head = b'{"targetTask":"nobody","payload":{"pad":"'
    tail = b'"}}'
    body = head + b"x" * (size - len(head) - len(tail)) + tail
    assert len(body) == size
    answer = reach_response(post_json(http, "/reach", body))
    if size > BODY_LIMIT:
        assert answer["status"] == "INVALID_REQUEST" and answer["error"]["code"] == "PAYLOAD_TOO_LARGE"
    else:
        assert answer["status"] == "NO_AVAILABLE_HANDLER", answer["error"]


@LIMITS
@given(levels=st.integers(MAX_DEPTH - 4, MAX_DEPTH + 4) | st.integers(2, 1000), trace=st.uuids())
def test_reach_json_depth(http: httpx.Client, levels: int, trace: Any) -> None:
    """A body deeper than server.max_json_depth is 400 with the caller's traceId; at the limit, served."""
    # The envelope is one level and the payload another: the payload nests `levels - 2` more.
    body = json.dumps({"traceId": trace.hex, "targetTask": "echo", "payload": nested(levels - 1)}).encode()
    answer = reach_response(post_json(http, "/reach", body))
    assert answer["traceId"] == trace.hex
    if levels > MAX_DEPTH:
        assert answer["status"] == "INVALID_REQUEST" and answer["error"]["details"][0]["field"] == "(body)"
    else:
        assert answer["status"] == "SUCCESS", answer["error"]


timeout_values = (
    st.integers(TIMEOUT_CAP_MS - 2, TIMEOUT_CAP_MS + 2)
    | st.integers(1, 3_600_000 * 2)
    | st.one_of(
        st.integers(max_value=0),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
        st.text(max_size=8),
    )
)


@LIMITS
@given(field=st.sampled_from(["timeoutMs", "connectTimeoutMs", "readTimeoutMs"]), value=timeout_values)
def test_reach_timeout_cap(http: httpx.Client, field: str, value: Any) -> None:
    """A caller timeout over limits.max_timeout_ms, or not a positive integer, is 400; else it is routed."""
    body = json.dumps({"targetTask": "echo", "preferences": {field: value}}).encode()
    answer = reach_response(post_json(http, "/reach", body))
    valid = type(value) is int and 0 < value <= TIMEOUT_CAP_MS
    if valid:
        # Routed: a timeout of a few ms may well run out (504), but the request is not refused.
        assert answer["status"] in ("SUCCESS", "TIMEOUT"), answer["error"]
    else:
        assert answer["status"] == "INVALID_REQUEST"
        assert [d["field"] for d in answer["error"]["details"]] == [f"preferences.{field}"]


@settings(LIMITS, max_examples=8)
@given(sent=st.integers(0, 99))
def test_reach_stalled_body_times_out(stalling_router: int, sent: int) -> None:
    """A body that stops arriving gets 408 BODY_TIMEOUT as a whole ReachResponse, however much of it came."""
    head = (
        b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    status, body = raw_exchange(stalling_router, head + b"{" * sent)
    assert status == 408
    answer = json.loads(body)
    assert set(answer) == REACH_KEYS and answer["error"]["code"] == "BODY_TIMEOUT"


# -- the request head ------------------------------------------------------------------------


def raw_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send raw bytes on a fresh connection; the status and body of the first response."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # Refused mid-send: the answer was written before the close, and is read below.
        with contextlib.suppress(OSError):
            sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _expected_length(data: bytes) -> int:
    head, sep, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + len(sep) + int(value)
    return 0


@settings(LIMITS, max_examples=15)
@given(count=st.integers(MAX_HEADERS - 3, MAX_HEADERS + 3) | st.integers(1, 300))
@example(count=MAX_HEADERS)
@example(count=MAX_HEADERS + 1)
def test_header_count_limit(router: tuple[str, int], count: int) -> None:
    """More than server.max_headers header lines is 431 before the app sees them; up to it, served."""
    # Host, Content-Type and Content-Length are three of the lines; the rest is padding.
    lines = [b"Host: localhost", b"Content-Type: application/json", b"Content-Length: 22"]
    lines += [b"X-Pad-%d: y" % i for i in range(count - len(lines))]
    body = b'{"targetTask":"echo"}\n'
    request = b"POST /reach HTTP/1.1\r\n" + b"\r\n".join(lines) + b"\r\n\r\n" + body
    status, answer = raw_exchange(router[1], request)
    if len(lines) > MAX_HEADERS:
        assert status == 431
    else:
        assert status != 431 and status != 500
        assert set(json.loads(answer)) == REACH_KEYS


@settings(LIMITS, max_examples=15)
@given(size=st.integers(MAX_HEAD_BYTES - 64, MAX_HEAD_BYTES + 64) | st.integers(1, 4 * MAX_HEAD_BYTES))
@example(size=MAX_HEAD_BYTES)
@example(size=MAX_HEAD_BYTES + 1)
def test_header_size_limit(router: tuple[str, int], size: int) -> None:
    """A request head over server.max_header_bytes is 431; a head within it is served."""
    start = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
    end = b"\r\n\r\n"
    pad = max(size - len(start) - len(end), 0)
    request = start + b"y" * pad + end
    status, _ = raw_exchange(router[1], request)
    assert status == (431 if len(request) > MAX_HEAD_BYTES else 200)


# -- the registry and admin API ----------------------------------------------------------------


@LIMITS
@given(levels=st.integers(MAX_SCHEMA_DEPTH - 3, MAX_SCHEMA_DEPTH + 3) | st.integers(1, 300))
@example(levels=MAX_SCHEMA_DEPTH)
@example(levels=MAX_SCHEMA_DEPTH + 1)
def test_input_schema_depth(http: httpx.Client, levels: int) -> None:
    """An input_schema deeper than MAX_SCHEMA_DEPTH is 422 INVALID_PROFILE; at the limit it registers."""
    # Full JSON Schema (the shorthand is one level): each level is one more object.
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels - 1):
        schema = {"type": "object", "not": schema}
    body = profile("depth", [{"task": "deep", "input_schema": schema}])
    resp = post_json(http, "/agents", body)
    if levels > MAX_SCHEMA_DEPTH:
        error = error_object(resp, 422, "INVALID_PROFILE")
        assert "input_schema" in error["details"][0]["field"]
    else:
        assert resp.status_code in (200, 201), resp.text


@LIMITS
@given(
    capabilities=st.integers(MAX_CAPABILITIES - 2, MAX_CAPABILITIES + 2)
    | st.integers(1, 2 * MAX_CAPABILITIES),
    examples=st.integers(0, MAX_EXAMPLES + 3),
    length=st.integers(MAX_EXAMPLE_CHARS - 2, MAX_EXAMPLE_CHARS + 2) | st.integers(1, 40),
)
def test_profile_limits(http: httpx.Client, capabilities: int, examples: int, length: int) -> None:
    """Over 64 capabilities, 20 examples of 500 chars or 200 examples in all is 422; within, registered."""
    caps = [{"task": f"t{i}", "examples": ["e" * length] * examples} for i in range(capabilities)]
    body = profile("caps", caps)
    resp = post_json(http, "/agents", body)
    if len(body) > BODY_LIMIT:  # the most examples, at their longest, are more than a body may be
        error_object(resp, 413, "PAYLOAD_TOO_LARGE")
        return
    too_many = (
        capabilities > MAX_CAPABILITIES
        or examples > MAX_EXAMPLES
        or (examples and length > MAX_EXAMPLE_CHARS)
        or capabilities * examples > MAX_PROFILE_EXAMPLES
    )
    if too_many:
        error_object(resp, 422, "INVALID_PROFILE")
    else:
        assert resp.status_code in (200, 201), resp.text


@LIMITS
@given(size=st.integers(BODY_LIMIT - 16, BODY_LIMIT + 16))
@example(size=BODY_LIMIT)
@example(size=BODY_LIMIT + 1)
def test_registry_body_limit(http: httpx.Client, size: int) -> None:
    """A registration body over 1 MiB is 413 PAYLOAD_TOO_LARGE; within it the profile is validated."""
    head = (
        b'{"id":"big-%d","network":{"endpoint":"http://127.0.0.1:9/r"},"capabilities":[{"task":"b"}],"pad":"'
    )
    head %= next(_ids)
    body = head + b"x" * (size - len(head) - 2) + b'"}'
    resp = post_json(http, "/agents", body)
    if size > BODY_LIMIT:
        error_object(resp, 413, "PAYLOAD_TOO_LARGE")
    else:
        assert resp.status_code in (200, 201), resp.text


@LIMITS
@given(
    raw=st.integers(0, 1001).map(str)
    | st.sampled_from(["1000", "1001", "0", "01", "+5", "-1", " 5", "5 ", "1e3", "²", "٣", "১০"])
    | st.text(max_size=12)
)
def test_traces_limit_query(http: httpx.Client, raw: str) -> None:
    """GET /admin/traces?limit= takes ASCII digits 1..1000 only; anything else is a 400 naming `limit`."""
    resp = http.get("/admin/traces", params={"limit": raw})
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 1000:
        assert resp.status_code == 200, resp.text
        assert isinstance(resp.json(), list)
    else:
        error = error_object(resp, 400, "INVALID_REQUEST")
        assert error["details"][0]["field"] == "limit"
