"""The pieces of a streamed answer and the contract of a stream (protocol §14), free of any HTTP
client: the transport contract (:mod:`.base`) names them, :mod:`.streaming` reads them from the
wire, and the Router's relay consumes them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from reachmesh import jsoncodec
from reachmesh.sse import SseLimits


class Chunk(NamedTuple):
    """One piece of the result: its JSON text, checked, on one line (as the caller gets it)."""

    raw: bytes

    @property
    def value(self) -> Any:
        return jsoncodec.loads(self.raw)


class Final(NamedTuple):
    """The agent's ``done`` with SUCCESS (or a plain JSON answer, all of it)."""

    result: Any
    has_result: bool


Piece = Chunk | Final


class StreamBounds(NamedTuple):
    """What bounds one streamed answer, beside the attempt's connect and head timeouts."""

    idle_s: float  # the longest wait for the next bytes of the stream
    deadline: float  # the request's deadline, on the event loop's clock
    sse: SseLimits
    plain_limit: int  # a plain JSON answer's bytes (the Router's answer limit)


class AgentStream(Protocol):
    """One agent's answer, piece by piece."""

    plain: bool  # the agent answered plain JSON: one Final piece

    async def next(self) -> Piece:
        """The next piece; raises an AttemptError when the stream fails."""
        ...

    def ready(self) -> list[Piece]:
        """The pieces already read, up to and with the final one, without waiting (the relay
        sends them to a caller that is behind in one write); an error found on the way is
        raised by the next :meth:`next`, after them."""
        ...

    async def aclose(self) -> None:
        """Close the connection to the agent (at once: an unread stream is not drained)."""
        ...


class PlainStream:
    """A whole answer that is already read: one Final piece."""

    plain = True

    def __init__(self, result: Any) -> None:
        self._result = result

    async def next(self) -> Piece:
        return Final(self._result, True)

    def ready(self) -> list[Piece]:
        return []

    async def aclose(self) -> None:
        return None


__all__ = ["AgentStream", "Chunk", "Final", "Piece", "PlainStream", "StreamBounds"]
