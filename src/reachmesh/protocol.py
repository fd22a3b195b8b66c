"""The wire models of PROTOCOL.md: agent profiles, ReachRequest, ReachResponse, statuses, errors.

Envelope keys are camelCase on the wire and snake_case in Python; profiles keep the snake_case
keys of ``reach_config.yaml``. Unknown keys are ignored, never an error. This module does no I/O.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from reachmesh.jsoncodec import depth
from reachmesh.names import check_agent_id, check_task_name
from reachmesh.schema import check_schema

PROTOCOL_VERSION = "1.0"

# ASCII only, so no agent id can pass for another; task names cannot be (see names.py). Runs of letters and
# digits joined by single separators: "agent-alpha." or "agent--alpha" would print like
# "agent-alpha" (names.check_agent_id says so by name, before this pattern refuses).
AGENT_ID_PATTERN = r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$"
MAX_AGENT_ID_CHARS = 128
# Task names are identifiers in any script (query_product_price, 查询价格); no spaces, no
# control characters, so they are safe in log lines and metric labels. names.py refuses the
# ones that could pass for another name (invisible characters, mixed scripts, non-NFKC).
TASK_PATTERN = r"^[\w.:-]{1,128}$"
# A trace id appears in every log line: restrict it so that no caller can forge lines.
TRACE_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
# Free text (a task phrase, a source agent name, a conversation id) must carry no control
# characters, for the same reason.
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"

AgentId = Annotated[
    str,
    StringConstraints(pattern=AGENT_ID_PATTERN, max_length=MAX_AGENT_ID_CHARS),
    BeforeValidator(check_agent_id),
]
# The look-alike check runs before the pattern, so a zero-width space is refused by name.
TaskName = Annotated[str, StringConstraints(pattern=TASK_PATTERN), BeforeValidator(check_task_name)]
# "." and ".." fit the pattern but are path segments that every HTTP client resolves away, so
# GET /reach/{traceId} and GET /admin/traces/{traceId} could never name them.
_DOT_SEGMENTS = frozenset({".", ".."})
_TRACE_ID = re.compile(TRACE_ID_PATTERN)


def is_trace_id(value: object) -> bool:
    """Whether ``value`` may be a trace id: the pattern, and not a dot segment."""
    return isinstance(value, str) and value not in _DOT_SEGMENTS and _TRACE_ID.fullmatch(value) is not None


def _not_a_dot_segment(value: str) -> str:
    if value in _DOT_SEGMENTS:
        raise ValueError(
            f"{value!r} cannot be named in a URL path (GET /reach/{{traceId}}): choose another traceId"
        )
    return value


TraceId = Annotated[
    str,
    StringConstraints(pattern=TRACE_ID_PATTERN),
    AfterValidator(_not_a_dot_segment),
    # The same rule in the JSON Schema, so that a client validating against it agrees.
    Field(json_schema_extra={"not": {"enum": sorted(_DOT_SEGMENTS)}}),
]
PrintableText = Annotated[str, StringConstraints(pattern=_PRINTABLE, max_length=1024)]

# Timeouts are positive whole milliseconds, at most an hour. Strict: "4000", 4000.5 and true
# are INVALID_REQUEST rather than silently coerced.
# input_schema and output_schema: deeper nesting is refused before any validator recurses.
MAX_SCHEMA_DEPTH = 32
# What one registration may ask the Router to embed: every description and example is a model
# call, so these bound the work a single registrant can cause.
MAX_CAPABILITIES = 64
# The largest max_concurrency a profile may declare (a bound on what a stranger can ask for).
MAX_CONCURRENCY = 100_000
MAX_DESCRIPTION_CHARS = 2048
MAX_EXAMPLES = 20
MAX_EXAMPLE_CHARS = 500
MAX_PROFILE_EXAMPLES = 200
# Declared limits are embedded too, and each is a short phrase ("cancel or change an order").
MAX_LIMITS = 16
MAX_LIMIT_CHARS = 200

Millis = Annotated[int, Field(strict=True, gt=0, le=3_600_000)]
# The shortest health_check.interval_seconds an agent may ask for.
MIN_HEALTH_INTERVAL_SECONDS = 1.0


class Status(StrEnum):
    """The status of a ReachResponse; each maps to one HTTP status (:data:`HTTP_STATUS`)."""

    SUCCESS = "SUCCESS"
    ACCEPTED = "ACCEPTED"
    INVALID_REQUEST = "INVALID_REQUEST"
    NO_AVAILABLE_HANDLER = "NO_AVAILABLE_HANDLER"
    CONTEXT_UNAVAILABLE = "CONTEXT_UNAVAILABLE"
    TIMEOUT = "TIMEOUT"
    AGENT_ERROR = "AGENT_ERROR"
    UNAUTHORIZED = "UNAUTHORIZED"
    FORBIDDEN = "FORBIDDEN"
    OVERLOADED = "OVERLOADED"
    # An agent's answer that the request is not for it (v1.2). Never a Router's final answer: when
    # every candidate declines, the caller gets NO_AVAILABLE_HANDLER with reason ``declined``.
    DECLINED = "DECLINED"
    # An addition to the protocol: the Router itself failed (a bug). The answer is still a
    # ReachResponse, never a bare 500, and the traceback stays in the Router's log.
    INTERNAL_ERROR = "INTERNAL_ERROR"


HTTP_STATUS: dict[Status, int] = {
    Status.SUCCESS: 200,
    Status.ACCEPTED: 202,
    Status.INVALID_REQUEST: 400,
    Status.NO_AVAILABLE_HANDLER: 503,
    Status.CONTEXT_UNAVAILABLE: 409,
    Status.TIMEOUT: 504,
    Status.AGENT_ERROR: 502,
    Status.UNAUTHORIZED: 401,
    Status.FORBIDDEN: 403,
    Status.OVERLOADED: 429,
    Status.DECLINED: 422,
    Status.INTERNAL_ERROR: 500,
}


class AgentStatusValue(StrEnum):
    """Where an agent stands in the registry."""

    AVAILABLE = "available"
    SUSPECT = "suspect"
    UNHEALTHY = "unhealthy"
    OFFLINE = "offline"


class CandidateReason(StrEnum):
    """Why a candidate did not handle a request (``error.candidates[].reason``)."""

    CIRCUIT_OPEN = "circuit_open"
    UNHEALTHY = "unhealthy"
    OFFLINE = "offline"
    FILTERED = "filtered"
    TIMEOUT = "timeout"
    CONNECT_ERROR = "connect_error"
    AGENT_ERROR = "agent_error"
    BUDGET_EXHAUSTED = "budget_exhausted"
    # Additions to the protocol's list, for cases it leaves open:
    UNKNOWN_AGENT = "unknown_agent"  # targetAgent names no registered agent
    NO_CAPABILITY = "no_capability"  # targetAgent does not declare targetTask
    INVALID_PAYLOAD = "invalid_payload"  # a failover target's input_schema rejects the payload
    NO_CONTEXT = "no_context"  # contextBound: the agent did not confirm it holds the conversation
    BELOW_THRESHOLD = "below_threshold"  # semantic_route: the best match scored under the threshold
    AMBIGUOUS = "ambiguous"  # semantic_route: the best match is too close to the runner-up
    DECLINED = "declined"  # the agent answered DECLINED, or a learned negative for this phrase
    DECLARED_LIMIT = "declared_limit"  # semantic_route: the text matches a declared limit
    BUSY = "busy"  # the agent answered 429 (too many requests); the request failed over
    AT_CAPACITY = "at_capacity"  # the agent is full (max_concurrency) and its queue too
    # Not tried: an earlier agent may have the request (sent, outcome unknown) and the capability
    # is not idempotent, so no other agent is sent it.
    NOT_IDEMPOTENT = "not_idempotent"


class Strategy(StrEnum):
    """Routing strategies a caller may ask for."""

    EXACT_MATCH = "exact_match"
    SEMANTIC_ROUTE = "semantic_route"
    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"


# ----------------------------------------------------------------------------- agent profile


class _ProfileModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Capability(_ProfileModel):
    """One task an agent can handle."""

    task: TaskName
    description: Annotated[str, StringConstraints(max_length=MAX_DESCRIPTION_CHARS)] = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    routing_weight: Annotated[float, Field(gt=0, le=10_000)] = 1.0
    examples: Annotated[
        list[Annotated[str, StringConstraints(max_length=MAX_EXAMPLE_CHARS)]], Field(max_length=MAX_EXAMPLES)
    ] = []
    # What the capability does *not* handle, in any language; routes by meaning keep off them.
    limits: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_LIMIT_CHARS, pattern=_PRINTABLE)]],
        Field(max_length=MAX_LIMITS),
    ] = []
    # Running it twice does no harm: a request sent whose outcome is unknown (the connection
    # closed after the request was written) may be sent again, to this agent or another.
    idempotent: Annotated[bool, Field(strict=True)] = False

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema_is_usable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            # Measured before anything recurses over it: a schema 500 levels deep must be a 422,
            # not a RecursionError.
            if depth(value, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
                raise ValueError(f"a schema may nest at most {MAX_SCHEMA_DEPTH} levels deep")
            check_schema(value)
        return value


class Network(_ProfileModel):
    """Where the Router reaches the agent."""

    # How the Router talks to it: ``http`` is this protocol's ReachRequest POST; ``a2a`` is an
    # A2A agent (JSON-RPC binding), sent each request as an A2A SendMessage (transport/a2a.py).
    protocol: Literal["http", "a2a"] = "http"
    endpoint: Annotated[str, StringConstraints(max_length=2048)]

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("endpoint must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("endpoint must name a host")
        if parts.username or parts.password:
            raise ValueError("endpoint must not carry credentials")
        if parts.fragment:
            raise ValueError("endpoint must not carry a #fragment")
        try:
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError as exc:
            raise ValueError("endpoint has an invalid port") from exc
        return value


class HealthCheck(_ProfileModel):
    """How the Router may probe the agent."""

    path: Annotated[str, StringConstraints(pattern=r"^/[\x21-\x7e]{0,511}$")] = "/healthz"
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    # At least a second, as most health checkers require: an agent asking for 0.0001 s piled up
    # probe work for everyone and starved the other agents' probes.
    interval_seconds: Annotated[float, Field(ge=MIN_HEALTH_INTERVAL_SECONDS, le=3600)] = 15
    timeout_ms: Annotated[int, Field(gt=0, le=60_000)] = 5000


class AgentProfile(_ProfileModel):
    """The mapping under ``agent:`` in ``reach_config.yaml``, and the body of registration."""

    id: AgentId
    display_name: Annotated[str, StringConstraints(max_length=256)] = ""
    network: Network
    capabilities: Annotated[list[Capability], Field(min_length=1, max_length=MAX_CAPABILITIES)]
    health_check: HealthCheck = HealthCheck()
    # The most requests this instance wants in flight at once (PROTOCOL §15); None: no cap but
    # the Router's own pool bounds.
    # Strict, like `idempotent`: a registration saying true or "20" is a mistake to report, not
    # a count to guess (true was read as 1).
    max_concurrency: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY, strict=True)] | None = None

    @model_validator(mode="after")
    def _tasks_are_unique(self) -> AgentProfile:
        seen: set[str] = set()
        for cap in self.capabilities:
            if cap.task in seen:
                raise ValueError(f"capability task {cap.task!r} is declared twice")
            seen.add(cap.task)
        examples = sum(len(cap.examples) + len(cap.limits) for cap in self.capabilities)
        if examples > MAX_PROFILE_EXAMPLES:
            raise ValueError(
                f"the profile declares {examples} examples and limits; at most "
                f"{MAX_PROFILE_EXAMPLES} in all, since each is embedded for routing by meaning"
            )
        return self

    @property
    def tasks(self) -> list[str]:
        return [cap.task for cap in self.capabilities]


# ----------------------------------------------------------------------------- envelopes


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True, frozen=True)


class Preferences(_Envelope):
    """The caller's wishes for one request; the Router's policy has the last word."""

    timeout_ms: Millis | None = Field(
        default=None, validation_alias=AliasChoices("timeoutMs", "overallTimeoutMs", "timeout_ms")
    )
    connect_timeout_ms: Millis | None = None
    read_timeout_ms: Millis | None = None
    retry_count: Annotated[int, Field(strict=True, ge=0, le=100)] | None = None
    filter_agent_ids: Annotated[list[AgentId], Field(max_length=1024)] | None = None
    strategy: Strategy | None = None
    mode: Literal["sync", "async"] = "sync"
    reply_to: Annotated[str, StringConstraints(max_length=2048)] | None = None
    context_bound: Annotated[bool, Field(strict=True)] = False


class ReachRequest(_Envelope):
    """The one envelope a caller sends to ``POST /reach``."""

    # The smallest useful envelope, for readers of the schema (and the examples schemathesis sends).
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"targetTask": "echo", "payload": {"text": "hi"}}]}
    )

    version: str = PROTOCOL_VERSION
    trace_id: TraceId | None = None
    conversation_id: Annotated[str, StringConstraints(pattern=_PRINTABLE, max_length=256)] | None = None
    source_agent: Annotated[str, StringConstraints(pattern=_PRINTABLE, max_length=256)] | None = None
    target_task: PrintableText
    # Empty, or an agent id. Both ends anchored: "^$|[a-z0-9]...$" matched any text that merely
    # ended like an id, so "pаy-agent" (Cyrillic а) or a terminal escape slipped through.
    target_agent: (
        Annotated[
            str,
            StringConstraints(
                pattern=r"^(?:|" + AGENT_ID_PATTERN[1:-1] + r")$", max_length=MAX_AGENT_ID_CHARS
            ),
            BeforeValidator(check_agent_id),
        ]
        | None
    ) = None
    payload: dict[str, Any] = {}
    preferences: Preferences = Preferences()


# The error code an SDK agent answers (retryable) for a task it has no handler for: its
# registration is older than its code. The Router counts it neither for nor against the agent.
UNKNOWN_TASK = "UNKNOWN_TASK"
# The header that carries the shared secret the Router sends agents that ask for one
# (outbound.agent_secret_env on the Router, server.shared_secret_env on an SDK agent).
AGENT_SECRET_HEADER = "X-Reach-Agent-Secret"


class Candidate(_Envelope):
    """One agent that was considered and did not handle the request, and why."""

    agent_id: str
    reason: str
    # An addition: the task the candidate was considered for (semantic refusals list several).
    task: str | None = None
    score: float | None = None
    # An addition (v1.2): the declared limit a ``declared_limit`` candidate's text matched.
    limit: str | None = None
    # An addition: a ``declined`` candidate's own reason, at most 256 characters.
    message: str | None = None


class Suggestion(_Envelope):
    """A declared task near an unknown one (an addition to the protocol)."""

    task: str
    by: Literal["spelling", "meaning"]
    score: float | None = None


class ErrorInfo(_Envelope):
    """The ``error`` object of a ReachResponse."""

    code: str
    message: str
    details: list[dict[str, Any]] | None = None
    # An addition: how many faults there were beyond those ``details`` lists
    # (limits.max_error_details).
    details_omitted: int | None = None
    candidates: list[Candidate] | None = None
    # An addition: how many candidates there were beyond the first 20 that ``candidates`` lists.
    candidates_omitted: int | None = None
    retryable: bool | None = None
    # Additions: the declared tasks nearest an unknown one, and OVERLOADED's back-off.
    suggestions: list[Suggestion] | None = None
    retry_after_seconds: int | None = None


class Attempt(_Envelope):
    """One upstream attempt: which agent, how it ended, how long it took."""

    agent_id: str
    outcome: str
    duration_ms: float


class Route(_Envelope):
    """Which declared task the Router ran for the request, and how it chose it.

    ``by``: ``exact`` (the task named), ``task_map`` (the operator's mapping table),
    ``learned`` (a phrase confirmed for the task before) or ``meaning`` (semantic_route, with
    its ``score``). A caller whose ``targetTask`` differs from ``task`` learns here that
    something other than what it named was run.
    """

    task: str
    by: str
    score: float | None = None


class ReachResponse(_Envelope):
    """The one answer every request ends in."""

    version: str = PROTOCOL_VERSION
    trace_id: str
    status: Status
    handler_agent_id: str | None = None
    duration_ms: float = 0
    result: Any = None
    error: ErrorInfo | None = None
    attempts: list[Attempt] = []
    # None when the request never got as far as a task (refused at the door, unknown task).
    route: Route | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


class Registration(_Envelope):
    """The answer to ``POST /agents``."""

    agent_id: str
    lease_id: str
    ttl_seconds: float
    status: AgentStatusValue


class Lease(_Envelope):
    """The answer to ``PUT /agents/{id}/lease``."""

    agent_id: str
    lease_id: str
    ttl_seconds: float


class AgentStats(_Envelope):
    """Per-agent request statistics as shown in ``AgentStatus.stats``."""

    requests: int = 0
    success_rate: float = 1.0
    p50_latency_ms: float | None = Field(default=None, alias="p50LatencyMs")
    inflight: int = 0


class AgentStatus(BaseModel):
    """One row of ``GET /admin/agents``. Keys mix cases exactly as PROTOCOL.md §2 has them."""

    model_config = ConfigDict(extra="ignore")

    id: str
    display_name: str
    status: AgentStatusValue
    capabilities: list[str]
    endpoint: str
    lastHeartbeat: str
    circuit: Literal["closed", "open", "half_open"] = "closed"
    stats: AgentStats = AgentStats()
    # PROTOCOL §15: requests in flight to it from this Router, its max_concurrency (None: not
    # declared), and requests waiting in this Router for a slot at it.
    inflight: int = 0
    capacity: int | None = None
    queued: int = 0
    # Routing by meaning: pending (exact task only so far), ready, or unavailable (embedder
    # down; retried). Absent when the Router has semantic routing switched off.
    vectors: Literal["pending", "ready", "unavailable"] | None = None
    # Bridged agents only (absent for a leased Reach agent): its wire protocol, and whether it is
    # a managed (lease-less) registration whose liveness is the health checks' alone.
    protocol: Literal["http", "a2a"] | None = None
    managed: bool | None = None


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every wire model, by name (``reach schema`` writes them out)."""
    models: dict[str, type[BaseModel]] = {
        "AgentProfile": AgentProfile,
        "ReachRequest": ReachRequest,
        "ReachResponse": ReachResponse,
        "Registration": Registration,
        "Lease": Lease,
        "AgentStatus": AgentStatus,
        "ErrorInfo": ErrorInfo,
    }
    return {name: model.model_json_schema(by_alias=True) for name, model in models.items()}


def error_details(exc: Any, *, prefix: str = "", limit: int | None = None) -> list[dict[str, Any]]:
    """Turn a pydantic ``ValidationError`` into ``[{"field", "message"}]`` with dotted paths
    (the first ``limit`` of them; ``exc.error_count()`` says how many there are)."""
    details = []
    for err in exc.errors(include_url=False)[:limit]:
        path = ".".join(str(p) for p in err.get("loc", ()) if not _is_internal_loc(p))
        field = f"{prefix}.{path}" if prefix and path else (prefix or path)
        details.append({"field": field or "(body)", "message": err.get("msg", "invalid")})
    return details


_INTERNAL_LOC = re.compile(r"^(function-after|function-before|constrained-str|.*\[.*\])")


def _is_internal_loc(part: object) -> bool:
    # pydantic adds validator names such as "function-after[...]" to locations; they mean
    # nothing to a person fixing a YAML file.
    return isinstance(part, str) and bool(_INTERNAL_LOC.match(part))
