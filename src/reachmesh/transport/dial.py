"""Opening one TCP connection, and sending its SYN again sooner than the kernel would.

An agent whose accept queue is full (a burst of calls at an agent that accepts slower than they
come: a listen backlog is 128 in aiohttp and uvicorn) drops the SYNs that find it full, and
Linux sends a dropped SYN again only after 1 s, then 2 s later. A burst's connections then waited
for the kernel's resend while the agent had long caught up: the calls through the Router reached
the agent seconds after a direct burst's did.

So a connect that has had no answer for a few times as long as this agent's connects take (the
least of them lately, so never less than its round trip) is taken for a dropped SYN: its socket
is closed and the connect begins again at once, with a new SYN. That applies only where the
agent has had quick connects of ours already (on loopback or a LAN, well under the kernel's
first resend): a far agent, or one not yet connected to, is left to the kernel. The resends are
paced by the pool (at most ``outbound.max_connecting_per_agent`` connects to one agent at once)
and bounded by the connect timeout; they are the pool's own doing, never charged to the agent.

The socket is opened here rather than by ``loop.create_connection``, so that when the resend is
due the kernel can be asked whether the connect has in fact completed: an event loop runs its
due timers before it polls for I/O, and a busy one would otherwise close connections the kernel
had made (a wasted accept at the agent, and a new SYN at a full queue).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import select
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# A connect unanswered for this many times the agent's quickest recent connect is resent...
RESEND_FACTOR = 4.0
# ...but never sooner than this: a busy Router's loop notices a completed connect late, and a
# resend costs the agent nothing only while its queue is full.
RESEND_FLOOR_S = 0.1
# Where that would be later than this, the kernel's own resend (1 s) is left to do it: the agent
# is far, and the network, not its accept queue, may be what dropped the SYN.
RESEND_CEILING_S = 0.5
# The quickest connect is forgotten after this long, so a route that got slower is learned.
WINDOW_S = 30.0
# When a name has several addresses, each one's head start over the next (RFC 8305's
# "Connection Attempt Delay").
STAGGER_S = 0.25
# Targets remembered; past it the table starts again (endpoints come from the registry).
_MAX_TARGETS = 4096


class ConnectTimes:
    """The quickest recent connect per target, and when a connect to it is taken for lost."""

    __slots__ = ("_best",)

    def __init__(self) -> None:
        self._best: dict[object, tuple[float, float]] = {}  # target: (quickest, since)

    def learn(self, key: object, took_s: float, now: float) -> None:
        """A connect to ``key`` completed after ``took_s`` (its own SYN's, not a resend's)."""
        best = self._best.get(key)
        if best is None or now - best[1] > WINDOW_S:
            if best is None and len(self._best) >= _MAX_TARGETS:
                self._best.clear()
            self._best[key] = (took_s, now)
        elif took_s < best[0]:
            self._best[key] = (took_s, best[1])

    def resend_after(self, key: object) -> float | None:
        """How long a connect to ``key`` may go unanswered before its SYN is sent again; None:
        leave it to the kernel (no quick connect known)."""
        best = self._best.get(key)
        if best is None:
            return None
        wait = max(RESEND_FLOOR_S, RESEND_FACTOR * best[0])
        return wait if wait <= RESEND_CEILING_S else None

    def forget(self) -> None:
        self._best.clear()


def _done(waiter: asyncio.Future[bool], answered: bool) -> None:
    if not waiter.done():
        waiter.set_result(answered)


def _writable(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    return bool(poller.poll(0))


async def connect(
    loop: asyncio.AbstractEventLoop, address: str, port: int, resend_s: float | None
) -> socket.socket | None:
    """A non-blocking socket connected to ``address``:``port``, or None when the connect had no
    answer within ``resend_s`` (its socket closed: the caller connects again). Connect errors
    are the ``OSError`` the errno names (``ConnectionRefusedError`` for a refusal)."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    connected = False
    try:
        sock.setblocking(False)
        code: int | None = sock.connect_ex((address, port))
        if code in (errno.EINPROGRESS, errno.EAGAIN):
            # On loopback the handshake is done by the time connect returns: no wait on the loop
            # (and the time learnt is the connect's, not the loop's lag).
            if _writable(sock):
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            else:
                code = await _answered(loop, sock, resend_s)
        if code:
            raise OSError(code, f"Connect call failed ({address!r}, {port}): {os.strerror(code)}")
        connected = code == 0
    finally:
        if not connected:
            sock.close()
    return sock if connected else None


async def _answered(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, resend_s: float | None
) -> int | None:
    """Wait for the connect under way on ``sock``: its error code (0: connected), or None when
    ``resend_s`` passed first and the kernel says it has not completed."""
    fd = sock.fileno()
    waiter: asyncio.Future[bool] = loop.create_future()
    loop.add_writer(fd, _done, waiter, True)
    timer = loop.call_later(resend_s, _done, waiter, False) if resend_s is not None else None
    try:
        answered = await waiter
    finally:
        loop.remove_writer(fd)
        if timer is not None:
            timer.cancel()
    # The timer may have come first while the connect had completed, unseen by a loop that
    # runs due timers before it polls: the kernel's word decides.
    if not answered and not _writable(sock):
        return None
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def interleave(addresses: list[str]) -> list[str]:
    """The addresses alternating between IPv6 and IPv4, the resolver's first choice first."""
    six = [a for a in addresses if ":" in a]
    four = [a for a in addresses if ":" not in a]
    first, second = (six, four) if ":" in addresses[0] else (four, six)
    out: list[str] = []
    for pair in itertools.zip_longest(first, second):
        out.extend(a for a in pair if a is not None)
    return out


async def race(
    loop: asyncio.AbstractEventLoop,
    addresses: list[str],
    dial_one: Callable[[str], Awaitable[T]],
    drop: Callable[[T], object],
) -> T:
    """Happy eyeballs: each address gets a head start of STAGGER_S over the next (less if it
    fails sooner), the first connection made wins and the others are dropped, so a
    black-holed address costs STAGGER_S, not the whole connect timeout."""
    waiting = list(addresses)
    racing: set[asyncio.Task[T]] = set()
    last: BaseException | None = None

    def drop_loser(task: asyncio.Task[T]) -> None:
        # A connection that won too late (or beside the winner) is closed, never leaked.
        if not task.cancelled() and task.exception() is None:
            drop(task.result())

    try:
        while waiting or racing:
            if waiting:
                racing.add(loop.create_task(dial_one(waiting.pop(0))))  # type: ignore[arg-type]
            done, racing = await asyncio.wait(
                racing, timeout=STAGGER_S if waiting else None, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                last = task.exception()
                if last is None or not isinstance(last, OSError) or isinstance(last, ssl.SSLError):
                    racing |= done - {task}  # any other winner of this round is dropped
                    return task.result()  # the winner, or the error that ends the race
    finally:
        for task in racing:
            task.cancel()
            task.add_done_callback(drop_loser)
    assert last is not None
    raise last


__all__ = ["STAGGER_S", "ConnectTimes", "connect", "interleave", "race"]
