"""The HTTP implementation of the transport contract.

Forwarding a request (``send``, on every call) goes through the lean pooled client of
:mod:`.pool`; the rare calls (health probes, holds checks, ``replyTo`` deliveries) through
one shared aiohttp session. Both use the same TLS context and URL guard. Their errors become the
project's own here, with ``raise ... from exc``, and nowhere else.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from reachmesh.config import OutboundPolicy, ServerPolicy
from reachmesh.exceptions import (
    AgentRejected,
    AttemptTimeout,
    BadAgentResponse,
    ConnectFailed,
    DeliveryFailed,
    InternalError,
    OutboundRefused,
    PoolTimeout,
    ReachError,
)
from reachmesh.tls import verifying_context
from reachmesh.transport import a2a
from reachmesh.transport import pool as lean
from reachmesh.transport.answer import (
    DEFAULT_HEAD,
    Answer,
    BrokenBody,
    Disconnected,
    HeadLimits,
    HeadTooLarge,
)
from reachmesh.transport.base import (
    DEFAULT_RESPONSE_LIMIT,
    HOPS,
    HOPS_HEADER,
    AttemptLimits,
    busy,
    classify_answer,
)
from reachmesh.transport.streamconn import LeanAgentStream
from reachmesh.transport.streaming import (
    EVENT_STREAM,
    AgentStream,
    PlainStream,
    StreamBounds,
    a2a_piece,
    gather,
    looks_like_events,
    raw_piece,
)
from reachmesh.transport.urlguard import UrlGuard
from reachmesh.version import __version__

# What a failed probe, holds check or delivery can raise; all mean "no".
_QUIET = (aiohttp.ClientError, TimeoutError, OSError, ValueError)


# A holds answer is one small JSON object; more than this is not one.
HOLDS_LIMIT = 64 * 1024


async def _read_whole(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, however many writes it came in; None past ``limit`` bytes (never read
    further). ``read(n)`` alone returns what has arrived so far, not the body."""
    parts: list[bytes] = []
    size = 0
    while True:
        part = await content.read(limit + 1 - size)
        if not part:
            return b"".join(parts)
        size += len(part)
        if size > limit:
            return None
        parts.append(part)


def head_limits(policy: ServerPolicy) -> HeadLimits:
    """The bounds on an agent answer's head, from the server policy."""
    return HeadLimits(
        policy.response_max_header_bytes, policy.response_max_headers, policy.response_max_line_bytes
    )


def client_tls(policy: OutboundPolicy) -> ssl.SSLContext:
    """The TLS settings of every HTTPS call: verified always, against ``ca_file`` when set.

    Built when the Router is built, so a missing or unreadable file stops it at start with a
    ConfigError naming the key, not at the first call to an HTTPS agent.
    """
    return verifying_context("outbound", policy.ca_file, policy.client_cert_file, policy.client_key_file)


def tls_failure(exc: aiohttp.ClientSSLError | ssl.SSLError) -> str:
    """What went wrong in a TLS handshake, in words an operator can act on."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | ssl.SSLCertVerificationError):
        cause = exc.certificate_error if isinstance(exc, aiohttp.ClientConnectorCertificateError) else exc
        detail = getattr(cause, "verify_message", None) or str(cause)
        return (
            f"TLS: the agent's certificate was refused ({detail}); "
            "its CA must be in outbound.ca_file, and its names must cover the endpoint's host"
        )
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorSSLError) else exc
    detail = getattr(cause, "reason", None) or str(cause)
    return f"TLS: the handshake with the agent failed ({detail})"


def _pool_error(exc: Exception, limits: AttemptLimits) -> PoolTimeout | ConnectFailed:
    """The project's error for the pool's own: nothing was sent in any of these cases."""
    if isinstance(exc, lean.PoolTimeout):
        # The Router's own pool was full until the attempt's ceiling: the agent is not at fault.
        return PoolTimeout(f"waited for a connection of the Router's pool: {exc}")
    if isinstance(exc, lean.ConnectTimeout):
        return ConnectFailed(f"connect timeout after {limits.connect_s * 1000:.0f} ms")
    # A URL the standard library accepted at registration but that cannot be requested
    # (``http://[::1]]:80/``): this agent cannot be reached; the request fails over.
    return ConnectFailed(f"the agent's endpoint is not a usable URL ({exc})")


def timeout_said(exc: TimeoutError, limits: AttemptLimits) -> str:
    """Which timeout fired, and its value: the read timeout, or the attempt's ceiling."""
    if isinstance(exc, lean.ReadTimeout):
        return f"no answer within the {limits.read_s * 1000:.0f} ms read timeout"
    return f"the attempt's {limits.total_s * 1000:.0f} ms ceiling passed"


