"""A list of Routers for one service: which to use now, which to skip for a while.

Everywhere a Router URL is taken (``REACH_ROUTER_URL``, ``router.url`` in ``reach_config.yaml``,
``ReachAgent``, ``ReachClient``, the bridges' ``--router``) a comma-separated list is taken too:
``http://10.0.0.1:7200,http://10.0.0.2:7200``. One URL is a list of one and behaves as before.
A name that resolves to several addresses needs no list: the HTTP clients try each address of a
name in turn when a connection is refused.

The list keeps a *current* Router, the one that last answered: work stays on it while it does,
so an agent's renewals and a client's calls do not hop between Routers for nothing. A Router
that fails (its connection refused or timed out) is skipped for a pause that doubles with each
failure in a row, up to :data:`SKIP_CAP_S`, then tried again; a Router in its pause is still
tried, last, when every other one has failed too, so a list never runs dry.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.exceptions import ConfigError

# A failed Router is skipped for about SKIP_FIRST_S, doubling with each failure in a row.
SKIP_FIRST_S = 0.5
SKIP_CAP_S = 30.0
# Enough for any real deployment; a bound on what a (possibly mistaken) variable can make us hold.
MAX_ROUTERS = 32

# Jitter from a private generator: it must not share or disturb the process-wide `random`.
_jitter = random.Random()


def split_router_urls(value: str | Sequence[object], *, what: str = "router URL") -> list[str]:
    """The URLs in ``value`` (comma-separated, or a list of them: a YAML list, ``router_url=[...]``),
    each checked and without its trailing slash.

    Raises :class:`ConfigError` naming the bad entry: a typo in one of three URLs would
    otherwise surface as a Router that never answers.
    """
    urls: list[str] = []
    joined = value if isinstance(value, str) else ",".join(str(item) for item in value)
    entries = joined.split(",")
    for position, raw in enumerate(entries, 1):
        url = raw.strip().rstrip("/")
        if not url:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{what} must be http(s) URL(s), comma-separated; "
                f"entry {position} of {len(entries)} is {raw.strip()!r}"
            )
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ConfigError(f"{what} is empty: give at least one http(s) URL")
    if len(urls) > MAX_ROUTERS:
        raise ConfigError(f"{what} lists {len(urls)} Routers; at most {MAX_ROUTERS}")
    return urls


class RouterList:
    """The Routers of one service, the current one first. Thread-safe: an agent's lease thread and
    its event loop share one."""

    def __init__(self, urls: list[str] | str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.urls: tuple[str, ...] = tuple(split_router_urls(urls) if isinstance(urls, str) else urls)
        if not self.urls:
            raise ConfigError("a Router list needs at least one URL")
        self._clock = clock
        self._current = 0
        self._lock = threading.Lock()
        # Per Router: failures in a row, and until when (monotonic) it is skipped.
        self._failures = [0] * len(self.urls)
        self._skip_until = [0.0] * len(self.urls)

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def order(self) -> list[str]:
        """Every Router, in the order to try them now: the current one unless it is being skipped,
        the others not being skipped, then the skipped ones, soonest back first."""
        now = self._clock.monotonic()
        with self._lock:
            n = len(self.urls)
            rotation = [(self._current + i) % n for i in range(n)]
            ready = [i for i in rotation if self._skip_until[i] <= now]
            waiting = sorted(
                (i for i in rotation if self._skip_until[i] > now), key=self._skip_until.__getitem__
            )
        return [self.urls[i] for i in ready + waiting]

    def ready(self) -> list[str]:
        """The Routers not being skipped now, in :meth:`order`."""
        now = self._clock.monotonic()
        return [url for url in self.order() if self._skip_until[self.urls.index(url)] <= now]

    def answered(self, url: str) -> bool:
        """``url`` answered: it is the current Router from now on. True when that is a change."""
        i = self.urls.index(url)
        with self._lock:
            self._failures[i] = 0
            self._skip_until[i] = 0.0
            changed = i != self._current
            self._current = i
        return changed

    def failed(self, url: str) -> str | None:
        """``url`` did not answer: skip it for a while. Returns the next Router to try at once
        (one not being skipped), or None when every Router is being skipped."""
        i = self.urls.index(url)
        with self._lock:
            self._failures[i] += 1
            pause = min(SKIP_FIRST_S * 2 ** (self._failures[i] - 1), SKIP_CAP_S)
            self._skip_until[i] = self._clock.monotonic() + pause * _jitter.uniform(0.75, 1.0)
        ready = self.ready()
        return ready[0] if ready else None

    def describe(self) -> str:
        """The list as it is written: ``http://a:7200,http://b:7200``."""
        return ",".join(self.urls)


async def request_any(
    http: httpx.AsyncClient, routers: RouterList, method: str, path: str, **kwargs: Any
) -> tuple[str, httpx.Response]:
    """``method path`` at the first Router of the list that takes the connection: a request that
    never reached a Router goes to the next. Returns the Router used and its answer; raises the
    last Router's connection error when none took it."""
    urls = routers.order()
    for url in urls[:-1]:
        try:
            resp = await http.request(method, f"{url}{path}", **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            routers.failed(url)
            continue
        routers.answered(url)
        return url, resp
    resp = await http.request(method, f"{urls[-1]}{path}", **kwargs)
    routers.answered(urls[-1])
    return urls[-1], resp


def request_any_sync(
    http: httpx.Client, routers: RouterList, method: str, path: str, **kwargs: Any
) -> tuple[str, httpx.Response]:
    """:func:`request_any` for blocking code."""
    urls = routers.order()
    for url in urls[:-1]:
        try:
            resp = http.request(method, f"{url}{path}", **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            routers.failed(url)
            continue
        routers.answered(url)
        return url, resp
    resp = http.request(method, f"{urls[-1]}{path}", **kwargs)
    routers.answered(urls[-1])
    return urls[-1], resp
