"""The transport contract, and how an agent's answer is classified (shared by every transport).

Every method either returns its documented value or raises one of the project's own errors:
``send`` raises :class:`~reachmesh.exceptions.AttemptError` subclasses, ``deliver`` raises
:class:`~reachmesh.exceptions.DeliveryFailed`; ``probe`` and ``holds`` answer False on any
failure. So nothing above this layer ever sees an HTTP client's exception.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from contextvars import ContextVar
from typing import Any, NamedTuple, Protocol

from reachmesh import jsoncodec
from reachmesh.exceptions import (
    AgentBusy,
    AgentDeadline,
    AgentDeclined,
    AgentRejected,
    AttemptError,
    BadAgentResponse,
)
from reachmesh.transport.pieces import AgentStream, StreamBounds

DEFAULT_RESPONSE_LIMIT = 8 * 1024 * 1024
RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"
# The longest wait an agent's Retry-After may ask of a caller; a longer one is cut to this.
MAX_RETRY_AFTER_S = 300
# An agent's error ``code`` is kept by the Router (trace store, metrics, logs) long after the
# answer is gone, so only a short identifier is taken as one: an 8 MB code once cost 10 MiB of
# Router memory per call. Anything else becomes AGENT_ERROR; the caller still gets the rest.
_ERROR_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
# Seconds the running task has spent waiting for a connection of the Router's own pool, in all:
# the pool adds to it while a request waits, and the attempt loop reads it before and after a
# send, so the trace shows the wait. A ContextVar, not a return value: the wait is a fact of the
# calling task, and every transport (and every fake of one) keeps the ``send`` it has.
POOL_WAIT_S: ContextVar[float] = ContextVar("reach_pool_wait_s", default=0.0)
# How many Routers a request has come through, sent to every agent as X-Reach-Hops (this
# Router's count plus one) and read from every caller: an agent whose endpoint is a Router's own
# /reach (itself, or two Routers each other's) had each call forwarded back, 256 deep, until the
# Router's own client slots ran out. Past MAX_HOPS the Router refuses it (LOOP_DETECTED). A
# ContextVar, as POOL_WAIT_S: the count belongs to the request's task and every task it starts.
HOPS_HEADER = "X-Reach-Hops"
MAX_HOPS = 8
HOPS: ContextVar[int] = ContextVar("reach_hops", default=0)
# An agent's error ``message`` reaches the caller, the trace and the log: a paragraph, not a body.
MAX_ERROR_MESSAGE_CHARS = 4096


def hops_of(value: bytes | None) -> int:
    """The X-Reach-Hops a request came with: 0 when absent or not a small whole number (only a
    Router sends it, and a caller who sends garbage fools no one but itself)."""
    if value is None or not value.isdigit() or len(value) > 4:
        return 0
    return int(value)


class AttemptLimits(NamedTuple):
    """Seconds one attempt may spend connecting, waiting for the answer, and in all.

    A NamedTuple, not a frozen dataclass: one is made per attempt, and a frozen dataclass's
    ``__init__`` costs several microseconds of ``object.__setattr__``.
    """

    connect_s: float
    read_s: float
    total_s: float


class Transport(Protocol):
    """How the Router talks to agents and callers' ``replyTo`` URLs."""

    async def open(self) -> None:
        """Acquire connection pools; called once inside the running loop."""
        ...

    async def close(self) -> None:
        """Release every connection."""
        ...

    async def send(
        self, url: str, body: bytes, headers: dict[str, str], limits: AttemptLimits, protocol: str = "http"
    ) -> Any:
        """POST a ReachRequest; the agent's ``result``, or an AttemptError subclass.

        ``protocol`` is the agent profile's ``network.protocol``: ``http`` sends the envelope as
        it is, ``a2a`` as an A2A ``SendMessage`` (:mod:`.a2a`), with the answer mapped back.
        """
        ...

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        limits: AttemptLimits,
        bounds: StreamBounds,
        protocol: str = "http",
    ) -> AgentStream:
        """POST a ReachRequest asking for an event stream (protocol §14): the agent's answer
        once its head is in, read piece by piece; a plain JSON answer is one piece. Failures
        up to the head raise as ``send`` does; the stream's own, from its ``next()``."""
        ...

    async def probe(self, url: str, timeout_s: float) -> bool:
        """GET a health URL: True on any 2xx within ``timeout_s``."""
        ...

    async def holds(self, url: str, timeout_s: float) -> bool:
        """GET a conversation URL: True only on ``200 {"holds": true}``."""
        ...

    async def deliver(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        """POST an async ReachResponse to ``replyTo``; DeliveryFailed unless it answers 2xx."""
        ...


def too_large(message: str) -> AgentRejected:
    """An answer over the limit: the agent's fault, not the network's, so not a breaker failure."""
    return AgentRejected({"code": RESPONSE_TOO_LARGE, "message": message}, retryable=False)


def classify_answer(status: int, raw: bytes, retry_after: bytes | None = None) -> Any:
    """The ``result`` of an agent's HTTP answer, or the AttemptError that it amounts to."""
    if status == 429:
        raise busy(retry_after)
    if status >= 500:
        raise BadAgentResponse(f"agent answered HTTP {status}")
    try:
        answer = jsoncodec.loads(raw) if raw else None
    except jsoncodec.JSONDecodeError:
        answer = None
    # The common answer, which none of the rules below apply to (a decoded object is a dict).
    if status < 400 and answer.__class__ is dict and answer.get("status") == "SUCCESS":
        return answer.get("result")
    if isinstance(answer, dict) and answer.get("status") == "DECLINED" and status < 500:
        # Read before the 4xx rule: an agent may send its decline as a 422 or as a 200.
        raise AgentDeclined(normalise_error(answer.get("error"), "the agent declined the request"))
    if 400 <= status < 500:
        error = answer.get("error") if isinstance(answer, dict) else None
        raise AgentRejected(normalise_error(error, f"agent answered HTTP {status}"), retryable=False)
    if not isinstance(answer, dict):
        raise BadAgentResponse(f"agent answered HTTP {status} without a JSON object")
    outcome = answer.get("status")
    if outcome == "SUCCESS":
        return answer.get("result")
    raise _failure(outcome, answer)


def _failure(outcome: Any, answer: dict[str, Any]) -> AttemptError:
    """The error an agent's answer of status ``outcome`` (not SUCCESS) amounts to."""
    if outcome == "AGENT_ERROR":
        error = normalise_error(answer.get("error"), "the agent reported an error")
        if error["code"] == "DEADLINE_EXCEEDED":
            # The SDK gave up at the deadline we sent it: that is this attempt timing out.
            return AgentDeadline(error["message"])
        return AgentRejected(error, retryable=error.get("retryable") is True)
    if outcome == "TIMEOUT":
        # A ReachResponse's own TIMEOUT (an agent that is itself a Router, or relays one): the
        # deadline passed there, which is a timeout here too, not an answer this Router cannot read.
        error = normalise_error(answer.get("error"), "the agent reported that the deadline passed")
        return AgentDeadline(error["message"])
    return BadAgentResponse(f"agent answered an unknown status {str(outcome)[:64]!r}")


def busy(retry_after: bytes | None) -> AgentBusy:
    """An agent's 429, with its ``Retry-After`` (seconds or an HTTP date) as whole seconds."""
    seconds = retry_after_seconds(retry_after)
    later = f"; it asked to retry after {seconds} s" if seconds is not None else ""
    return AgentBusy(f"the agent is busy (HTTP 429){later}", retry_after_s=seconds)


def retry_after_seconds(value: bytes | None) -> int | None:
    """A Retry-After value as whole seconds in [0, MAX_RETRY_AFTER_S]; None when absent or
    unreadable. An HTTP date is read against the wall clock, the only clock it can mean."""
    if not value:
        return None
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(text).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(math.ceil(seconds), 0), MAX_RETRY_AFTER_S)


def normalise_error(error: Any, fallback: str) -> dict[str, Any]:
    """An agent's error object with at least ``code`` and ``message``, both bounded strings.

    ``code`` is the agent's own only when it is a string shaped like an identifier of at most
    64 characters; ``message`` only when it is a string, cut to MAX_ERROR_MESSAGE_CHARS."""
    if not isinstance(error, dict):
        return {"code": "AGENT_ERROR", "message": fallback}
    out = dict(error)
    code = out.get("code")
    out["code"] = code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else "AGENT_ERROR"
    message = out.get("message")
    if not isinstance(message, str) or not message:
        message = fallback
    elif len(message) > MAX_ERROR_MESSAGE_CHARS:
        cut = len(message) - MAX_ERROR_MESSAGE_CHARS
        message = f"{message[:MAX_ERROR_MESSAGE_CHARS]}… [{cut} more characters cut by the Router]"
    out["message"] = message
    return out
