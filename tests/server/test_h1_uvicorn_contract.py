"""server/h1.py subclasses uvicorn's private httptools protocol: this names what it relies on.

uvicorn is pinned below its next minor release in pyproject.toml. When the pin is raised, this
test is the first to say what changed, rather than a limit that silently stops applying. The
behaviour itself (431/408 on bad heads, one write per answer) is tested in test_greedy_clients and
test_response_writes.
"""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from reachmesh.server.h1 import GuardedHttpTools

# The parser callbacks and connection hooks that GuardedHttpTools overrides, with the parameters
# it passes on to super().
OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
    # uvicorn's own writes and closes past the response cycle: a held answer leaves first.
    "send_400_response": ["self", "msg"],
    "shutdown": ["self"],
    "timeout_keep_alive_handler": ["self"],
    # The caller's FIN, on which the transport closes itself: a held answer leaves first.
    "eof_received": ["self"],
}

# The only methods of uvicorn's protocol that write to or close the transport itself rather than
# through the response cycle's (GuardedHttpTools overrides each to send a held answer first;
# connection_lost has nobody left to write to).
DIRECT_WRITERS = {"connection_lost", "send_400_response", "shutdown", "timeout_keep_alive_handler"}

# Instance attributes it reads, set by uvicorn's __init__ / connection_made / on_url.
READ_ATTRIBUTES = ["loop", "parser", "url", "scope", "cycle", "transport"]


def test_uvicorn_is_the_version_range_h1_was_written_for() -> None:
    major, minor = (int(part) for part in version("uvicorn").split(".")[:2])
    assert (major, minor) < (0, 55), "raise the pin only after re-reading server/h1.py"


def test_the_overridden_hooks_still_exist_with_the_same_parameters() -> None:
    for name, params in OVERRIDDEN.items():
        ours = getattr(GuardedHttpTools, name)
        theirs = getattr(HttpToolsProtocol, name, None)
        assert theirs is not None, f"uvicorn's HttpToolsProtocol lost {name}(); h1.py overrides it"
        assert ours is not theirs, f"GuardedHttpTools no longer overrides {name}()"
        assert list(inspect.signature(theirs).parameters) == params, (
            f"uvicorn's HttpToolsProtocol.{name} changed its parameters"
        )


def test_the_attributes_h1_reads_are_still_set_by_uvicorn() -> None:
    source = inspect.getsource(HttpToolsProtocol)
    for attribute in READ_ATTRIBUTES:
        assert f"self.{attribute} = " in source or f"self.{attribute}: " in source, (
            f"uvicorn's HttpToolsProtocol no longer sets self.{attribute}; h1.py reads it"
        )
    # on_url is uvicorn's own, which only gathers the URL: h1.py sizes the request line from it.
    assert "on_url" not in vars(GuardedHttpTools)
    body = [line.strip() for line in inspect.getsource(HttpToolsProtocol.on_url).splitlines()[1:]]
    assert body == ["self.url += url"], "uvicorn's on_url does more now; re-read h1.py's head size"
    # The one-write path swaps the response cycle's transport.
    assert "self.transport = transport" in inspect.getsource(RequestResponseCycle.__init__)
    # The lean events replace these two asyncio.Events, and keep to Event's interface.
    assert "self.message_event = message_event" in inspect.getsource(RequestResponseCycle.__init__)
    assert "self._is_writable_event = asyncio.Event()" in inspect.getsource(FlowControl.__init__)
    # on_response_complete tests read_paused itself before calling resume_reading.
    assert "self.read_paused = False" in inspect.getsource(FlowControl.__init__)
    resume = [line.strip() for line in inspect.getsource(FlowControl.resume_reading).splitlines()[1:]]
    assert resume[0] == "if self.read_paused:", "uvicorn's resume_reading does more now; h1.py skips it"


# What whole_answer reads and sets on uvicorn's response cycle, as its own send() does.
CYCLE_ATTRIBUTES = [
    "disconnected",
    "response_started",
    "access_log",
    "flow",
    "waiting_for_100_continue",
    "default_headers",
    "keep_alive",
    "response_complete",
    "message_event",
    "on_response",
]


def test_the_cycle_state_whole_answer_keeps_is_still_uvicorns() -> None:
    from uvicorn.protocols.http import httptools_impl

    source = inspect.getsource(RequestResponseCycle)
    for attribute in CYCLE_ATTRIBUTES:
        assert f"self.{attribute}" in source, f"uvicorn's RequestResponseCycle no longer has {attribute}"
    send = inspect.getsource(RequestResponseCycle.send)
    # The steps whole_answer repeats: the status line, the default headers, completion.
    for step in (
        "STATUS_LINE[status_code]",
        "self.default_headers",
        "self.on_response()",
        "self.message_event.set()",
    ):
        assert step in send, f"uvicorn's send() no longer does {step}; re-read server/h1.py whole_answer"
    assert httptools_impl.STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"


# What the lane (a POST /reach served without uvicorn's cycle) reads of uvicorn's protocol.
LANE_ATTRIBUTES = [
    "app",
    "root_path",
    "expect_100_continue",
    "access_log",
    "limit_concurrency",
    "headers",
    "client",
    "server_state",
    "flow",
    "tasks",
    "config",
]


def test_what_the_lane_relies_on_is_still_uvicorns() -> None:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    source = inspect.getsource(HttpToolsProtocol)
    for attribute in LANE_ATTRIBUTES:
        assert f"self.{attribute} = " in source or f"self.{attribute}: " in source, (
            f"uvicorn's HttpToolsProtocol no longer sets self.{attribute}; h1.py's lane reads it"
        )
    # The lane writes uvicorn's own on_header out: lower-case names, the 100-continue flag.
    on_header = inspect.getsource(HttpToolsProtocol.on_header)
    for step in ("name.lower()", 'b"100-continue"', "self.headers.append((name, value))"):
        assert step in on_header, f"uvicorn's on_header no longer does {step}; re-read h1.py on_header"
    # It leaves a proxied request to the middleware, which reads these two headers only.
    middleware = inspect.getsource(ProxyHeadersMiddleware)
    assert "self.trusted_hosts = " in middleware and "self.app = app" in middleware
    assert set(re.findall(rb'b"(x-forwarded-[a-z]+)"', middleware.encode())) == {
        b"x-forwarded-for",
        b"x-forwarded-proto",
    }
    # on_response_complete is written out in h1.py but for its keep-alive timer: the same steps.
    complete = inspect.getsource(HttpToolsProtocol.on_response_complete)
    for step in (
        "self.server_state.total_requests += 1",
        "if self.transport.is_closing():",
        "self.flow.resume_reading()",
        "cycle, app = self.pipeline.pop()",
        "self._start_asgi_task(cycle, app)",
        "self.timeout_keep_alive, self.timeout_keep_alive_handler",
    ):
        assert step in complete, f"uvicorn's on_response_complete no longer does {step}; re-read h1.py"
    assert "self._unset_keepalive_if_required()" in inspect.getsource(HttpToolsProtocol.data_received)
    # Tasks are made with a fresh context when asked, as _start_asgi_task does.
    assert "self.config.reset_contextvars" in inspect.getsource(HttpToolsProtocol._start_asgi_task)


def test_uvicorns_direct_writes_and_closes_are_the_ones_h1_sends_held_answers_before() -> None:
    direct = {
        name
        for name, member in vars(HttpToolsProtocol).items()
        if callable(member)
        and ("self.transport.write" in (text := inspect.getsource(member)) or "self.transport.close" in text)
    }
    assert direct == DIRECT_WRITERS, "uvicorn writes past the cycle elsewhere now: flush first there"
