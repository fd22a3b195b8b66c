"""Streamed answers (protocol §14): the attempts up to the first chunk, then the relay.

A caller that asks with ``Accept: text/event-stream`` is served by a :class:`StreamingRun`: the
same attempt loop as a plain request (admission, breakers, same-agent retry, failover), except
that an attempt asks the agent for a stream and succeeds once the agent's first piece (a chunk,
its ``done``, or a plain JSON answer) is read. Until then any failure fails over as usual.

From there :func:`relay` hands each chunk to the caller's :class:`StreamSink` as it is read;
the sink's write waits while the caller is slow, so the read from the agent waits too and
nothing gathers the answer. After the first chunk has gone out, a failure ends the stream: a
caller never gets chunks from two agents in one answer. The ending is written to the record
and encoded by :mod:`.answer`, like every other.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

from reachmesh import jsoncodec
from reachmesh.clock import Clock
from reachmesh.config import StreamingPolicy
from reachmesh.decision import MAX_CHUNK_MARKS, DecisionRecord, StreamRecord
from reachmesh.dispatch.attempts import CALLER_GONE, AttemptRun, attempt_verdict, cut_reason, overall_budget
from reachmesh.exceptions import (
    AgentDeadline,
    AgentRejected,
    AttemptError,
    AttemptTimeout,
    DeadlineExceeded,
    ReachError,
)
from reachmesh.routing.base import Choice
from reachmesh.sse import SseLimits
from reachmesh.transport.base import AttemptLimits
from reachmesh.transport.pieces import AgentStream, Chunk, Final, Piece, StreamBounds

STREAM_BROKEN = "STREAM_BROKEN"


class StreamSink(Protocol):
    """Where a streamed answer's chunks go: the caller's connection."""

    opened: bool  # a chunk (and so the stream's head) has been sent

    async def send_chunks(self, data: list[bytes]) -> None:
        """Send chunks (each one line of JSON) in order; returns once the caller's side took
        them (at once, unless the caller is behind)."""
        ...


class Opened(NamedTuple):
    """An attempt that got its agent's first piece: the stream is this agent's from now on."""

    stream: AgentStream
    first: Piece
    agent_id: str


def stream_limits(policy: StreamingPolicy) -> SseLimits:
    return SseLimits(policy.max_line_bytes, policy.max_event_bytes, policy.max_bytes)


def stream_broken(message: str) -> AgentRejected:
    """The error that ends a stream broken after its first chunk went out."""
    return AgentRejected({"code": STREAM_BROKEN, "message": message}, retryable=False)


class StreamingRun(AttemptRun):
    """The attempts of one streamed request: each opens a stream and reads its first piece."""

    streams = True
    # The loop time the opened stream's reads are bounded by: the request's deadline, as the
    # transport saw it (a read that timed out at it is the deadline, not an idle agent).
    stream_deadline = float("inf")

    def settle(self, ok: bool | None) -> None:
        """Book the opened stream's verdict once it has ended (True: it ended as the agent
        meant; False: the agent broke it; None: neither, the caller went away or its deadline
        passed) and give its slot at the agent back. A stream holds its slot to its end, so an
        agent's ``max_concurrency`` counts streams; and its verdict waits for the end, since a
        first chunk booked a success would clear the breaker's run of failures before each
        break."""
        if self.unsettled is None:
            return
        agent_id, took = self.unsettled
        self.unsettled = None
        self.parts.capacity.give(agent_id)
        self.parts.stats.finished(agent_id, ok=ok, latency_ms=took)
        if ok is None:
            self._release_probe(agent_id)
        else:
            self._judge(agent_id, ok)

    async def _send(self, choice: Choice, body: bytes, headers: dict[str, str], limits: AttemptLimits) -> Any:
        config = self.parts.config
        loop = asyncio.get_running_loop()
        bounds = StreamBounds(
            idle_s=config.streaming.idle_timeout_ms / 1000,
            deadline=loop.time() + max(self.deadline.remaining_ms(), 0.0) / 1000,
            sse=stream_limits(config.streaming),
            plain_limit=config.server.response_limit_bytes,
        )
        self.stream_deadline = bounds.deadline
        stream = await self.parts.transport.stream(
            choice.entry.endpoint, body, headers, limits, bounds, choice.entry.protocol
        )
        first: Piece | None = None
        try:
            first = await stream.next()
        finally:
            if first is None:  # failed or cancelled before its first piece: this agent is done
                await stream.aclose()
        return Opened(stream, first, choice.entry.id)


async def relay(
    opened: Opened, sink: StreamSink, record: DecisionRecord, run: StreamingRun
) -> tuple[Any, ReachError | None]:
    """Send the stream's chunks to ``sink`` as they are read: the result for the record (the
    agent's ``done`` result, if it gave one) and the error that ended the stream, if one did."""
    stats = record.stream if record.stream is not None else StreamRecord()
    record.stream = stats
    stream, piece = opened.stream, opened.first
    clock = run.parts.clock
    verdict: bool | None = None  # what the stream's end says of the agent (run.settle)
    # The deadline bounds the writes to the caller too: a caller that stops reading would hold
    # the agent's connection and its capacity slot for as long as its own connection stayed open.
    due = asyncio.get_running_loop().time() + max(run.deadline.remaining_ms(), 0.0) / 1000
    try:
        async with asyncio.timeout_at(due):
            if stream.plain:
                assert isinstance(piece, Final)
                # A plain answer to a streaming caller: its result as the one chunk (§14 mixed ends).
                await _emit([jsoncodec.dumps(piece.result)], sink, record, clock)
                stats.ended = "plain"
                verdict = True
                return None, None
            final = await _chunks(stream, piece, sink, record, clock)
        stats.ended = "done"
        verdict = True
        return (final.result if final.has_result else None), None
    except TimeoutError:
        stats.ended = "timeout"  # the caller's budget, spent writing to a caller that is behind
        late = DeadlineExceeded(overall_budget(run, "ran out mid-stream"))
        record.note("stream ended", f"{opened.agent_id} after {stats.chunks} chunks: {late.message}")
        return None, late
    except AttemptError as exc:
        error = _ending(exc, opened.agent_id, run)
        if isinstance(error, DeadlineExceeded):
            stats.ended = "timeout"  # the caller's budget, spent on an agent still talking
        elif error is exc:
            stats.ended = "agent_error"  # its done carried its error: judged as that answer
            verdict = attempt_verdict(exc)
        else:
            stats.ended = "broken"  # reset, idle, malformed: a failure of the agent's
            verdict = False
        record.note("stream ended", f"{opened.agent_id} after {stats.chunks} chunks: {error.message}")
        if record.attempts:
            # Booked SUCCESS at its first piece; the stream's end is the attempt's outcome, so
            # the done's attempts (and the attempts counted) never list a failed stream a success.
            record.attempts[-1].outcome = exc.reason
        return None, error
    except asyncio.CancelledError as exc:
        # The dispatcher says why it cancelled; a cancel without a word is the caller's watch.
        stats.ended = cut_reason(exc) or CALLER_GONE
        if record.attempts:
            record.attempts[-1].outcome = stats.ended
        raise
    finally:
        run.settle(verdict)
        await stream.aclose()