def unsendable(exc: lean.BadHeader) -> ReachError:
    """A request the Router built with a header that would split it: never the agent's failure
    (no breaker, no failover: no other agent would fare better)."""
    return InternalError(f"{exc}; the request was not sent")


_POOL_ERRORS = (lean.PoolTimeout, lean.ConnectTimeout, lean.BadUrl, lean.BadHeader)


def stream_failure(exc: Exception, limits: AttemptLimits) -> Exception:
    """The project's error for a failure to open an event stream (up to its head): as a plain
    call's (:func:`_post_error`), but a timeout is the head's bound, the pool's wait, the
    connect and the head together."""
    if isinstance(exc, TimeoutError):
        waited = min(limits.connect_s + limits.read_s, limits.total_s) * 1000
        return AttemptTimeout(f"no answer head within {waited:.0f} ms")
    return _post_error(exc, limits)


class _GuardedResolver(AbstractResolver):
    """Resolves names, then drops every address the URL guard refuses: a name that resolves to a
    metadata address (at once, or after a rebinding) is never connected to."""

    def __init__(self, guard: UrlGuard) -> None:
        self._guard = guard
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> Any:
        found = await self._inner.resolve(host, port, family)
        return self._guard.allowed(host, found, lambda item: str(item["host"]))

    async def close(self) -> None:
        await self._inner.close()


