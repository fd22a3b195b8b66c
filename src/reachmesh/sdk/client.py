"""Callers' side: send a ReachRequest to the Router and get the ReachResponse back.

:class:`ReachClient` is async (one pooled aiohttp session); :class:`SyncReachClient` is the same
API for synchronous code. Both return the ReachResponse for every answer the Router gives,
errors included; they raise :class:`RouterUnavailable` only when there is no answer to return.

Both take one Router URL or several, comma-separated (see :mod:`reachmesh.sdk.routers`). Each
call goes to the Router that answered last; when a Router refuses the connection, or does not
accept it within :data:`CONNECT_S`, the call never reached it and goes to the next one. A call
that reached a Router is never sent again: it may have reached an agent.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import aiohttp
import httpx
from pydantic import ValidationError

from reachmesh import jsoncodec
from reachmesh.exceptions import RouterUnavailable
from reachmesh.protocol import PROTOCOL_VERSION, ReachResponse
from reachmesh.sdk.auth import auth_headers
from reachmesh.sdk.config import DEFAULT_ROUTER_URL
from reachmesh.sdk.routers import RouterList, split_router_urls
from reachmesh.sdk.streaming import EVENT_STREAM, ReachStream, SyncReachStream
from reachmesh.sdk.tls import router_verify

# The Router answers within the request's budget; this is how long to wait when none is given.
DEFAULT_WAIT_S = 60.0
# Slack over the budget for the Router's own answer to arrive.
SLACK_S = 2.0
# With several Routers: how long a connection may take before the next Router is tried.
CONNECT_S = 5.0


def router_url_from_env(url: str | Sequence[str] | None) -> str:
    """``url``, else ``REACH_ROUTER_URL``, else the default: one URL, or several comma-separated,
    or (as ``ReachAgent(router_url=...)`` takes them) a list; an empty list is refused."""
    if url is None or isinstance(url, str):  # a list, even an empty one, is the caller's own
        url = url or os.environ.get("REACH_ROUTER_URL") or DEFAULT_ROUTER_URL
    return ",".join(split_router_urls(url, what="the Router URL"))


def router_urls_from_env(url: str | Sequence[str] | None) -> list[str]:
    """:func:`router_url_from_env` as a list."""
    return router_url_from_env(url).split(",")


def build_request(  # noqa: PLR0913 - one keyword per envelope field a caller may set
    task: str,
    payload: dict[str, Any] | None = None,
    *,
    target_agent: str | None = None,
    timeout_ms: int | None = None,
    read_timeout_ms: int | None = None,
    connect_timeout_ms: int | None = None,
    conversation_id: str | None = None,
    filter_agent_ids: list[str] | None = None,
    strategy: str | None = None,
    trace_id: str | None = None,
    retry_count: int | None = None,
    context_bound: bool = False,
    source_agent: str | None = None,
) -> dict[str, Any]:
    """The ReachRequest envelope for one call, with only the keys that were given."""
    prefs: dict[str, Any] = {}
    for name, key, millis in (
        ("timeout_ms", "timeoutMs", timeout_ms),
        ("read_timeout_ms", "readTimeoutMs", read_timeout_ms),
        ("connect_timeout_ms", "connectTimeoutMs", connect_timeout_ms),
    ):
        if millis is None:
            continue
        if isinstance(millis, bool) or not isinstance(millis, int):
            # The Router refuses it too (protocol §5), but the client's own wait is worked out
            # from these first: say which option is wrong, not "unsupported operand type(s)".
            raise TypeError(f"{name} must be a whole number of milliseconds, got {millis!r}")
        prefs[key] = millis
    if filter_agent_ids is not None:
        prefs["filterAgentIds"] = filter_agent_ids
    if strategy is not None:
        prefs["strategy"] = strategy
    if retry_count is not None:
        prefs["retryCount"] = retry_count
    if context_bound:
        prefs["contextBound"] = True
    envelope: dict[str, Any] = {
        "version": PROTOCOL_VERSION,
        "targetTask": task,
        "payload": payload or {},
        "preferences": prefs,
    }
    for key, value in (
        ("traceId", trace_id),
        ("conversationId", conversation_id),
        ("sourceAgent", source_agent),
        ("targetAgent", target_agent),
    ):
        if value:
            envelope[key] = value
    return envelope


def prepare(
    task: str,
    payload: dict[str, Any] | None,
    headers: dict[str, str] | None,
    source_agent: str | None,
    options: dict[str, Any],
) -> tuple[bytes, dict[str, str], float]:
    """The body, headers and client-side wait of one call, shared by both clients."""
    options.setdefault("source_agent", source_agent)
    envelope = build_request(task, payload, **options)
    sent = {"Content-Type": "application/json", **(headers or {})}
    return jsoncodec.dumps(envelope), sent, _wait_s(options.get("timeout_ms"), options.get("read_timeout_ms"))


def _wait_s(timeout_ms: int | None, read_timeout_ms: int | None = None) -> float:
    if timeout_ms is not None:
        return timeout_ms / 1000 + SLACK_S
    if read_timeout_ms is not None:
        # No deadline given: the Router's default is the connect and read timeouts plus the retry
        # allowance (a second or two at the defaults), so a long read timeout waits that long.
        return max(DEFAULT_WAIT_S, 2 * read_timeout_ms / 1000 + SLACK_S)
    return DEFAULT_WAIT_S


def _connection_cap(max_connections: int | None) -> int | None:
    """A client's cap on its connections to the Router: None (none), or an integer >= 1."""
    if max_connections is None:
        return None
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be an integer >= 1 or None, not {max_connections!r}")
    return max_connections


