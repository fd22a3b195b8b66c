"""Whether etcd serves this Router: reachable (the ping), and willing (its login and roles).

*Degraded* means the Router routes from its snapshot and writes fail fast, either because no
member answers or because etcd refuses this Router's login or permission.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.ports import is_loopback
from reachmesh.registry.etcd.context import Shared
from reachmesh.registry.etcdclient import NOSPACE_MESSAGE, EtcdRejected, compare_never, put_op

# What /readyz says while etcd's quota is full, and what the operator does about it.
NOSPACE_REASON = (
    "etcd raised its NOSPACE alarm: its backend quota (--quota-backend-bytes) is full and it "
    "refuses every write, so no agent can register; compact and defragment etcd, then disarm "
    "the alarm (etcdctl alarm disarm), see docs/etcd.md"
)

log = logging.getLogger("reachmesh.registry")


class Health:
    """The ping, the degraded state, and etcd's refusals turned into errors that say what to fix."""

    def __init__(self, shared: Shared, user: str | None) -> None:
        self._shared = shared
        self.user = user
        self.unreachable: str | None = None  # why no member answers, while none does
        # Why etcd refuses this Router now (its login or permission), while it does: the snapshot
        # no longer follows etcd, so the Router says it is degraded until etcd serves it again.
        self.refused: str | None = None
        # The refusal was of a write: only a write that etcd allows clears it (a read-only role
        # still reads, and must not look ready).
        self.refused_write = False
        self.pings = 0
        # Why etcd takes no writes although it answers (its NOSPACE alarm), while it does.
        self.nospace: str | None = None
        self._misses = 0  # ping rounds in a row that no member answered

    def degraded(self) -> str | None:
        return self.unreachable or self.refused

    def deadline(self) -> float:
        # Degraded: one member's timeout, not the whole deadline: the caller learns at once.
        etcd = self._shared.policy.etcd
        return etcd.attempt_timeout_seconds if self.unreachable else etcd.request_timeout_seconds

    # -- refusals ----------------------------------------------------------------------------

    def warn_plain_login(self) -> None:
        if self.user is None:
            return
        exposed = [
            e
            for e in self._shared.client.endpoints
            if e.startswith("http://") and not is_loopback(urlsplit(e).hostname or "")
        ]
        if exposed:
            log.warning(
                "[registry] the etcd password for %r goes unencrypted to %s: use https:// endpoints",
                self.user,
                ", ".join(exposed),
            )

    def refusal_hint(self, exc: EtcdRejected) -> str:
        """etcd's refusal, and the setting that fixes it."""
        where = ", ".join(self._shared.client.endpoints)
        prefix = self._shared.keys.root.rstrip("/")
        password_env = self._shared.policy.etcd.password_env
        if exc.token_refused and self.user is None:
            hint = (
                "etcd has authentication on: name a user in registry.etcd.username "
                f"(or REACH_ETCD_USERNAME) and its password in {password_env}"
            )
        elif "authentication failed" in exc.message:
            hint = f"check registry.etcd.username (or REACH_ETCD_USERNAME) and the password in {password_env}"
        elif exc.code == 7 or "permission denied" in exc.message:
            hint = (
                f"the etcd user {self.user or '(none)'} needs read and write on the prefix {prefix}/, e.g. "
                f"etcdctl role grant-permission ROLE --prefix=true readwrite {prefix}/"
            )
        else:
            hint = "see etcd's log"
        return f"etcd at {where} refused the Router: {exc.message}; {hint}"

    def refused_call(self, exc: EtcdRejected, what: str, *, write: bool = False) -> RegistryUnavailable:
        """A call etcd refused, as the 503 its caller gets; a refused login or permission also
        makes the Router degraded until etcd serves it again."""
        if exc.token_refused or exc.code == 7 or "authentication failed" in exc.message:
            self.note_refusal(exc, write=write)
            return RegistryUnavailable(self.refusal_hint(exc))
        if NOSPACE_MESSAGE in exc.message:
            self._set_nospace(True)
            return RegistryUnavailable(NOSPACE_REASON)
        return RegistryUnavailable(f"etcd refused {what}: {exc.message}")

    def note_refusal(self, exc: EtcdRejected, *, write: bool = False) -> None:
        self.refused_write = write
        message = self.refusal_hint(exc)
        self._shared.last_error = message
        if message != self.refused:
            # Once per refusal: an operator changed users or roles under a running Router.
            log.warning("[registry] %s; routing from the snapshot until it is fixed", message)
            self.refused = message

    def serving(self, *, wrote: bool = False) -> None:
        """etcd served this Router (a read or a watch went through; ``wrote``: a write did)."""
        if self.refused is not None and (wrote or not self.refused_write):
            log.warning("[registry] etcd accepts the Router again")
            self.refused = None
            self.refused_write = False

    async def may_write(self) -> None:
        """Raise EtcdRejected unless etcd lets this Router write the prefix (a read-only role
        would otherwise pass the start and fail each registration)."""
        key = self._shared.keys.access_check
        await self._shared.client.txn([compare_never(key)], [put_op(key, b"")], deadline=self.deadline())

    async def check_write(self) -> None:
        """:meth:`may_write`, noting a refusal instead of raising it."""
        try:
            await self.may_write()
        except EtcdRejected as exc:
            self.refused_call(exc, "the write", write=True)
        else:
            self.serving(wrote=True)

    async def check_access(self) -> None:
        """A logged-in read: etcd's status answers anyone, so only this notices that etcd stopped
        accepting the Router (a changed password, a revoked role, authentication turned on).

        While refused, it checks every fifth ping only (a failed etcd login costs etcd a password
        hash), and with a write when a write was refused: that checked-but-never-run write is a
        raft entry, so it is not sent while all is well."""
        self.pings += 1
        if self.refused is not None and self.pings % 5:
            return
        if self.refused is not None and self.refused_write:
            await self.check_write()
            return
        shared = self._shared
        try:
            # Serializable: the member checks the login and permission itself, no leader round trip.
            await shared.client.get(
                shared.keys.access_check,
                deadline=shared.policy.etcd.attempt_timeout_seconds,
                serializable=True,
            )
        except EtcdRejected as exc:
            self.refused_call(exc, "the read")
        except RegistryUnavailable:
            pass  # reachability is the status check's to judge
        else:
            self.serving()

    # -- reachability ------------------------------------------------------------------------

    async def ping(self) -> None:
        """Is etcd there? Degraded when no member answers twice running; a silent watch member
        is left for one that answers."""
        shared = self._shared
        timeout = shared.policy.etcd.attempt_timeout_seconds
        watching = shared.watching
        if watching is not None and await shared.client.status(watching, timeout):
            self._answered()
            await self.check_access()
            return
        for endpoint in shared.client.endpoints:
            if endpoint != watching and await shared.client.status(endpoint, timeout):
                shared.client.prefer(endpoint)
                shared.restart.set()  # the stream's member is silent (frozen?): follow another
                self._answered()
                await self.check_access()
                return
        # One slow answer on a loaded machine is not an outage: two misses in a row are.
        self._misses += 1
        if self._misses >= 2:
            failures = shared.client.failures
            members = ", ".join(f"{e} ({failures.get(e, 'no answer')})" for e in shared.client.endpoints)
            self._set_unreachable(f"etcd unreachable at {members}")

    def out_of_reach_at_start(self, reason: str) -> None:
        """No member answered the first read: out of reach from the start (writes fail within
        one attempt, async requests are refused at once) until a ping is answered."""
        self._misses = 2
        self.unreachable = reason

    def _answered(self) -> None:
        self._misses = 0
        self._set_unreachable(None)
        self._set_nospace("NOSPACE" in self._shared.client.alarms)

    def _set_nospace(self, raised: bool) -> None:
        if raised and self.nospace is None:
            log.warning("[registry] %s", NOSPACE_REASON)
            self._shared.last_error = NOSPACE_REASON
        elif not raised and self.nospace is not None:
            log.warning("[registry] etcd's NOSPACE alarm is cleared: registrations are written again")
        self.nospace = NOSPACE_REASON if raised else None

    def _set_unreachable(self, reason: str | None) -> None:
        shared = self._shared
        if reason is not None and self.unreachable is None:
            agents = len(shared.snapshot.entries)
            log.warning(
                "[registry] %s: routing from the snapshot (%d agent%s, revision %d); "
                "registrations and renewals fail until it is back",
                reason,
                agents,
                "" if agents == 1 else "s",
                shared.revision,
            )
        elif reason is None and self.unreachable is not None:
            log.info("[registry] etcd answers again; resuming the watch from revision %d", shared.revision)
            shared.restart.set()
        self.unreachable = reason
