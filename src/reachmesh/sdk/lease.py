"""The agent's lease, kept on its own thread.

Registration, renewal and deregistration use a blocking HTTP client on a dedicated thread, so a
handler that blocks the agent's event loop (or holds the CPU) can delay answers but never cost
the agent its lease. When the Router answers ``404 LEASE_NOT_FOUND`` (say, after a restart), the
keeper registers again by itself.

Each keeper sends an instance token (``instanceId``) with every registration: when a reply is
lost (the request timed out after the Router had registered the agent), the retry is the same
registrant's and gets the same lease back instead of ``409 AGENT_ID_CONFLICT``.

While the Router is away or refusing, registrations and renewals back off exponentially with
jitter up to :data:`BACKOFF_CAP_S`, and the log gets one line when the trouble starts, a summary
every :data:`SUMMARY_EVERY_S` while it lasts and one when it is over. A Router that stops
answering is probed meanwhile with ``GET /healthz`` every :data:`PROBE_EVERY_S` (silent and cheap),
so the agent is back within seconds of the Router's return however long the backoff had grown.

Given several Routers (a comma-separated list, see :mod:`reachmesh.sdk.routers`), the keeper
registers through one and renews through whichever answers: a Router that refuses the connection
or times out is skipped for a while and the next one is tried at once, so with etcd behind the
Routers the lease (the same ``leaseId``) outlives the Router it was registered with. The log says
which Router the agent is attached to each time that changes.

Stopping never waits long on the Router: :meth:`LeaseKeeper.stop` interrupts registration
retries and waits only briefly for a renewal in flight; :meth:`LeaseKeeper.deregister` has a short
timeout. Both threads are daemons, so a Router that does not answer cannot hold the process.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
from collections.abc import Callable
from typing import Any

import httpx

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.exceptions import ConfigError
from reachmesh.redaction import fingerprint, loggable
from reachmesh.sdk.auth import auth_headers
from reachmesh.sdk.routers import RouterList
from reachmesh.sdk.tls import router_verify

log = logging.getLogger("reachmesh.sdk")

DEFAULT_REGISTRATION_TIMEOUT_S = 5.0
# How long stop() waits for a renewal in flight, and deregister() for the Router: together well
# under the 2 s in which a signalled agent must be gone.
STOP_JOIN_TIMEOUT_S = 0.2
DEREGISTER_TIMEOUT_S = 0.7
# Retries after a failure: the first pause is about BACKOFF_FIRST_S, each next one doubles, up to
# BACKOFF_CAP_S (a Router down for an hour sees one attempt per agent every half minute).
BACKOFF_FIRST_S = 0.25
BACKOFF_CAP_S = 30.0
# While the Router does not answer at all, GET /healthz this often (jittered) between attempts: it
# costs the Router nothing, logs nothing, and ends the backoff as soon as the Router is back.
PROBE_EVERY_S = 2.5
PROBE_TIMEOUT_S = 1.0
# While a trouble lasts, one summary line this often.
SUMMARY_EVERY_S = 60.0


class Backoff:
    """Exponential pauses with jitter: each step doubles up to ``cap``, and a pause is drawn from
    the upper half of its step, so agents cut off together do not come back in step."""

    def __init__(self, first: float = BACKOFF_FIRST_S, cap: float = BACKOFF_CAP_S) -> None:
        self.first = first
        self.cap = cap
        self._step = first

    def next(self) -> float:
        step = self._step
        self._step = min(step * 2, self.cap)
        return step * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._step = self.first


class Trouble:
    """What the keeper says about a Router that fails it: one line when a trouble starts (or turns
    into another), a summary every :data:`SUMMARY_EVERY_S` while it lasts, one line when it ends."""

    def __init__(self, clock: Clock, router_url: str | Callable[[], str]) -> None:
        self._clock = clock
        # The Router now in use: a list's current one changes as Routers fail.
        self._where = router_url if callable(router_url) else (lambda: router_url)
        self.kind: str | None = None
        self._since = 0.0
        self._summary_at = 0.0

    def failed(self, kind: str, detail: str) -> None:
        """One more failure of ``kind`` (``"unreachable"``, or what the Router answered)."""
        now = self._clock.monotonic()
        if kind != self.kind:
            if self.kind is None:
                self._since = now
            self.kind = kind
            self._summary_at = now + SUMMARY_EVERY_S
            log.warning(
                "[reach-client] %s (%s); retrying with backoff (up to %gs)",
                self._what(),
                detail,
                BACKOFF_CAP_S,
            )
        elif now >= self._summary_at:
            while self._summary_at <= now:  # on the minute, however the retries fall
                self._summary_at += SUMMARY_EVERY_S
            log.warning("[reach-client] %s for %s, still retrying", self._what(), span(now - self._since))

    def recovered(self, url: str | None = None) -> None:
        """The Router (``url``, of a list) answered as it should: say so if it had not."""
        if self.kind is not None:
            took = span(self._clock.monotonic() - self._since)
            log.info("[reach-client] Router at %s answers again after %s", url or self._where(), took)
            self.kind = None

    def _what(self) -> str:
        if self.kind == "unreachable":
            where = self._where()
            return f"Routers at {where} all unreachable" if "," in where else f"Router at {where} unreachable"
        return str(self.kind)


def span(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``2 min``, ``1 h 5 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h" + (f" {minutes % 60} min" if minutes % 60 else "")


class RegistrationRefused(Exception):
    """The Router answered the registration with an error."""

    def __init__(self, status: int, error: dict[str, Any], url: str = "") -> None:
        super().__init__(f"HTTP {status} {error.get('code', '')}: {error.get('message', '')}")
        self.status = status
        self.error = error
        self.url = url


class RouterUnreachable(Exception):
    """No HTTP answer from the Router at ``url`` (kept inside the keeper: it tries the next)."""

    def __init__(self, url: str, cause: httpx.HTTPError) -> None:
        super().__init__(f"{url}: {type(cause).__name__}")
        self.url = url


class LeaseKeeper:
    """Registers a profile and keeps its lease alive until :meth:`stop`."""

    def __init__(
        self,
        router_url: str,
        profile: dict[str, Any],
        *,
        callback: str,
        tasks: list[str],
        clock: Clock = SYSTEM_CLOCK,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT_S,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        # One URL, or several comma-separated: the Routers of one service.
        self.routers = RouterList(router_url, clock=clock)
        self.agent_id = str(profile["id"])
        self._profile = profile
        self._callback = callback
        self._tasks = tasks
        self.lease_id: str | None = None
        self.ttl_seconds = 60.0
        # When the request behind the lease's last extension was sent (monotonic): the Router
        # starts the lease clock somewhere between sending and answering, so this is the safe end.
        self._clock = clock
        self._extended_at = clock.monotonic()
        self._stop = threading.Event()
        # Waits up to n seconds and says whether stop() was called: the stop event's, unless a test
        # moves a ManualClock instead of sleeping.
        self._wait = wait or self._stop.wait
        self._trouble = Trouble(clock, self.routers.describe)
        self._thread: threading.Thread | None = None
        # open() runs on a thread of its own and stop() on the agent's: the lock makes "not
        # stopped yet, so start renewing" one step, and hands each lease to one deregistration.
        self._lock = threading.Lock()
        self._registration_timeout = registration_timeout
        self._deregistering = False  # a deregistration is under way: the client is in use
        # Clear while a registration is under way on some thread (the client is in use then
        # too); stop() callers wait on it (see wait_opened).
        self._open_idle = threading.Event()
        self._open_idle.set()
        # An HTTPS Router with a private CA is trusted through REACH_CA_FILE.
        self._http = httpx.Client(timeout=5, headers=auth_headers(), verify=router_verify())
        # One token per keeper (per process, in practice): it identifies this registrant to the
        # Router across retries. A credential: it is never logged, only its fingerprint.
        self.instance_id = secrets.token_urlsafe(24)
        # The Router the log last said the agent is attached to.
        self._attached_to: str | None = None

    @property
    def router_url(self) -> str:
        """The Router the agent is attached to now (the one that last answered)."""
        return self.routers.current

    def _attached(self, url: str) -> None:
        """``url`` answered: it is the Router in use; say so when that changed."""
        self.routers.answered(url)
        if url != self._attached_to and len(self.routers) > 1:
            log.info("[reach-client] attached to Router at %s", url)
        self._attached_to = url

    def _next_router(self, url: str, kind: str, detail: str) -> bool:
        """``url`` failed (unreachable or unable to serve): skip it for a while. True when another
        Router is to be tried at once; else the failure is logged as a trouble, to back off."""
        following = self.routers.failed(url)
        if following is not None and following != url:
            log.warning("[reach-client] Router at %s failed (%s); trying %s", url, detail, following)
            return True
        self._trouble.failed(kind, detail)
        return False

    # -- registration ------------------------------------------------------------------------

    def register(self) -> None:
        """One registration attempt, logging the four ``[reach-client]`` lines of PROTOCOL.md §8."""
        self._announce()
        self._attempt()

    def _announce(self) -> None:
        """The first three lines of PROTOCOL.md §8: once per registration, not once per retry."""
        log.info("[reach-client] registering agent: %s", self.agent_id)
        log.info("[reach-client] capabilities: %s", ", ".join(self._tasks))
        log.info("[reach-client] callback endpoint: %s", self._callback)
        log.debug("[reach-client] instance %s", fingerprint(self.instance_id))

    def _attempt(self) -> None:
        body = dict(self._profile)
        body["instanceId"] = self.instance_id
        if self.lease_id:
            body["leaseId"] = self.lease_id
        sent = self._clock.monotonic()
        url = self.routers.order()[0]
        try:
            resp = self._http.post(f"{url}/agents", json=body, timeout=self._registration_timeout)
        except httpx.HTTPError as exc:
            raise RouterUnreachable(url, exc) from exc
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        if resp.status_code not in (200, 201):
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise RegistrationRefused(resp.status_code, error, url)
        self.lease_id = str(answer["leaseId"])
        self.ttl_seconds = float(answer["ttlSeconds"])
        self._extended_at = sent
        self._attached(url)
        self._trouble.recovered(url)
        # The line of the protocol keeps its place; a fingerprint stands in for the lease itself.
        log.info("[reach-client] registration successful, lease id: %s", fingerprint(self.lease_id))

    def register_until_done(self, backoff: Backoff | None = None) -> bool:
        """Register, retrying with backoff while the Router is away or the id is still held.

        Returns False when :meth:`stop` interrupted it. A refused profile (400/422) is final, and
        so are refused credentials (401/403): retrying cannot change either.
        """
        backoff = backoff or Backoff()
        self._announce()
        while not self._stop.is_set():
            try:
                self._attempt()
                return True
            except RegistrationRefused as exc:
                if self._refused(exc):
                    continue
                answered = self._pause(backoff.next(), probe=False)
            except RouterUnreachable as exc:
                if self._next_router(exc.url, "unreachable", type(exc.__cause__).__name__):
                    continue
                answered = self._pause(backoff.next(), probe=True)
            if answered is None:
                return False
            if answered:
                backoff.reset()
        return False

    def _refused(self, exc: RegistrationRefused) -> bool:
        """A registration the Router answered with an error: raise ConfigError when final, else
        True when another Router is to be tried at once (False: back off)."""
        if exc.status in (400, 422):
            raise ConfigError(f"the Router refused the profile: {exc}") from exc
        if exc.status in (401, 403):
            raise ConfigError(
                f"the Router refused the registration: {exc} (REACH_TOKEN must be an agent "
                "token allowed this id and these tasks, or an admin token)"
            ) from exc
        said = loggable(str(exc).removeprefix(f"HTTP {exc.status} "), 300)
        kind = f"registration refused with HTTP {exc.status}"
        if exc.status == 503:
            # That Router cannot reach its store just now; another one may.
            return self._next_router(exc.url, kind, said)
        self._trouble.failed(kind, said)
        return False

    def _pause(self, seconds: float, *, probe: bool) -> bool | None:
        """Wait ``seconds``; None when :meth:`stop` was called meanwhile.

        With ``probe`` (the Router did not answer at all), ask its ``GET /healthz`` every
        :data:`PROBE_EVERY_S` meanwhile, and end the wait early, True, the moment it answers.
        """
        # Counted by the waits themselves, not by the clock: a test's clock may stand still.
        left = seconds
        while left > 0:
            step = min(left, PROBE_EVERY_S * random.uniform(0.8, 1.2)) if probe else left
            if self._wait(step):
                return None
            left -= step
            if left > 0 and self._router_answers():
                return True
        return False

    def _router_answers(self) -> bool:
        """Whether some Router of the list answers HTTP at all (any status: it is up again); the
        first that does is tried next."""
        for url in self.routers.urls:
            try:
                self._http.get(f"{url}/healthz", timeout=PROBE_TIMEOUT_S)
            except httpx.HTTPError:
                continue
            self.routers.answered(url)
            return True
        return False

    def open(self) -> bool:
        """Register (retrying), then start renewing at once, from the calling thread.

        Renewal starts here rather than back on the agent's event loop: the Router may route a
        request to the agent the moment it is registered, and a handler that blocks the loop
        would otherwise hold up the lease thread's start until the lease ran out.
        """
        if not self._register_unless_stopped():
            return False
        if not self.start():
            # Stopped since: the agent is leaving, so give the lease back rather than leave it
            # to expire.
            self.deregister()
            return False
        return True

    def _register_unless_stopped(self, backoff: Backoff | None = None) -> bool:
        """:meth:`register_until_done`, begun only if not stopped; a lease answered after a stop
        is given back at once. :meth:`wait_opened` waits for it."""
        with self._lock:  # a registration begun before stop() is one that stop() can wait for
            if self._stop.is_set():
                return False
            self._open_idle.clear()
        try:
            if not self.register_until_done(backoff):
                return False
            if self._stop.is_set():
                self.deregister()
                return False
            return True
        finally:
            self._open_idle.set()

    def wait_opened(self, timeout: float) -> bool:
        """After :meth:`stop`: wait up to ``timeout`` s for a registration under way to end (the
        first, or the renewal thread's registering again).

        A registration already sent when the stop came may still be answered; its thread gives
        the lease back itself, but only if the process lives that long. True once none is under way.
        """
        return self._open_idle.wait(timeout)

    # -- renewal -----------------------------------------------------------------------------

    def start(self) -> bool:
        """Renew in the background, three times per TTL; False, and no thread, once stop() was called."""
        with self._lock:
            if self._stop.is_set():
                return False
            # Published only once running: stop() joins whatever it finds here.
            thread = threading.Thread(target=self._renew_forever, name="reach-lease", daemon=True)
            thread.start()
            self._thread = thread
        return True

    def _next_renewal_in(self) -> float:
        """Seconds until the next renewal: a third of a TTL after the last extension was *sent*.

        Counting from the answer instead would lose the round trip each time, and the Router can
        answer a registration seconds after it started the lease (a cold embedder at start-up):
        with a short TTL the lease then turned suspect, or lapsed, before the first renewal.
        """
        return max(self.ttl_seconds / 3 - (self._clock.monotonic() - self._extended_at), 0.05)

    def _renew_forever(self) -> None:
        backoff = Backoff()
        status_backoff = 0.25
        wait, probe = self._next_renewal_in(), False
        while (answered := self._pause(wait, probe=probe)) is not None:
            if answered:
                backoff.reset()
            log.debug("[reach-client] renewing lease %s", fingerprint(self.lease_id))
            sent = self._clock.monotonic()
            url = self.routers.order()[0]
            try:
                resp = self._http.put(
                    f"{url}/agents/{self.agent_id}/lease",
                    json={"leaseId": self.lease_id},
                    # Up to half a TTL: under a CPU-bound handler this thread gets the GIL in
                    # slices, and a renewal that arrives late still beats one given up on.
                    timeout=max(self.ttl_seconds / 2, 0.5),
                )
            except httpx.HTTPError as exc:
                after = self._renewal_unanswered(url, exc, backoff)
                if after is None:
                    return
                wait, probe = after
                continue
            if self._stop.is_set():
                # The agent is leaving: a renewal answered 404 because its deregistration came
                # first is not a lease to register again.
                return
            if resp.status_code == 200:
                self._extended_at = sent
                self._attached(url)
                self._trouble.recovered(url)
                log.debug("[reach-client] lease %s renewed", fingerprint(self.lease_id))
                wait, probe = self._next_renewal_in(), False
                backoff.reset()
                status_backoff = 0.25
            elif resp.status_code in (403, 404):
                self._trouble.recovered(url)
                log.warning(
                    "[reach-client] lease %s is gone (HTTP %s); registering again",
                    fingerprint(self.lease_id),
                    resp.status_code,
                )
                self.lease_id = None
                if not self._register_again(Backoff()):
                    return
                wait, probe = self._next_renewal_in(), False
            else:
                wait, status_backoff = self._renewal_refused(url, resp, status_backoff)
                probe = False

    def _renewal_unanswered(
        self, url: str, exc: httpx.HTTPError, backoff: Backoff
    ) -> tuple[float, bool] | None:
        """A renewal ``url`` did not answer: the (wait, probe) before the next try, None when stopped."""
        if self._next_router(url, "unreachable", f"lease renewal: {type(exc).__name__}"):
            # Another Router shares the registry (with etcd): renew there at once, on the same
            # lease, before it runs out.
            return 0.0, False
        left = self.ttl_seconds - (self._clock.monotonic() - self._extended_at)
        if left > 0:
            # Several tries fit in what is left of the lease (a sixth of a TTL apart at most: a
            # Router restarted within a short lease finds it renewed), the last one about when it
            # runs out.
            return max(min(backoff.next(), self.ttl_seconds / 6, left), 0.05), True
        # The Router has dropped the lease by now, if it is there at all: register again, going
        # on with the same backoff.
        log.info("[reach-client] lease %s ran out; registering again", fingerprint(self.lease_id))
        if not self._register_again(backoff):
            return None
        return self._next_renewal_in(), False

    def _renewal_refused(self, url: str, resp: httpx.Response, backoff: float) -> tuple[float, float]:
        """A renewal answered neither 200 nor 403/404: the wait before the next try, and the next
        backoff. A 503 (this Router cannot reach the registry store) sends it to another Router."""
        wait, backoff = self.retry_after(resp.status_code, backoff)
        reason = _said(resp).removeprefix(": ") or "no reason given"
        kind = f"lease renewal answered HTTP {resp.status_code}"
        if resp.status_code != 503:
            self._trouble.failed(kind, reason)
        return (0.0 if resp.status_code == 503 and self._next_router(url, kind, reason) else wait), backoff

    def _register_again(self, backoff: Backoff) -> bool:
        """Register anew from the renewal thread; False when stopped or refused for good."""
        try:
            return self._register_unless_stopped(backoff)
        except ConfigError as exc:
            log.error("[reach-client] %s", exc.message)
            return False

    def retry_after(self, status: int, backoff: float) -> tuple[float, float]:
        """How long to wait after a renewal answered ``status`` (not 200/403/404), and the next backoff.

        503 means the Router cannot reach its registry store (etcd) just now: retry with growing
        pauses, capped at a sixth of the TTL so several tries fit before the lease runs out.
        Anything else is a Router in trouble: no faster than the usual third of a TTL.
        """
        if status == 503:
            backoff = min(backoff * 2, max(self.ttl_seconds / 6, 0.1))
            return backoff * random.uniform(0.8, 1.0), backoff
        return max(self.ttl_seconds / 3, 0.05), backoff

    # -- leaving -----------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, wait: float = STOP_JOIN_TIMEOUT_S) -> None:
        """Stop renewing (and any registration retries), waiting up to ``wait`` s for the thread.

        A renewal still in flight after that is left to finish on its own (daemon) thread: the
        deregistration that follows does not need it, and a hung Router must not hold the stop.
        """
        with self._lock:  # a start() or an open() under way is seen whole, or not at all
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=wait)
            if not thread.is_alive():
                with self._lock:
                    if self._thread is thread:
                        self._thread = None

    def deregister(self, timeout: float | None = None) -> None:
        """Give the lease back so the Router stops routing here at once (once per lease, whichever
        thread asks first)."""
        timeout = DEREGISTER_TIMEOUT_S if timeout is None else timeout
        with self._lock:
            lease_id, self.lease_id = self.lease_id, None
            if lease_id is None:
                return
            self._deregistering = True
        try:
            resp = _delete_at_some_router(self, lease_id, timeout)
            if resp.status_code == 204:
                log.info("[reach-client] deregistered agent: %s", self.agent_id)
            else:
                log.warning("[reach-client] deregistration answered HTTP %s", resp.status_code)
        except httpx.HTTPError as exc:
            log.warning("[reach-client] could not deregister (%s); the lease will expire", exc)
        finally:
            with self._lock:
                self._deregistering = False

    def close(self) -> None:
        """Close the HTTP client, unless a thread still uses it (process exit will end it)."""
        with self._lock:
            busy = self._thread is not None or not self._open_idle.is_set() or self._deregistering
        if not busy:
            self._http.close()


def _delete_at_some_router(keeper: LeaseKeeper, lease_id: str, timeout: float) -> httpx.Response:
    """DELETE the lease at the current Router, or at the next when one refuses the connection
    (the request never reached it). The whole list shares ``timeout``."""
    ends = keeper._clock.monotonic() + timeout
    *others, last = keeper.routers.order()
    headers = {"X-Reach-Lease": lease_id}
    for url in others:
        left = max(ends - keeper._clock.monotonic(), 0.05)
        try:
            return keeper._http.delete(f"{url}/agents/{keeper.agent_id}", headers=headers, timeout=left)
        except httpx.ConnectError:
            continue
    left = max(ends - keeper._clock.monotonic(), 0.05)
    return keeper._http.delete(f"{last}/agents/{keeper.agent_id}", headers=headers, timeout=left)


def _said(resp: httpx.Response) -> str:
    """``": <the Router's error message>"`` when the answer carries one, else nothing."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        return ""
    message = error.get("message") if isinstance(error, dict) else None
    return f": {loggable(message, 300)}" if isinstance(message, str) else ""
