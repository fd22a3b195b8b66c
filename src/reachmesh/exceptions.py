"""The one error tree of Agent-Reach.

Every error the package raises on purpose is a :class:`ReachError`. Third-party errors (the HTTP
client, YAML, a backend) are mapped to one of these at the edge with ``raise ... from exc``, so a
caller never has to know which library sat underneath.

::

    ReachError
    ├── ConfigError                  a policy file or reach_config.yaml that does not validate
    ├── RequestError                 INVALID_REQUEST: the envelope or the payload is wrong
    │   ├── PayloadTooLarge          the body is over the configured limit (413)
    │   ├── UnsupportedMediaType     the body is not JSON (415)
    │   ├── BodyTimeout              the body did not arrive in time (408)
    │   ├── TraceIdInUse             an async request already uses this traceId
    │   ├── LearningDisabled         409 LEARNING_DISABLED: a route confirmed while learning is off
    │   └── CallerGone               the caller closed its connection first (recorded, never sent)
    ├── Overloaded                   429 OVERLOADED: the Router is shedding load
    │   └── Unrecorded               429 OVERLOADED: etcd cannot record an async request now
    ├── AccessDenied                 401/403: no credential, or a role that may not do this
    ├── InternalError                500 INTERNAL_ERROR: a bug in the Router itself
    ├── RegistryError                the registry refused a write
    │   ├── InvalidProfile           422 INVALID_PROFILE, with the field paths at fault
    │   ├── AgentIdConflict          409 AGENT_ID_CONFLICT: the id's lease is live and not yours
    │   ├── RegistryFull             503 REGISTRY_FULL: registry.max_agents are registered
    │   ├── RegistryUnavailable      503 REGISTRY_UNAVAILABLE: the shared registry is out of reach
    │   ├── RegistrationThrottled    429 OVERLOADED: the agent token registers too often
    │   ├── LeaseNotFound            404 LEASE_NOT_FOUND: the lease expired or never existed
    │   ├── LeaseMismatch            403 FORBIDDEN: the lease belongs to another registration
    │   ├── Forbidden                403 FORBIDDEN: the token may not register this id or task
    │   └── AgentNotFound            404 AGENT_NOT_FOUND
    ├── RoutingError                 no agent may take the request
    │   ├── NoAvailableHandler       503 NO_AVAILABLE_HANDLER, with error.candidates
    │   │   ├── UnknownTask          no agent declares the task; suggests the nearest ones
    │   │   ├── SemanticUnavailable  no query vector or no calibrated threshold
    │   │   ├── EmbeddingDown        the embedder failed on this request's text
    │   │   ├── RegistryLoading      REGISTRY_UNAVAILABLE: etcd not read since the start
    │   │   └── AgentsBusy           every agent that answered said 429; retryAfterSeconds
    │   ├── ContextUnavailable       409 CONTEXT_UNAVAILABLE: no agent holds the conversation
    │   └── DeadlineExceeded         504 TIMEOUT: the overall budget ran out
    │       └── RouterShutdown       504 TIMEOUT, code ROUTER_SHUTDOWN: cut by the drain deadline
    ├── AttemptError                 one upstream attempt failed (internal to the dispatcher)
    │   ├── ConnectFailed            refused, reset, unreachable or connect timeout
    │   ├── PoolTimeout              no slot or pool connection came free: not the agent's fault
    │   │   └── TooLateToSend        the wait for a slot left too little time: not sent
    │   ├── AttemptTimeout           the agent did not answer in time
    │   │   └── AgentDeadline        the agent said the request's deadline passed
    │   ├── BadAgentResponse         5xx, or an answer that is not a valid agent reply
    │   ├── AgentRejected            the agent answered AGENT_ERROR, or a 4xx
    │   │   └── AgentDeclined        the agent answered DECLINED: the request is not for it
    │   └── AgentBusy                the agent answered 429: fail over, not a breaker failure
    ├── OutboundRefused              a URL the Router will not call (the rule is named)
    ├── DeliveryFailed               a replyTo URL did not take an async answer
    ├── ClientError                  the SDK could not talk to the Router
    │   └── RouterUnavailable        connection refused, timeout, or a non-JSON answer
    └── EmbeddingError               the embedder failed
        └── EmbeddingUnavailable     the model cannot load, or the embedding service is down

``AttemptError`` carries ``retryable`` so that the dispatcher decides failover from one flag.
Every error that ends a request carries the ReachResponse ``status`` it is answered with, so the
Router has one way out: the error becomes the response's ``error`` object, unchanged.
"""