def parse_response(status: int, raw: bytes) -> ReachResponse:
    """The ReachResponse in a Router answer; RouterUnavailable when it holds none."""
    try:
        return ReachResponse.model_validate(jsoncodec.loads(raw))
    except (jsoncodec.JSONDecodeError, ValidationError) as exc:
        raise RouterUnavailable(f"the Router answered HTTP {status} without a ReachResponse") from exc


class ReachClient:
    """Async client: ``await client.call("query_product_price", {...}, timeout_ms=4000)``.

    ``max_connections`` caps its connections to the Router; by default there is no cap here: a
    fan-out of a thousand calls goes out at once and the Router bounds what one client has in
    flight (``limits.max_inflight_per_client``, 429 past it). A cap in the client (aiohttp's 100)
    held the rest in this process, where their wait counted against their deadline and ended as
    ``RouterUnavailable`` for a Router that was fine.
    """

    def __init__(
        self,
        router_url: str | Sequence[str] | None = None,
        *,
        source_agent: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.routers = RouterList(router_url_from_env(router_url))
        self.source_agent = source_agent
        self._max_connections = _connection_cap(max_connections)
        # Read now, so a bad REACH_CA_FILE fails here and not at the first call.
        self._verify = router_verify()
        self._session: aiohttp.ClientSession | None = None

    @property
    def router_url(self) -> str:
        """The Router calls go to now (the one that answered last)."""
        return self.routers.current

    async def __aenter__(self) -> ReachClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        # Created lazily so that it belongs to the loop that first uses it.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._verify, limit=self._max_connections or 0),
                cookie_jar=aiohttp.DummyCookieJar(),
                headers=auth_headers(),
            )
        return self._session

    async def call(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> ReachResponse:
        """Send one request; see :func:`build_request` for the options."""
        body, sent, wait_s = prepare(task, payload, headers, self.source_agent, options)
        status, raw = await self._post("/reach", body, sent, wait_s)
        return parse_response(status, raw)

    def stream(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> ReachStream:
        """A streamed call (protocol §14): ``async with client.stream(task, payload) as s:``,
        ``async for chunk in s``, then ``s.response``. Same options as :meth:`call`."""
        body, sent, wait_s = prepare(task, payload, headers, self.source_agent, options)
        sent["Accept"] = EVENT_STREAM
        return ReachStream(lambda: _FirstRouter(self, body, sent, wait_s))

    async def _post(
        self, path: str, body: bytes, headers: dict[str, str], wait_s: float
    ) -> tuple[int, bytes]:
        """POST to the first Router of the list that takes the connection."""
        several = len(self.routers) > 1
        timeout = aiohttp.ClientTimeout(
            total=wait_s, sock_connect=min(CONNECT_S, wait_s) if several else None
        )
        urls = self.routers.order()
        for url in urls:
            try:
                async with self._http().post(
                    f"{url}{path}", data=body, headers=headers, timeout=timeout
                ) as resp:
                    raw = await resp.read()
                    self.routers.answered(url)
                    return resp.status, raw
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Never reached this Router: the next one may take it.
                self.routers.failed(url)
                if url is urls[-1]:
                    raise RouterUnavailable(_unreachable(self.routers, url, exc)) from exc
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise RouterUnavailable(lost_call(url, exc, wait_s)) from exc
        raise AssertionError("a Router list is never empty")


class SyncReachClient:
    """Blocking client with the same API as :class:`ReachClient` (``max_connections`` too: calls
    from many threads at once are not held back by a cap of the client's own by default)."""

    def __init__(
        self,
        router_url: str | Sequence[str] | None = None,
        *,
        source_agent: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.routers = RouterList(router_url_from_env(router_url))
        self.source_agent = source_agent
        limits = httpx.Limits(max_connections=_connection_cap(max_connections), max_keepalive_connections=20)
        self._http = httpx.Client(headers=auth_headers(), verify=router_verify(), limits=limits)

    @property
    def router_url(self) -> str:
        """The Router calls go to now (the one that answered last)."""
        return self.routers.current

    def __enter__(self) -> SyncReachClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> ReachResponse:
        """Send one request; see :func:`build_request` for the options."""
        body, sent, wait_s = prepare(task, payload, headers, self.source_agent, options)
        several = len(self.routers) > 1
        timeout = httpx.Timeout(wait_s, connect=min(CONNECT_S, wait_s)) if several else httpx.Timeout(wait_s)
        urls = self.routers.order()
        for url in urls:
            try:
                resp = self._http.post(f"{url}/reach", content=body, headers=sent, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Never reached this Router: the next one may take it.
                self.routers.failed(url)
                if url is urls[-1]:
                    raise RouterUnavailable(_unreachable(self.routers, url, exc)) from exc
                continue
            except httpx.HTTPError as exc:
                raise RouterUnavailable(lost_call(url, exc, wait_s)) from exc
            self.routers.answered(url)
            return parse_response(resp.status_code, resp.content)
        raise AssertionError("a Router list is never empty")

    def stream(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> SyncReachStream:
        """A streamed call: ``with client.stream(task, payload) as s: for chunk in s: ...``,
        then ``s.response``. Same options as :meth:`call`."""
        body, sent, wait_s = prepare(task, payload, headers, self.source_agent, options)
        sent["Accept"] = EVENT_STREAM
        return SyncReachStream(lambda: self._open_stream(body, sent, wait_s))

    @contextlib.contextmanager
    def _open_stream(self, body: bytes, headers: dict[str, str], wait_s: float) -> Iterator[httpx.Response]:
        """A streamed call's answer from the first Router of the list that takes the connection,
        as :meth:`call` sends it (a stream that reached a Router is never sent again)."""
        several = len(self.routers) > 1
        timeout = httpx.Timeout(wait_s, connect=min(CONNECT_S, wait_s)) if several else httpx.Timeout(wait_s)
        urls = self.routers.order()
        for url in urls:
            opening = self._http.stream(
                "POST", f"{url}/reach", content=body, headers=headers, timeout=timeout
            )
            try:
                resp = opening.__enter__()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.routers.failed(url)
                if url is urls[-1]:
                    raise RouterUnavailable(_unreachable(self.routers, url, exc)) from exc
                continue
            self.routers.answered(url)
            try:
                yield resp
            finally:
                opening.__exit__(None, None, None)
            return
        raise AssertionError("a Router list is never empty")


class _FirstRouter:
    """A streamed call's answer from the first Router of the client's list that takes the
    connection, as :meth:`ReachClient.call` sends it; :class:`.streaming.ReachStream` enters it
    and closes the answer itself."""

    def __init__(self, client: ReachClient, body: bytes, headers: dict[str, str], wait_s: float) -> None:
        self._client = client
        self._body = body
        self._headers = headers
        self._wait_s = wait_s

    async def __aenter__(self) -> aiohttp.ClientResponse:
        client, routers = self._client, self._client.routers
        # The deadline bounds the whole call; the Router's idle bound covers a quiet agent.
        several = len(routers) > 1
        timeout = aiohttp.ClientTimeout(
            total=self._wait_s, sock_connect=min(CONNECT_S, self._wait_s) if several else None
        )
        urls = routers.order()
        for url in urls:
            try:
                resp = await client._http().post(
                    f"{url}/reach", data=self._body, headers=self._headers, timeout=timeout
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                routers.failed(url)
                if url is urls[-1]:
                    raise RouterUnavailable(_unreachable(routers, url, exc)) from exc
                continue
            routers.answered(url)
            return resp
        raise AssertionError("a Router list is never empty")

    async def __aexit__(self, *exc: object) -> None:
        return None


def lost_call(url: str, exc: Exception, wait_s: float) -> str:
    """What a caller reads when a Router took the call and no answer came back: it may have
    reached an agent, which is why it went to no other Router (the caller decides)."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException | aiohttp.ServerTimeoutError):
        # The client's own bound, not the Router's: a Router whose policy gives the task a
        # longer read timeout (tasks.<task>.read_ms) answers later than a call without a deadline
        # is waited for.
        what = (
            f"sent no answer within {wait_s:g} s, this client's own wait (the call's timeout_ms "
            f"and {SLACK_S:g} s, or {DEFAULT_WAIT_S:g} s without one: give a slow task its timeout_ms)"
        )
    else:
        what = f"closed the connection before answering ({type(exc).__name__}: the Router stopped?)"
    return (
        f"the Router at {url} took the call and {what}; it may have reached an agent, "
        "so it was sent to no other Router: send it again only if doing it twice is safe"
    )


def _unreachable(routers: RouterList, url: str, exc: Exception) -> str:
    """What a caller reads when no Router of the list took the connection."""
    if len(routers) == 1:
        return f"cannot reach the Router at {url}: {exc!r}"
    return f"cannot reach any Router of {routers.describe()} (last: {exc!r})"
