"""The agent's lease, kept on its own thread.

Registration, renewal and deregistration use a blocking HTTP client on a dedicated thread, so a
handler that blocks the agent's event loop (or holds the CPU) can delay answers but never cost
the agent its lease. When the Router answers ``404 LEASE_NOT_FOUND`` (say, after a restart), the
keeper registers again by itself.

Each keeper sends an instance token (``instanceId``) with every registration: when a reply is
lost (the request timed out after the Router had registered the agent), the retry is the same
registrant's and gets the same lease back instead of ``409 AGENT_ID_CONFLICT``.

Stopping never waits long on the Router: :meth:`LeaseKeeper.stop` interrupts registration
retries and waits only briefly for a renewal in flight; :meth:`LeaseKeeper.deregister` has a short
timeout. Both threads are daemons, so a Router that does not answer cannot hold the process.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
from typing import Any

import httpx

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.exceptions import ConfigError
from reachmesh.sdk.auth import auth_headers
from reachmesh.sdk.tls import router_verify
from reachmesh.secrets import fingerprint, loggable

log = logging.getLogger("reachmesh.sdk")

DEFAULT_REGISTRATION_TIMEOUT_S = 5.0
# How long stop() waits for a renewal in flight, and deregister() for the Router: together well
# under the 2 s in which a signalled agent must be gone.
STOP_JOIN_TIMEOUT_S = 0.2
DEREGISTER_TIMEOUT_S = 0.7


class RegistrationRefused(Exception):
    """The Router answered the registration with an error."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status} {error.get('code', '')}: {error.get('message', '')}")
        self.status = status
        self.error = error


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
    ) -> None:
        self.router_url = router_url
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
        self._thread: threading.Thread | None = None
        self._registration_timeout = registration_timeout
        self._opening = False  # open() is registering on some thread: the client is in use
        # An HTTPS Router with a private CA is trusted through REACH_CA_FILE.
        self._http = httpx.Client(timeout=5, headers=auth_headers(), verify=router_verify())
        # One token per keeper (per process, in practice): it identifies this registrant to the
        # Router across retries. A credential: it is never logged, only its fingerprint.
        self.instance_id = secrets.token_urlsafe(24)

    # -- registration ------------------------------------------------------------------------

    def register(self) -> None:
        """One registration attempt, logging the four ``[reach-client]`` lines of PROTOCOL.md §8."""
        body = dict(self._profile)
        body["instanceId"] = self.instance_id
        if self.lease_id:
            body["leaseId"] = self.lease_id
        log.info("[reach-client] registering agent: %s", self.agent_id)
        log.info("[reach-client] capabilities: %s", ", ".join(self._tasks))
        log.info("[reach-client] callback endpoint: %s", self._callback)
        log.debug("[reach-client] instance %s", fingerprint(self.instance_id))
        sent = self._clock.monotonic()
        resp = self._http.post(f"{self.router_url}/agents", json=body, timeout=self._registration_timeout)
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        if resp.status_code not in (200, 201):
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise RegistrationRefused(resp.status_code, error)
        self.lease_id = str(answer["leaseId"])
        self.ttl_seconds = float(answer["ttlSeconds"])
        self._extended_at = sent
        # The line of the protocol keeps its place; a fingerprint stands in for the lease itself.
        log.info("[reach-client] registration successful, lease id: %s", fingerprint(self.lease_id))

    def register_until_done(self) -> bool:
        """Register, retrying with backoff while the Router is away or the id is still held.

        Returns False when :meth:`stop` interrupted it. A refused profile (400/422) is final, and
        so are refused credentials (401/403): retrying cannot change either.
        """
        delay = 0.1
        while not self._stop.is_set():
            try:
                self.register()
                return True
            except RegistrationRefused as exc:
                if exc.status in (400, 422):
                    raise ConfigError(f"the Router refused the profile: {exc}") from exc
                if exc.status in (401, 403):
                    raise ConfigError(
                        f"the Router refused the registration: {exc} (REACH_TOKEN must be an agent "
                        "token allowed this id and these tasks, or an admin token)"
                    ) from exc
                log.warning("[reach-client] registration refused (%s); retrying in %.1fs", exc, delay)
            except httpx.HTTPError as exc:
                log.warning(
                    "[reach-client] Router at %s unreachable (%s); retrying in %.1fs",
                    self.router_url,
                    type(exc).__name__,
                    delay,
                )
            self._stop.wait(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 2.0)
        return False

    def open(self) -> bool:
        """Register (retrying), then start renewing at once, from the calling thread.

        Renewal starts here rather than back on the agent's event loop: the Router may route a
        request to the agent the moment it is registered, and a handler that blocks the loop
        would otherwise hold up the lease thread's start until the lease ran out.
        """
        self._opening = True
        try:
            registered = self.register_until_done()
        finally:
            self._opening = False
        if not registered:
            return False
        if self._stop.is_set():
            # Stopped while the answer was on its way: the agent is leaving, so give the lease
            # back rather than leave it to expire.
            self.deregister()
            return False
        self.start()
        return True

    # -- renewal -----------------------------------------------------------------------------

    def start(self) -> None:
        """Renew in the background, three times per TTL."""
        self._thread = threading.Thread(target=self._renew_forever, name="reach-lease", daemon=True)
        self._thread.start()

    def _next_renewal_in(self) -> float:
        """Seconds until the next renewal: a third of a TTL after the last extension was *sent*.

        Counting from the answer instead would lose the round trip each time, and the Router can
        answer a registration seconds after it started the lease (a cold embedder at start-up):
        with a short TTL the lease then turned suspect, or lapsed, before the first renewal.
        """
        return max(self.ttl_seconds / 3 - (self._clock.monotonic() - self._extended_at), 0.05)

    def _renew_forever(self) -> None:
        wait = self._next_renewal_in()
        backoff = 0.25
        while not self._stop.wait(wait):
            log.debug("[reach-client] renewing lease %s", fingerprint(self.lease_id))
            sent = self._clock.monotonic()
            try:
                resp = self._http.put(
                    f"{self.router_url}/agents/{self.agent_id}/lease",
                    json={"leaseId": self.lease_id},
                    # Up to half a TTL: under a CPU-bound handler this thread gets the GIL in
                    # slices, and a renewal that arrives late still beats one given up on.
                    timeout=max(self.ttl_seconds / 2, 0.5),
                )
            except httpx.HTTPError as exc:
                log.warning("[reach-client] lease renewal failed (%s); retrying", type(exc).__name__)
                wait = 0.05  # the lease is running out: try again at once, not a third of a TTL later
                continue
            if resp.status_code == 200:
                self._extended_at = sent
                log.debug("[reach-client] lease %s renewed", fingerprint(self.lease_id))
                wait = self._next_renewal_in()
                backoff = 0.25
                continue
            if resp.status_code in (403, 404):
                log.warning(
                    "[reach-client] lease %s is gone (HTTP %s); registering again",
                    fingerprint(self.lease_id),
                    resp.status_code,
                )
                self.lease_id = None
                try:
                    self.register_until_done()
                except ConfigError as exc:
                    log.error("[reach-client] %s", exc.message)
                    return
                wait = self._next_renewal_in()
            else:
                wait, backoff = self.retry_after(resp.status_code, backoff)
                log.warning(
                    "[reach-client] lease renewal answered HTTP %s%s; retrying in %.1fs",
                    resp.status_code,
                    _said(resp),
                    wait,
                )

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
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait)
            if not self._thread.is_alive():
                self._thread = None

    def deregister(self, timeout: float = DEREGISTER_TIMEOUT_S) -> None:
        """Give the lease back so the Router stops routing here at once."""
        if self.lease_id is None:
            return
        try:
            resp = self._http.delete(
                f"{self.router_url}/agents/{self.agent_id}",
                headers={"X-Reach-Lease": self.lease_id},
                timeout=timeout,
            )
            if resp.status_code == 204:
                log.info("[reach-client] deregistered agent: %s", self.agent_id)
            else:
                log.warning("[reach-client] deregistration answered HTTP %s", resp.status_code)
        except httpx.HTTPError as exc:
            log.warning("[reach-client] could not deregister (%s); the lease will expire", exc)
        self.lease_id = None

    def close(self) -> None:
        """Close the HTTP client, unless a thread still uses it (process exit will end it)."""
        if self._thread is None and not self._opening:
            self._http.close()


def _said(resp: httpx.Response) -> str:
    """``": <the Router's error message>"`` when the answer carries one, else nothing."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        return ""
    message = error.get("message") if isinstance(error, dict) else None
    return f": {loggable(message, 300)}" if isinstance(message, str) else ""