class HttpTransport:
    """Talks to agents: a lean pool for forwarding, an ``aiohttp.ClientSession`` for the rest."""

    def __init__(
        self,
        *,
        pool_size: int | None = None,
        response_limit: int = DEFAULT_RESPONSE_LIMIT,
        guard: UrlGuard | None = None,
        tls: OutboundPolicy | None = None,
        head: HeadLimits = DEFAULT_HEAD,
    ) -> None:
        """``tls``: the outbound policy: its CA and client certificate (read once, here) and its
        connection caps (``pool_size`` overrides the global one); ``head``: the bounds on an
        answer's head."""
        outbound = tls or OutboundPolicy()
        self._pool_size = pool_size or outbound.max_connections
        self._per_agent = min(outbound.max_connections_per_agent, self._pool_size)
        self._connecting = outbound.max_connecting_per_agent
        self._response_limit = response_limit
        self._head = head
        self._guard = guard or UrlGuard()
        self._ssl = client_tls(outbound)
        self._session: aiohttp.ClientSession | None = None
        self._pool: lean.Pool | None = None

    async def open(self) -> None:
        if self._pool is None:
            self._pool = lean.Pool(
                size=self._pool_size,
                per_agent=self._per_agent,
                connecting_per_agent=self._connecting,
                response_limit=self._response_limit,
                guard=self._guard,
                tls=self._ssl,
                user_agent=f"agent-reach/{__version__}",
                head=self._head,
            )
        if self._session is None:
            # One TLS context for every call on the session: agents, probes, holds, replyTo.
            connector = aiohttp.TCPConnector(
                limit=self._pool_size,
                # The probes, holds checks and deliveries: the per-agent cap bounds them too.
                limit_per_host=self._per_agent,
                ttl_dns_cache=60,
                resolver=_GuardedResolver(self._guard),
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Agents answer with JSON; no cookies are ever kept between strangers.
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("HttpTransport.open() was not awaited")
        return self._session

    async def send(
        self, url: str, body: bytes, headers: dict[str, str], limits: AttemptLimits, protocol: str = "http"
    ) -> Any:
        """POST ``body`` to ``url`` and return the agent's ``result``.

        An ``a2a`` agent gets the envelope as an A2A ``SendMessage`` and its task is mapped back
        (:mod:`.a2a`); the connection, limits and guard are the same for both.
        """
        headers[HOPS_HEADER] = str(HOPS.get() + 1)  # the attempt's own dict: no copy
        if protocol == "a2a":
            answer = await self._post(url, a2a.send_message(body), a2a.headers(headers), limits)
            if answer.status == 429:
                raise busy(answer.retry_after)
            return a2a.classify(answer.status, answer.body)
        pool = self._pool
        if pool is None:
            raise RuntimeError("HttpTransport.open() was not awaited")
        # The pool's coroutine awaited here, not through _post: one coroutine fewer per attempt.
        try:
            answer = await pool.post(url, body, headers, limits.connect_s, limits.read_s, limits.total_s)
        except _POST_ERRORS as exc:
            raise _post_error(exc, limits) from exc
        body = answer.body
        # A JSON object is no event stream: looks_like_events() only for an answer that may be one.
        if body[:1] != b"{" and looks_like_events(answer.status, body):
            # An agent that streams to a caller that asked for no stream: its chunks as a list,
            # within the answer limit the pool already kept to (protocol §14, mixed ends).
            return await gather(body)
        return classify_answer(answer.status, body, answer.retry_after)

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        limits: AttemptLimits,
        bounds: StreamBounds,
        protocol: str = "http",
    ) -> AgentStream:
        """POST ``body`` asking for an event stream; the answer once its head is in.

        On a connection of the lean pool, like a plain call (the same caps and line, guard,
        TLS and head bounds), which the stream holds for as long as the agent talks and reads
        as the caller takes it (:mod:`.streamconn`). An ``a2a`` agent is asked
        ``SendStreamingMessage`` (:class:`.a2a.StreamReading`), or plain ``SendMessage`` when it
        says it does not stream.
        """
        refused = self._refused(url)
        if refused is not None:
            raise ConnectFailed(f"the agent's endpoint is refused: {refused}")
        headers[HOPS_HEADER] = str(HOPS.get() + 1)
        if protocol == "a2a":
            reading = a2a.StreamReading()
            data, sent = a2a.send_message(body, streaming=True), a2a.headers(headers)
        else:
            reading, data, sent = None, body, dict(headers)
        sent.update({"Accept": EVENT_STREAM, "Accept-Encoding": "identity"})
        try:
            return await self._open_stream(url, data, sent, limits, bounds, reading)
        except AgentRejected as exc:
            if reading is None or exc.error.get("code") != a2a.UNSUPPORTED:
                raise
        return PlainStream(await self.send(url, body, headers, limits, protocol))

    async def _open_stream(
        self,
        url: str,
        data: bytes,
        sent: dict[str, str],
        limits: AttemptLimits,
        bounds: StreamBounds,
        reading: a2a.StreamReading | None,
    ) -> AgentStream:
        pool = self._pool
        if pool is None:
            raise RuntimeError("HttpTransport.open() was not awaited")
        # The pool's wait, the connect and the answer's head, all within the head's bound.
        head_s = min(limits.connect_s + limits.read_s, limits.total_s)
        due = asyncio.get_running_loop().time() + head_s
        try:
            conn, request = await pool.lease(url, sent, len(data), limits.connect_s, head_s)
        except (OSError, TimeoutError, *_POOL_ERRORS) as exc:
            raise stream_failure(exc, limits) from exc
        read = raw_piece if reading is None else a2a_piece(reading)
        stream = LeanAgentStream(pool, conn, bounds, read, self._head)
        opened: AgentStream | None = None
        try:
            try:
                await stream.open(request, data, due)
            except TimeoutError as exc:
                raise stream_failure(exc, limits) from exc
            opened = await self._opened(stream, reading)
        finally:
            if opened is not stream:  # refused, failed, cancelled or read whole: its connection goes
                await stream.aclose()
        return opened

    async def _opened(self, stream: LeanAgentStream, reading: a2a.StreamReading | None) -> AgentStream:
        """The stream of an answer whose head is in, or its plain answer, or its error."""
        reader = stream.reader
        status = reader.status
        if status == 429:
            raise busy(reader.retry_after)
        if status >= 500 and reading is None:
            raise BadAgentResponse(f"agent answered HTTP {status}")
        encoding = reader.encoding or b"identity"
        if encoding not in (b"", b"identity"):
            named = encoding[:32].decode("latin-1")
            raise BadAgentResponse(f"agent answered a {named}-encoded stream, asked for identity")
        if reader.events:
            return stream
        raw = await stream.whole()
        if reading is not None:
            return PlainStream(a2a.classify(status, raw))
        return PlainStream(classify_answer(status, raw))

    async def _post(self, url: str, body: bytes, headers: dict[str, str], limits: AttemptLimits) -> Answer:
        """POST ``body`` to ``url``: the whole answer, its errors mapped to the project's own.

        Connect timeout, read timeout (the head within it of the request, then between two reads
        of the body) and ``total_s`` (a hard ceiling on the whole attempt, on the event loop's
        clock); answers over the limit are RESPONSE_TOO_LARGE.
        """
        pool = self._pool
        if pool is None:
            raise RuntimeError("HttpTransport.open() was not awaited")
        try:
            return await pool.post(url, body, headers, limits.connect_s, limits.read_s, limits.total_s)
        except _POST_ERRORS as exc:
            raise _post_error(exc, limits) from exc

    def _refused(self, url: str) -> str | None:
        """Why the guard refuses ``url`` now (a literal address, a name, the allow-list), or None.

        The resolver only sees names; a literal address must be checked here. With a shared
        registry, an endpoint can reach the snapshot without passing the registration API.
        """
        try:
            self._guard.check_url(url)
        except OutboundRefused as exc:
            return exc.message
        return None

    async def probe(self, url: str, timeout_s: float) -> bool:
        if self._refused(url) is not None:
            return False
        try:
            async with self._http.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
            ) as resp:
                return 200 <= resp.status < 300
        except _QUIET:
            return False

    async def holds(self, url: str, timeout_s: float) -> bool:
        if self._refused(url) is not None:
            return False
        try:
            async with self._http.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
            ) as resp:
                if resp.status != 200:
                    return False
                body = await _read_whole(resp.content, HOLDS_LIMIT)
                if body is None:
                    return False
                answer = orjson.loads(body)
        except (*_QUIET, orjson.JSONDecodeError):
            return False
        return isinstance(answer, dict) and answer.get("holds") is True

    async def deliver(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        refused = self._refused(url)
        if refused is not None:
            raise DeliveryFailed(f"URL refused: {refused}")
        try:
            async with self._http.post(
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as resp:
                if resp.status >= 300:
                    raise DeliveryFailed(f"HTTP {resp.status}")
        except _QUIET as exc:
            raise DeliveryFailed(type(exc).__name__) from exc


# What the pool raises that an attempt maps to the project's own errors (:func:`_post_error`).
_POST_ERRORS = (
    lean.PoolTimeout,
    lean.ConnectTimeout,
    lean.BadUrl,
    ssl.SSLError,
    TimeoutError,
    HeadTooLarge,
    BrokenBody,
    Disconnected,
    lean.BadHeader,
    OSError,
)


def _post_error(exc: Exception, limits: AttemptLimits) -> Exception:  # noqa: PLR0911 - one per kind
    """The project's error for what the pool raised, tested in this order: a certificate error
    is an OSError and a ValueError too, and a timeout an OSError."""
    if isinstance(exc, lean.PoolTimeout | lean.ConnectTimeout | lean.BadUrl):
        return _pool_error(exc, limits)
    if isinstance(exc, ssl.SSLError):
        return ConnectFailed(tls_failure(exc))
    if isinstance(exc, TimeoutError):
        return AttemptTimeout(timeout_said(exc, limits))
    if isinstance(exc, HeadTooLarge):
        return BadAgentResponse(f"answer head refused: {exc}")
    if isinstance(exc, BrokenBody):
        return BadAgentResponse(f"broken response body: {exc}")
    if isinstance(exc, Disconnected):
        # After the request was written: the agent may have read it (see StaleConnection).
        return ConnectFailed(f"ServerDisconnected: {exc}", sent=True)
    if isinstance(exc, lean.BadHeader):
        return unsendable(exc)
    # Refused, reset, unreachable, a name that does not resolve (or only to refused addresses):
    # all network errors.
    refused = isinstance(exc, ConnectionRefusedError)
    return ConnectFailed(f"{type(exc).__name__}: {exc}", refused=refused)