async def _chunks(
    stream: AgentStream, piece: Piece, sink: StreamSink, record: DecisionRecord, clock: Clock
) -> Final:
    """Send the stream's chunks from ``piece`` on; its final piece."""
    while isinstance(piece, Chunk):
        # The chunks already read (while the last write waited for a caller that is behind)
        # go out with this one, in one write.
        batch = [piece.raw]
        after: Piece | None = None
        for more in stream.ready():
            if isinstance(more, Chunk):
                batch.append(more.raw)
            else:
                after = more
        await _emit(batch, sink, record, clock)
        piece = after if after is not None else await stream.next()
    return piece


def _ending(exc: AttemptError, agent_id: str, run: StreamingRun) -> ReachError:
    """What a failure after the first chunk ends the request with: TIMEOUT at a deadline (the
    Router's, or the one the agent's done reports), the agent's own error from its done,
    STREAM_BROKEN for the rest (a reset, an idle agent, a malformed event, a bound)."""
    if run.deadline.remaining_ms() <= 0 or (
        # The read timed out at the deadline the transport was given: the Router's deadline,
        # whatever the request's own clock (read a moment apart from the loop's) says is left.
        type(exc) is AttemptTimeout and asyncio.get_running_loop().time() >= run.stream_deadline
    ):
        return DeadlineExceeded(overall_budget(run, "ran out mid-stream"))
    if isinstance(exc, AgentDeadline):
        return DeadlineExceeded(f"agent {agent_id} ended its stream at the deadline: {exc.message}")
    if isinstance(exc, AgentRejected):
        return exc  # the agent's done carried its error: its words, not ours
    if isinstance(exc, AttemptTimeout):
        return stream_broken(f"agent {agent_id} went idle: {exc.message}")
    return stream_broken(f"agent {agent_id}'s stream broke: {exc.message}")


async def _emit(chunks: list[bytes], sink: StreamSink, record: DecisionRecord, clock: Clock) -> None:
    await sink.send_chunks(chunks)
    stats = record.stream
    assert stats is not None
    run_ms = round((clock.monotonic() - record.started) * 1000, 2)
    if stats.first_chunk_ms is None:
        stats.first_chunk_ms = run_ms
    stats.last_chunk_ms = run_ms
    stats.chunks += len(chunks)
    stats.bytes += sum(map(len, chunks))
    # One mark per chunk, as the waterfall draws them; chunks sent in one write share its time.
    room = MAX_CHUNK_MARKS - len(stats.marks_ms)
    if room > 0:
        stats.marks_ms.extend([run_ms] * min(room, len(chunks)))
