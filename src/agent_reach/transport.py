"""One pooled HTTP client that sends a request to an agent and classifies the outcome.

This is the edge where the HTTP client's errors become :class:`AttemptError` subclasses, so the
dispatcher decides retry and failover from ``reason`` and ``retryable`` alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from agent_reach.exceptions import (
    AgentRejected,
    AttemptTimeout,
    BadAgentResponse,
    ConnectFailed,
)

DEFAULT_RESPONSE_LIMIT = 8 * 1024 * 1024
RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"


class Transport:
    """Sends ReachRequests to agents over one shared ``aiohttp.ClientSession``.

    The session must be created inside the running loop, so :meth:`open` is called at start-up.
    """

    def __init__(self, *, pool_size: int = 1024, response_limit: int = DEFAULT_RESPONSE_LIMIT) -> None:
        self._pool_size = pool_size
        self._response_limit = response_limit
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
                # Agents answer with JSON; no cookies are ever kept between strangers.
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Transport.open() was not awaited")
        return self._session

    async def send(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        connect_s: float,
        read_s: float,
        total_s: float,
    ) -> Any:
        """POST ``body`` to ``url`` and return the agent's ``result``.

        ``total_s`` is a hard ceiling on the whole attempt, on the event loop's clock: aiohttp's
        own read timer only starts once the request is written, which under load is late.
        Raises ConnectFailed, AttemptTimeout, BadAgentResponse or AgentRejected.
        """
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s)
        try:
            async with (
                asyncio.timeout(total_s),
                self.session.post(
                    url, data=body, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp,
            ):
                raw = await self._read(resp)
                status = resp.status
        except aiohttp.ConnectionTimeoutError as exc:
            raise ConnectFailed(f"connect timeout after {connect_s * 1000:.0f} ms") from exc
        except TimeoutError as exc:  # aiohttp's read timeouts subclass it, as does the ceiling
            raise AttemptTimeout(f"no answer within {min(read_s, total_s) * 1000:.0f} ms") from exc
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            raise ConnectFailed(f"{type(exc).__name__}: {exc}", refused=refused) from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            # Reset, unreachable, or the server hung up: all network errors.
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientPayloadError as exc:
            raise BadAgentResponse(f"broken response body: {exc}") from exc
        return self._classify(status, raw)

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole answer body, or :class:`AgentRejected` once it passes the limit.

        ``StreamReader.read(n)`` returns whatever is buffered (often 64 KiB), not ``n`` bytes, so
        the body is gathered chunk by chunk until EOF. An answer over the limit is the agent's
        fault, not the network's: it is refused as ``RESPONSE_TOO_LARGE`` and the breaker is not
        charged.
        """
        limit = self._response_limit
        length = resp.content_length
        if length is not None and length > limit:
            raise _too_large(f"the agent's answer of {length} bytes is over the {limit}-byte limit")
        chunks: list[bytes] = []
        received = 0
        async for chunk in resp.content.iter_any():
            received += len(chunk)
            if received > limit:
                raise _too_large(f"the agent's answer is over the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _classify(status: int, raw: bytes) -> Any:
        if status >= 500:
            raise BadAgentResponse(f"agent answered HTTP {status}")
        try:
            answer = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            answer = None
        if 400 <= status < 500:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise AgentRejected(_normalise_error(error, f"agent answered HTTP {status}"), retryable=False)
        if not isinstance(answer, dict):
            raise BadAgentResponse(f"agent answered HTTP {status} without a JSON object")
        outcome = answer.get("status")
        if outcome == "SUCCESS":
            return answer.get("result")
        if outcome == "AGENT_ERROR":
            error = _normalise_error(answer.get("error"), "the agent reported an error")
            if error["code"] == "DEADLINE_EXCEEDED":
                # The SDK gave up at the deadline we sent it: that is this attempt timing out.
                raise AttemptTimeout(error["message"])
            raise AgentRejected(error, retryable=error.get("retryable") is True)
        raise BadAgentResponse(f"agent answered an unknown status {str(outcome)[:64]!r}")


def _too_large(message: str) -> AgentRejected:
    return AgentRejected({"code": RESPONSE_TOO_LARGE, "message": message}, retryable=False)


def _normalise_error(error: Any, fallback: str) -> dict[str, Any]:
    """An agent's error object with at least ``code`` and ``message``."""
    if not isinstance(error, dict):
        return {"code": "AGENT_ERROR", "message": fallback}
    out = dict(error)
    out["code"] = str(out.get("code") or "AGENT_ERROR")
    out["message"] = str(out.get("message") or fallback)
    return out