from __future__ import annotations

from typing import Any

from reachmesh.protocol import HTTP_STATUS, Status


class ReachError(Exception):
    """Base class of every error Agent-Reach raises on purpose."""

    code: str = "REACH_ERROR"
    # The ReachResponse status a request ends with when this error ends it.
    status: Status = Status.INTERNAL_ERROR
    http_status: int = 500

    def __init__(
        self,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        details_omitted: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        # How many faults ``details`` leaves out: it lists at most limits.max_error_details.
        self.details_omitted = details_omitted

    def to_error(self) -> dict[str, Any]:
        """The wire ``error`` object: ``{"code", "message", "details"?, "detailsOmitted"?}``."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
            if self.details_omitted:
                error["detailsOmitted"] = self.details_omitted
        return error


class ConfigError(ReachError):
    """A configuration file is missing, unreadable or invalid; the message names the field."""

    code = "INVALID_CONFIG"


class RequestError(ReachError):
    """The caller sent an envelope or payload that cannot be served (INVALID_REQUEST).

    ``trace_id`` and ``task`` are what could still be read of a bad envelope, for the answer and
    the trace lines.
    """

    code = "INVALID_REQUEST"
    status = Status.INVALID_REQUEST
    http_status = 400

    def __init__(
        self,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        details_omitted: int | None = None,
        trace_id: str | None = None,
        task: Any = None,
    ) -> None:
        super().__init__(message, details=details, details_omitted=details_omitted)
        self.trace_id = trace_id
        self.task = task


class PayloadTooLarge(RequestError):
    """The request body exceeds the configured limit."""

    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class LoopDetected(RequestError):
    """The request has passed through too many Routers: one forwards to itself (X-Reach-Hops)."""

    code = "LOOP_DETECTED"
    http_status = 508


class UnsupportedMediaType(RequestError):
    """The request declares a content type that is not JSON."""

    code = "UNSUPPORTED_MEDIA_TYPE"
    http_status = 415


class BodyTimeout(RequestError):
    """The client sent its headers but not its whole body within the server's body timeout."""

    code = "BODY_TIMEOUT"
    http_status = 408


class TraceIdInUse(RequestError):
    """An async request is pending or finished under this traceId; a second one would hide it."""

    code = "TRACE_ID_IN_USE"


class LearningDisabled(RequestError):
    """An operator confirmed a route while ``routing.learning.enabled`` is false."""

    code = "LEARNING_DISABLED"
    http_status = 409


class CallerGone(RequestError):
    """The caller closed its connection before its answer: the request stops there. Nobody reads
    this answer; it is the record's (trace, metrics), booked to the caller (a 4xx, as the
    ``499`` of some proxies) and never to the agent that was working on it."""

    code = "CALLER_GONE"
    http_status = 499


class Overloaded(ReachError):
    """The Router sheds load; the caller should come back after ``retry_after_s``."""

    code = "OVERLOADED"
    status = Status.OVERLOADED
    http_status = HTTP_STATUS[Status.OVERLOADED]

    def __init__(self, reason: str, *, retry_after_s: int, shedding: bool = True) -> None:
        # ``shedding`` False: the reason alone is the message, for an OVERLOADED that is not the
        # Router shedding load (a call displaced from a full agent's queue, etcd unable to record).
        super().__init__(f"the Router is shedding load: {reason}" if shedding else reason)
        self.reason = reason
        self.retry_after_s = retry_after_s

    def to_error(self) -> dict[str, Any]:
        return {**super().to_error(), "retryAfterSeconds": self.retry_after_s}


class Unrecorded(Overloaded):
    """An async request that etcd cannot record now (several Routers), so it is not accepted.
    Answered as OVERLOADED, so that callers retry it as they would, but said for what it is:
    the message is the reason alone, not "the Router is shedding load" (it is not)."""

    def __init__(self, reason: str, *, retry_after_s: int) -> None:
        super().__init__(reason, retry_after_s=retry_after_s, shedding=False)


class AccessDenied(ReachError):
    """The guard refused the request: no or wrong credentials, or outside the caller's role."""

    def __init__(self, status: Status, message: str, http_status: int) -> None:
        super().__init__(message)
        self.status = status
        self.code = status.value
        self.http_status = http_status


class InternalError(ReachError):
    """The Router failed (a bug): the caller still gets a ReachResponse; the traceback stays in the log."""

    code = "INTERNAL_ERROR"

    def __init__(self, message: str = "the Router failed; see its log") -> None:
        super().__init__(message)


class RegistryError(ReachError):
    """The registry refused a write."""

    http_status = 400


class InvalidProfile(RegistryError):
    """The agent profile does not validate."""

    code = "INVALID_PROFILE"
    http_status = 422


class AgentIdConflict(RegistryError):
    """Another registration holds a live lease on this agent id."""

    code = "AGENT_ID_CONFLICT"
    http_status = 409


class RegistryFull(RegistryError):
    """The registry holds as many agents as the policy allows (``registry.max_agents``)."""

    code = "REGISTRY_FULL"
    http_status = 503


class RegistryUnavailable(RegistryError):
    """The registry's store (etcd) did not answer in time: the write was not made; retry later.

    Routing goes on from the Router's snapshot meanwhile (degraded mode)."""

    code = "REGISTRY_UNAVAILABLE"
    http_status = 503


class RegistrationThrottled(RegistryError):
    """An agent token registered more often than ``registry.registrations_per_minute_per_token``
    allows; the registrant should come back after ``retry_after_s``."""

    code = "OVERLOADED"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def to_error(self) -> dict[str, Any]:
        return {**super().to_error(), "retryAfterSeconds": self.retry_after_s}


class LeaseNotFound(RegistryError):
    """The lease expired or never existed; the agent should register again."""

    code = "LEASE_NOT_FOUND"
    http_status = 404


class LeaseMismatch(RegistryError):
    """The caller presented a lease that is not the one this agent holds."""

    code = "FORBIDDEN"
    http_status = 403


class Forbidden(RegistryError):
    """The credentials do not allow this agent id or task (an agent token outside its globs)."""

    code = "FORBIDDEN"
    http_status = 403


class AgentNotFound(RegistryError):
    """No agent is registered under this id."""

    code = "AGENT_NOT_FOUND"
    http_status = 404


# The most candidates an answer (error.candidates) or a stored trace lists by name.
MAX_CANDIDATES_SHOWN = 20


class RoutingError(ReachError):
    """No agent may take the request; ``candidates`` says why, one reason per agent."""

    code = "NO_AVAILABLE_HANDLER"
    status = Status.NO_AVAILABLE_HANDLER
    http_status = HTTP_STATUS[Status.NO_AVAILABLE_HANDLER]

    def __init__(self, message: str, candidates: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.candidates = candidates

    def to_error(self) -> dict[str, Any]:
        error = super().to_error()
        if self.candidates is not None:
            # A task with a thousand agents made every failed call a 146 KB answer: the first
            # ones are shown, and how many more there were.
            error["candidates"] = self.candidates[:MAX_CANDIDATES_SHOWN]
            if len(self.candidates) > MAX_CANDIDATES_SHOWN:
                error["candidatesOmitted"] = len(self.candidates) - MAX_CANDIDATES_SHOWN
        return error


class NoAvailableHandler(RoutingError):
    """No candidate is left."""

    def __init__(self, message: str, candidates: list[dict[str, Any]]) -> None:
        super().__init__(message, candidates)


class UnknownTask(NoAvailableHandler):
    """No agent declares the task; ``suggestions`` names declared tasks near it."""

    def __init__(self, task: str, candidates: list[dict[str, Any]]) -> None:
        super().__init__(f"no agent declares task {task!r}", candidates)
        self.task = task
        self.suggestions: list[dict[str, Any]] = []

    def suggest(self, suggestions: list[dict[str, Any]], hint: str) -> None:
        """Name the nearest declared tasks (by spelling, by meaning) and how to route free text."""
        self.suggestions = suggestions
        if suggestions:
            names = ", ".join(f"{s['task']!r} ({s['by']})" for s in suggestions)
            self.message = f"{self.message}; did you mean {names}?"
        if hint:
            self.message = f"{self.message} {hint}"

    def to_error(self) -> dict[str, Any]:
        error = super().to_error()
        if self.suggestions:
            error["suggestions"] = self.suggestions
        return error


class SemanticUnavailable(NoAvailableHandler):
    """A semantic route was needed but cannot be computed (no vector, no threshold)."""

    code = "SEMANTIC_UNAVAILABLE"


class EmbeddingDown(NoAvailableHandler):
    """The embedder failed on this request's text; exact task names still work. When the
    embedding service said when to come back, so does the answer (``retryAfterSeconds``)."""

    code = "EMBEDDING_UNAVAILABLE"

    def __init__(
        self, message: str, candidates: list[dict[str, Any]], *, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message, candidates)
        self.retry_after_s = retry_after_s

    def to_error(self) -> dict[str, Any]:
        error = super().to_error()
        if self.retry_after_s is not None:
            error["retryAfterSeconds"] = self.retry_after_s
        return error


class RegistryLoading(NoAvailableHandler):
    """The shared registry has not been read yet (etcd has not answered since the Router
    started): the Router knows no agent, so it says why rather than "no agent declares" the task.
    ``retryAfterSeconds`` as other transient refusals carry it."""

    code = "REGISTRY_UNAVAILABLE"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, [])
        self.retry_after_s = retry_after_s

    def to_error(self) -> dict[str, Any]:
        return {**super().to_error(), "retryAfterSeconds": self.retry_after_s}


class AgentsBusy(NoAvailableHandler):
    """No agent took the request and at least one said it was busy (429) and when to come back:
    ``retryAfterSeconds`` is the soonest of those."""

    def __init__(self, message: str, candidates: list[dict[str, Any]], *, retry_after_s: int) -> None:
        super().__init__(message, candidates)
        self.retry_after_s = retry_after_s

    def to_error(self) -> dict[str, Any]:
        return {**super().to_error(), "retryAfterSeconds": self.retry_after_s}


class ContextUnavailable(RoutingError):
    """A contextBound conversation's agent is gone and no other confirms it holds the context."""

    code = "CONTEXT_UNAVAILABLE"
    status = Status.CONTEXT_UNAVAILABLE
    http_status = HTTP_STATUS[Status.CONTEXT_UNAVAILABLE]


class DeadlineExceeded(RoutingError):
    """The request's overall budget ran out before an agent answered."""

    code = "TIMEOUT"
    status = Status.TIMEOUT
    http_status = HTTP_STATUS[Status.TIMEOUT]

    def __init__(self, message: str) -> None:
        super().__init__(message)


class RouterShutdown(DeadlineExceeded):
    """The Router shut down (its drain deadline came) before this request finished."""

    code = "ROUTER_SHUTDOWN"


class AttemptError(ReachError):
    """One upstream attempt failed. ``reason`` is the candidate reason it maps to."""

    reason = "agent_error"
    retryable = True


class ConnectFailed(AttemptError):
    """The agent could not be reached: refused, reset, unreachable, or connect timeout."""

    code = "CONNECT_ERROR"
    reason = "connect_error"

    def __init__(self, message: str, *, refused: bool = False, sent: bool = False) -> None:
        super().__init__(message)
        # Refused: nothing listens on the agent's port, so the process is gone or not started.
        self.refused = refused
        # Sent: the request was written before the connection failed, so the agent may have read
        # (and run) it; only an idempotent capability may be sent it again.
        self.sent = sent


class PoolTimeout(AttemptError):
    """No slot at the agent (its max_concurrency) or no connection of the Router's own pool came
    free in time. Nothing was sent: it is the Router's wait, not the agent's failure, so neither
    the breaker nor the success rate hear of it."""

    code = "POOL_TIMEOUT"
    reason = "at_capacity"


class TooLateToSend(PoolTimeout):
    """A call that waited for a slot at a full agent and was not sent: too little of its deadline
    was left for the agent's usual answer time. The Router's wait, not the agent's failure."""

    code = "TIMEOUT"


class AttemptTimeout(AttemptError):
    """The agent did not answer within the attempt's read timeout or the deadline."""

    code = "TIMEOUT"
    reason = "timeout"


class AgentDeadline(AttemptTimeout):
    """The agent answered that the request's deadline passed (``AGENT_ERROR`` with code
    ``DEADLINE_EXCEEDED``, or a ``TIMEOUT`` status): a timeout, in the agent's words."""


class BadAgentResponse(AttemptError):
    """The agent answered 5xx, or something that is not a valid agent reply."""

    code = "BAD_AGENT_RESPONSE"
    reason = "agent_error"


class AgentRejected(AttemptError):
    """The agent answered ``AGENT_ERROR`` (or a 4xx); ``retryable`` is the agent's word."""

    code = "AGENT_ERROR"
    reason = "agent_error"
    status = Status.AGENT_ERROR
    http_status = HTTP_STATUS[Status.AGENT_ERROR]

    def __init__(self, error: dict[str, Any], *, retryable: bool) -> None:
        super().__init__(str(error.get("message") or "the agent reported an error"))
        self.error = error
        self.retryable = retryable

    def to_error(self) -> dict[str, Any]:
        return self.error


class AgentDeclined(AgentRejected):
    """The agent answered ``DECLINED``: the request is not for it. Not a failure: the Router tries
    the next candidate without a retry-budget token, and the agent's breaker and success rate
    never see it."""

    code = "DECLINED"
    reason = "declined"

    def __init__(self, error: dict[str, Any]) -> None:
        # The agent's own code is kept (DECLINED, or A2A_TASK_REJECTED from an A2A agent).
        super().__init__(error, retryable=True)


class AgentBusy(AttemptError):
    """The agent answered 429: alive but busy. The request fails over; the breaker is not told.
    ``retry_after_s`` is the agent's ``Retry-After``, bounded, when it gave one."""

    code = "AGENT_BUSY"
    reason = "busy"

    def __init__(self, message: str, *, retry_after_s: int | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OutboundRefused(ReachError):
    """A URL the Router will not call: the message names the rule (SSRF guard)."""

    code = "URL_REFUSED"
    http_status = 422


class DeliveryFailed(ReachError):
    """A ``replyTo`` URL refused, failed or did not answer 2xx; the message says how."""

    code = "DELIVERY_FAILED"


class ClientError(ReachError):
    """The SDK could not complete a call to the Router."""

    code = "CLIENT_ERROR"


class RouterUnavailable(ClientError):
    """The Router refused the connection, timed out, or answered something that is not JSON."""

    code = "ROUTER_UNAVAILABLE"


class EmbeddingError(ReachError):
    """The embedder failed to produce vectors."""

    code = "EMBEDDING_ERROR"


class EmbeddingUnavailable(EmbeddingError):
    """The model cannot be loaded, or the embedding service cannot be reached (or is busy, and
    said for how long: ``retry_after_s``)."""

    code = "EMBEDDING_UNAVAILABLE"

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
