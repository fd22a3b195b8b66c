"""Streaming on both sides of the SDK (protocol §14).

Agent side: a capability handler that is an async generator streams; each ``yield`` is one
``chunk`` event, sent as it is yielded, and its end is the ``done`` event. A caller that asked
for no stream gets the list of the values, as one plain answer. Raising :class:`AgentError` or
:class:`Decline` inside the generator ends the stream with that answer in ``done``.

Caller side: :class:`ReachStream` (async) and :class:`SyncReachStream` read the Router's event
stream: iterate them for the chunks' values, then read ``response`` for the ReachResponse. Leaving
the ``with`` block (or cancelling the task that iterates) closes the call, and the Router closes
the agent's connection in turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from pydantic import ValidationError

from reachmesh import jsoncodec
from reachmesh.deadline import Deadline
from reachmesh.exceptions import RouterUnavailable
from reachmesh.protocol import ReachResponse
from reachmesh.sse import SseError, SseEvent, SseLimits, SseParser, accepts_event_stream, encode_event

log = logging.getLogger("reachmesh.sdk")

EVENT_STREAM = "text/event-stream"
# What a caller accepts from the Router: the Router's own bounds are the policy's; these keep a
# caller safe from a Router (or something in its place) that would send without end.
CALLER_LIMITS = SseLimits(max_line=64 * 1024 * 1024, max_event=64 * 1024 * 1024, max_total=1 << 40)

# --------------------------------------------------------------------------- agent side


def wants_stream(request: web.Request) -> bool:
    return accepts_event_stream(request.headers.get("Accept"))


ErrorAnswer = Callable[[BaseException], dict[str, Any] | None]


async def gather_values(values: AsyncIterator[Any], deadline: Deadline | None) -> list[Any]:
    """Every value of a streaming handler, for a caller that asked for no stream."""
    out: list[Any] = []
    async with asyncio.timeout(_seconds_left(deadline)):
        async for value in values:
            out.append(value)
    return out


async def send_stream(
    request: web.Request,
    values: AsyncIterator[Any],
    deadline: Deadline | None,
    error_answer: ErrorAnswer,
) -> tuple[web.StreamResponse, str]:
    """Send each value as a ``chunk`` as it is yielded, then ``done``; the response and its
    outcome label. ``error_answer`` turns an exception from the handler into its ``done``
    answer (None: not the handler's, re-raise)."""
    response = web.StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache"})
    await response.prepare(request)
    answer: dict[str, Any] = {"status": "SUCCESS"}
    outcome = "success"
    scope = asyncio.timeout(_seconds_left(deadline))
    watch = _CallerWatch(request)
    try:
        async with scope:
            if not await _write_values(response, values):
                return response, "caller_gone"
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        watch.task.uncancel()  # our own cancel, not the server's: the stream ends here
        return response, "caller_gone"
    except TimeoutError as exc:
        if scope.expired():
            answer = _error("AGENT_ERROR", "DEADLINE_EXCEEDED", "the handler ran past the request's deadline")
            outcome = "deadline_exceeded"
        else:  # the handler's own call timed out, well within the request's deadline
            answer, outcome = _failure(exc, error_answer)
    except _NotJson as exc:
        log.error("a streaming handler yielded something that is not JSON: %s", exc)
        answer = _error("AGENT_ERROR", "HANDLER_FAILED", "the handler yielded a value that is not JSON")
        outcome = "handler_failed"
    except Exception as exc:  # noqa: BLE001 - the handler's own failure ends its stream, answered (logged)
        answer, outcome = _failure(exc, error_answer)
    finally:
        watch.stop()
        aclose = getattr(values, "aclose", None)
        if aclose is not None:
            await aclose()
    try:
        await response.write(encode_event("done", jsoncodec.dumps(answer)))
        await response.write_eof()
    except ConnectionResetError:
        return response, "caller_gone"
    return response, outcome


async def _write_values(response: web.StreamResponse, values: AsyncIterator[Any]) -> bool:
    """Each value as a ``chunk`` as it is yielded; False once the Router (its caller) has gone:
    stop generating, nobody is left to answer. Only a failed write says so here: the handler's
    own reset is its failure."""
    async for value in values:
        try:
            await response.write(encode_event("chunk", _encoded(value)))
        except ConnectionResetError:
            return False
    return True


# How often a stream looks at its caller's connection while the handler thinks: the Router
# closes an agent's connection within a second of its caller leaving, and the handler should stop
# as soon after that.
CALLER_WATCH_S = 0.25


async def unless_caller_left(
    request: web.Request, work: Awaitable[tuple[web.StreamResponse, str]]
) -> tuple[web.StreamResponse, str]:
    """``work`` (a plain handler's run), cancelled once the Router's connection closes: a Router
    whose caller left closes it at once, and the handler should stop as soon after that. Then an
    answer nobody reads, with no body (so no repeat is given it), labelled ``caller_gone``."""
    watch = _CallerWatch(request)
    try:
        return await work
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        watch.task.uncancel()  # our own cancel, not the server's: the call ends here
        return web.StreamResponse(status=503), "caller_gone"
    finally:
        watch.stop()


class _CallerWatch:
    """Cancels the handler's task once the Router's connection has closed: a generator that
    waits between values (a model thinking before its next token) would otherwise run on, and
    keep what it holds, until its next write fails or its deadline passes (the server does not
    cancel a handler whose client left). One timer per stream, looking at the transport."""

    __slots__ = ("_handle", "_request", "fired", "task")

    def __init__(self, request: web.Request) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.fired = False
        self._request = request
        self._handle = asyncio.get_running_loop().call_later(CALLER_WATCH_S, self._look)

    def _look(self) -> None:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            self.fired = True
            self.task.cancel()
            return
        self._handle = asyncio.get_running_loop().call_later(CALLER_WATCH_S, self._look)

    def stop(self) -> None:
        self._handle.cancel()


def _failure(exc: Exception, error_answer: ErrorAnswer) -> tuple[dict[str, Any], str]:
    """The done answer and outcome label of a handler that raised ``exc``."""
    known = error_answer(exc)
    if known is None:
        log.exception("a streaming handler failed", exc_info=exc)
        known = _error("AGENT_ERROR", "HANDLER_FAILED", f"{type(exc).__name__}: {exc}"[:500])
    return known, "handler_failed" if known.get("status") == "AGENT_ERROR" else "declined"


class _NotJson(Exception):
    """A streaming handler yielded a value that JSON cannot carry."""


def _encoded(value: Any) -> bytes:
    try:
        return jsoncodec.dumps(value)
    except TypeError as exc:
        raise _NotJson(str(exc)) from exc


def _error(status: str, code: str, message: str) -> dict[str, Any]:
    return {"status": status, "error": {"code": code, "message": message, "retryable": False}}


def _seconds_left(deadline: Deadline | None) -> float | None:
    return None if deadline is None else max(deadline.remaining_ms(), 0) / 1000


# --------------------------------------------------------------------------- caller side


def _final(raw: str) -> ReachResponse:
    try:
        return ReachResponse.model_validate(jsoncodec.loads(raw))
    except (jsoncodec.JSONDecodeError, ValidationError) as exc:
        raise RouterUnavailable("the Router's done event holds no ReachResponse") from exc


class _Events:
    """The caller's reading of one answer: chunks' values in, the final response kept."""

    def __init__(self) -> None:
        self.parser = SseParser(CALLER_LIMITS)
        self.response: ReachResponse | None = None
        self.chunks = 0

    def values(self, data: bytes) -> list[Any]:
        try:
            events = self.parser.feed(data)
        except SseError as exc:
            raise RouterUnavailable(f"the Router's event stream is broken: {exc}") from exc
        return [value for event in events for value in self._take(event)]

    def _take(self, event: SseEvent) -> list[Any]:
        if self.response is not None:
            return []
        if event.event == "chunk":
            self.chunks += 1
            try:
                return [jsoncodec.loads(event.data)]
            except jsoncodec.JSONDecodeError as exc:
                raise RouterUnavailable("the Router sent a chunk that is not JSON") from exc
        if event.event == "done":
            self.response = _final(event.data)
        return []

    def broken(self, exc: Exception) -> str:
        """Why a stream that lost its connection raised: the library's words say less than
        where it broke (the Router went away mid-answer)."""
        return (
            f"the Router's stream broke after {self.chunks} chunk(s), before its done event "
            f"({type(exc).__name__}: the Router stopped, or the connection to it was cut); "
            "the call was sent to no other Router"
        )

    def ended(self) -> None:
        if self.response is None:
            raise RouterUnavailable("the Router's event stream ended without its done event")


class ReachStream:
    """One streamed call (``async with client.stream(...) as s: async for chunk in s: ...``);
    ``response`` is the ReachResponse once the chunks are read."""

    def __init__(self, open_call: Callable[[], Any]) -> None:
        self._open_call = open_call
        self._context: Any = None
        self._resp: aiohttp.ClientResponse | None = None
        self._events = _Events()

    @property
    def response(self) -> ReachResponse:
        if self._events.response is None:
            raise RuntimeError("the stream has not been read to its end")
        return self._events.response

    async def __aenter__(self) -> ReachStream:
        try:
            self._context = self._open_call()
            self._resp = await self._context.__aenter__()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RouterUnavailable(f"cannot reach the Router: {exc!r}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the call; the Router closes the agent's connection in turn."""
        if self._resp is not None:
            self._resp.close()
            self._resp = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        if self._resp is None:
            await self.__aenter__()
        resp = self._resp
        assert resp is not None
        try:
            if resp.content_type != EVENT_STREAM:
                # Refused before any chunk: a plain ReachResponse, with its HTTP status.
                self._events.response = _plain(resp.status, await resp.read())
                return
            async for data in resp.content.iter_any():
                for value in self._events.values(data):
                    yield value
                if self._events.response is not None:
                    return
            self._events.ended()
        except (aiohttp.ClientError, OSError) as exc:
            raise RouterUnavailable(self._events.broken(exc)) from exc
        finally:
            if self._events.response is None:
                await self.aclose()


class SyncReachStream:
    """The blocking twin of :class:`ReachStream` (``with client.stream(...) as s: for ...``)."""

    def __init__(self, open_call: Callable[[], Any]) -> None:
        self._open_call = open_call
        self._context: Any = None
        self._resp: httpx.Response | None = None
        self._events = _Events()

    @property
    def response(self) -> ReachResponse:
        if self._events.response is None:
            raise RuntimeError("the stream has not been read to its end")
        return self._events.response

    def __enter__(self) -> SyncReachStream:
        try:
            self._context = self._open_call()
            self._resp = self._context.__enter__()
        except httpx.HTTPError as exc:
            raise RouterUnavailable(f"cannot reach the Router: {exc!r}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = None
            self._resp = None

    def __iter__(self) -> Iterator[Any]:
        if self._resp is None:
            self.__enter__()
        resp = self._resp
        assert resp is not None
        try:
            if not resp.headers.get("content-type", "").startswith(EVENT_STREAM):
                self._events.response = _plain(resp.status_code, resp.read())
                return
            for data in resp.iter_raw():
                yield from self._events.values(data)
                if self._events.response is not None:
                    return
            self._events.ended()
        except httpx.HTTPError as exc:
            raise RouterUnavailable(self._events.broken(exc)) from exc
        finally:
            if self._events.response is None:
                self.close()


def _plain(status: int, raw: bytes) -> ReachResponse:
    try:
        return ReachResponse.model_validate(jsoncodec.loads(raw))
    except (jsoncodec.JSONDecodeError, ValidationError) as exc:
        raise RouterUnavailable(f"the Router answered HTTP {status} without a ReachResponse") from exc


__all__ = ["ReachStream", "SyncReachStream", "gather_values", "send_stream", "wants_stream"]
