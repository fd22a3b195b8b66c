"""An in-process transport with faults on command: the test double of the HTTP edge.

No sockets: each agent is a :class:`FakeEndpoint` keyed by its URL, which answers from a script
of outcomes. Answers go through the same :func:`~reachmesh.transport.base.classify_answer` as
real HTTP answers, so an ``http500`` or a ``garbage`` answer is classified exactly as the Router
would classify it on the wire. With a :class:`~reachmesh.clock.ManualClock`, an endpoint's
``latency_s`` moves the clock instead of sleeping, so deadline tests take no time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from reachmesh import jsoncodec
from reachmesh.clock import ManualClock
from reachmesh.exceptions import AttemptTimeout, ConnectFailed, DeliveryFailed
from reachmesh.transport.base import AttemptLimits, busy, classify_answer, too_large
from reachmesh.transport.pieces import AgentStream, PlainStream, StreamBounds

Fault = Literal[
    "refused",
    "reset",
    "connect_timeout",
    "timeout",
    "http500",
    "garbage",
    "error",
    "retryable_error",
    "too_large",
    "busy",
]


# The Retry-After of a scripted "busy" answer.
BUSY_RETRY_AFTER = b"2"


@dataclass(frozen=True, slots=True)
class Answer:
    """A scripted successful answer."""

    result: Any


Outcome = Answer | Fault


@dataclass
class FakeEndpoint:
    """One agent (or ``replyTo`` listener) on the fake transport."""

    url: str
    default: Outcome = field(default_factory=lambda: Answer({"ok": True}))
    latency_s: float = 0.0
    healthy: bool = True
    conversations: set[str] = field(default_factory=set)
    script: deque[Outcome] = field(default_factory=deque)
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    delivered: list[bytes] = field(default_factory=list)
    probes: int = 0
    holds_asked: list[str] = field(default_factory=list)

    def then(self, *outcomes: Outcome) -> FakeEndpoint:
        """Answer the next requests with ``outcomes``, in order, then with ``default`` again."""
        self.script.extend(outcomes)
        return self

    def next_outcome(self) -> Outcome:
        return self.script.popleft() if self.script else self.default


class FakeTransport:
    """The transport contract over :class:`FakeEndpoint`s; unknown URLs refuse connections."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self.endpoints: dict[str, FakeEndpoint] = {}
        self.opened = False

    def endpoint(self, url: str, **settings: Any) -> FakeEndpoint:
        """The endpoint at ``url``, created on first use with ``settings``."""
        found = self.endpoints.get(url)
        if found is None:
            found = self.endpoints[url] = FakeEndpoint(url, **settings)
        return found

    async def open(self) -> None:
        self.opened = True

    async def close(self) -> None:
        self.opened = False

    async def _spend(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.clock is not None:
            self.clock.advance(seconds)
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(seconds)

    async def send(
        self, url: str, body: bytes, headers: dict[str, str], limits: AttemptLimits, protocol: str = "http"
    ) -> Any:
        # Scripted endpoints answer the same whatever the wire format: the protocol is not faked.
        target = self.endpoints.get(url)
        if target is None:
            raise ConnectFailed(f"nothing listens at {url}", refused=True)
        target.received.append(jsoncodec.loads(body))
        target.headers.append(dict(headers))
        outcome = target.next_outcome()
        budget = min(limits.read_s, limits.total_s)
        if outcome == "timeout" or target.latency_s > budget:
            await self._spend(budget)
            raise AttemptTimeout(f"no answer within {budget * 1000:.0f} ms")
        await self._spend(target.latency_s)
        return _answer(outcome)

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        limits: AttemptLimits,
        bounds: StreamBounds,
        protocol: str = "http",
    ) -> AgentStream:
        """A scripted answer is a plain one: one piece (streams are tested on real sockets)."""
        return PlainStream(await self.send(url, body, headers, limits, protocol))

    async def probe(self, url: str, timeout_s: float) -> bool:
        for target in self.endpoints.values():
            if url.startswith(target.url.split("/reach")[0]):
                target.probes += 1
                return target.healthy
        return False

    async def holds(self, url: str, timeout_s: float) -> bool:
        base, _, conversation = url.rpartition("/conversations/")
        target = self.endpoints.get(base)
        if target is None:
            return False
        target.holds_asked.append(conversation)
        return conversation in target.conversations

    async def deliver(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        target = self.endpoints.get(url)
        if target is None or not target.healthy:
            raise DeliveryFailed("ConnectionRefused")
        target.delivered.append(body)


def _answer(outcome: Outcome) -> Any:
    """The result of a scripted outcome, or the error the real transport would raise for it."""
    if isinstance(outcome, Answer):
        return outcome.result
    if outcome in ("refused", "reset", "connect_timeout"):
        raise ConnectFailed(f"fake {outcome}", refused=outcome == "refused")
    if outcome == "too_large":
        raise too_large("the agent's answer is over the limit")
    if outcome == "busy":  # the SDK's answer past its max_concurrency: 429 AGENT_BUSY, Retry-After
        raise busy(BUSY_RETRY_AFTER)
    raw = {
        "http500": (500, b"boom"),
        "garbage": (200, b"<html>not json</html>"),
        "error": (200, b'{"status":"AGENT_ERROR","error":{"code":"FAKE","message":"failed on purpose"}}'),
        "retryable_error": (
            200,
            b'{"status":"AGENT_ERROR","error":{"code":"FAKE","message":"try again","retryable":true}}',
        ),
    }[outcome]
    return classify_answer(*raw)
