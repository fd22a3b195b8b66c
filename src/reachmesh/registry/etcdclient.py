"""A small asyncio client for etcd's v3 JSON gateway: the only module that talks to etcd.

Why the JSON gateway (``POST /v3/kv/range`` and friends) rather than gRPC: it needs no protobuf
or gRPC stack beside the Router's own HTTP client, it is served by every etcd 3.4+ member, and
each call gets the deadline the registry gives it, which is what keeps a frozen member from
hanging a registration. Keys and values travel base64-encoded; 64-bit integers travel as strings.

Members may be ``https://``: the TLS context the registry passes verifies them. With etcd's
authentication on, the client logs in with a user and password (``/v3/auth/authenticate``), sends
the token on every call and watch, and logs in again when etcd says the token is no longer valid
(simple tokens lapse after ``--auth-token-ttl`` idle seconds). Neither password nor token is ever
part of an error message.

Several members may be given. A call starts on the member that answered last and moves on to
the next one when a member refuses, times out or has no leader, until the call's deadline. Every
failure is mapped here, at the edge, to :class:`~reachmesh.exceptions.RegistryUnavailable`
(no member answered in time) or :class:`EtcdRejected` (a member answered with an error).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.redaction import loggable

# gRPC codes an etcd member answers while it cannot serve now but another one (or the same one a
# moment later) may: unavailable (no leader, leader changed), deadline exceeded, aborted.
_RETRYABLE_CODES = {4, 10, 14}
_NOT_FOUND = 5
_PERMISSION_DENIED = 7
_FAILED_PRECONDITION = 9
_OUT_OF_RANGE = 11
# etcd refuses writes with this while its NOSPACE alarm is raised (the backend quota is full).
NOSPACE_MESSAGE = "database space exceeded"
# What etcd answers when the token is missing, lapsed or predates a change to its users: logging
# in again fixes each (a missing token: etcd turned authentication on after the client started).
_TOKEN_REFUSALS = ("invalid auth token", "user name is empty", "revision of auth store is old")
# A watch event can carry a whole profile with its examples, or a vector block: bound a line,
# so a broken member cannot make the Router buffer without end.
MAX_LINE_BYTES = 32 * 1024 * 1024
# One answer to a call: a page of 500 keys with vector blocks stays far below it. A member (or
# whatever answers at its address) that sends more is treated as broken, not buffered to the end.
MAX_ANSWER_BYTES = 256 * 1024 * 1024


class EtcdRejected(Exception):
    """An etcd member answered a call with an error that retrying elsewhere will not change."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.code = code
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.code == _NOT_FOUND

    @property
    def token_refused(self) -> bool:
        """etcd wants a (fresh) login: the token is missing, lapsed or stale."""
        return any(refusal in self.message for refusal in _TOKEN_REFUSALS)


class Compacted(Exception):
    """A watch asked for revisions etcd has compacted away: the caller must resync in full."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revisions before {compact_revision} were compacted")
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Event:
    """One watch event: a PUT (``deleted`` False) or a DELETE of ``kv.key``."""

    kv: KeyValue
    deleted: bool


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that selects every key starting with ``prefix`` (its last byte + 1)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")).decode(),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def normalize_endpoint(endpoint: str) -> str:
    """``host:port`` or a URL → ``http://host:port`` (the gateway's base URL)."""
    endpoint = endpoint.strip().rstrip("/")
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    return endpoint


def compare_create(key: str, revision: int) -> dict[str, Any]:
    """A txn comparison: the key's create revision equals ``revision`` (0: it does not exist)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def compare_never(key: str) -> dict[str, Any]:
    """A txn comparison that is never true (a key's version below 0): its success branch is
    checked against the caller's permissions but never run."""
    return {"key": _b64(key), "target": "VERSION", "result": "LESS", "version": "0"}


def compare_mod(key: str, revision: int) -> dict[str, Any]:
    """A txn comparison: the key was last modified at ``revision``."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    return {"request_put": {"key": _b64(key), "value": _b64(value), "lease": str(lease)}}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # The key-values read by request_range operations, in order.
    ranges: list[list[KeyValue]]


class EtcdClient:
    """Calls on a list of members with a deadline per call; opened and closed on the Router's loop."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        attempt_timeout: float = 1.5,
        deadline: float = 4.0,
        tls: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = [normalize_endpoint(e) for e in endpoints]
        self.attempt_timeout = attempt_timeout
        self.deadline = deadline
        self._current = 0  # the member that answered last: calls start there
        self._session: aiohttp.ClientSession | None = None
        self._tls = tls
        self._credentials = credentials
        # The login's token; "" once etcd said its authentication is off (nothing to send).
        self._token: str | None = None
        self._login = asyncio.Lock()  # one login at a time; the others use its token
        self.logins = 0
        # etcd answered that authentication is off although a user was configured.
        self.auth_off = False
        # The alarms (NOSPACE, CORRUPT) the last status answer listed as raised.
        self.alarms: frozenset[str] = frozenset()
        # Why each member last failed a status call (gone once it answers): what /readyz says
        # beside "etcd unreachable", since "refused" and "silent" are fixed differently.
        self.failures: dict[str, str] = {}

    async def open(self) -> None:
        if self._session is None:
            # No pool-wide timeout: each call sets its own, and a watch stream has none.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(
                    limit=64, enable_cleanup_closed=True, ssl=self._tls if self._tls is not None else True
                ),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RegistryUnavailable("the etcd client is not open")
        return self._session

    @property
    def current(self) -> str:
        return self.endpoints[self._current]

    def rotate(self) -> None:
        """Start the next calls on the next member (the current one broke a stream)."""
        self._current = (self._current + 1) % len(self.endpoints)

    def prefer(self, endpoint: str) -> None:
        """Start the next calls on ``endpoint`` (it answered when the current one did not)."""
        if endpoint in self.endpoints:
            self._current = self.endpoints.index(endpoint)

    # -- one call, with failover ------------------------------------------------------------

    async def call(
        self, path: str, body: dict[str, Any], *, deadline: float | None = None, once: bool = False
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the members in turn until one answers or time runs out.

        With a login configured, the call carries its token; when etcd refuses the token, the
        client logs in again and repeats the call once, within the same deadline. ``once``: each
        member is tried once at most (a refused connection fails the call at once, where the
        deadline would keep trying it).
        """
        budget = self.deadline if deadline is None else deadline
        end = time.monotonic() + budget
        payload = orjson.dumps(body)
        if self._credentials is None:
            return await self._call_until(path, payload, end, budget, once)
        token = await self._logged_in(end, budget, once)
        try:
            return await self._call_until(path, payload, end, budget, once)
        except EtcdRejected as exc:
            if not exc.token_refused:
                raise
        await self._log_in_again(token, end, budget, once)
        return await self._call_until(path, payload, end, budget, once)

    # -- authentication ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        if self._token:
            return {"Content-Type": "application/json", "Authorization": self._token}
        return {"Content-Type": "application/json"}

    async def _logged_in(self, end: float, budget: float, once: bool = False) -> str | None:
        """The token to call with, logging in first when there is none yet."""
        if self._token is None:
            await self._log_in_again(None, end, budget, once)
        return self._token

    async def _log_in_again(self, stale: str | None, end: float, budget: float, once: bool = False) -> None:
        """Replace the token ``stale`` (None: there is none) unless another call already has.

        Waiting for another call's login counts against this call's deadline too (the login
        itself keeps to it like any call)."""
        try:
            async with asyncio.timeout(max(end - time.monotonic(), 0.0)):
                await self._login.acquire()
        except TimeoutError as exc:
            raise RegistryUnavailable(
                f"etcd did not answer within {budget:g} s (waiting for another call's login)"
            ) from exc
        try:
            await self._log_in_locked(stale, end, budget, once)
        finally:
            self._login.release()

    async def _log_in_locked(self, stale: str | None, end: float, budget: float, once: bool) -> None:
        if self._token is not None and self._token != stale:
            return  # a concurrent call logged in meanwhile: use its token
        self._token = None
        assert self._credentials is not None
        user, password = self._credentials
        credentials = orjson.dumps({"name": user, "password": password})
        try:
            answer = await self._call_until("/v3/auth/authenticate", credentials, end, budget, once)
        except EtcdRejected as exc:
            if exc.code == _FAILED_PRECONDITION and "not enabled" in exc.message:
                self._token = ""  # authentication is off in etcd: calls go without a token
                self.auth_off = True
                return
            raise EtcdRejected(exc.code, f"logging in to etcd as {user!r}: {exc.message}") from exc
        self._token = str(answer.get("token") or "")
        self.auth_off = False
        self.logins += 1

    def _drop_token(self, token: str | None) -> None:
        """Forget ``token`` (etcd refused it), so the next call logs in again."""
        if self._credentials is not None and self._token == token:
            self._token = None

    async def _call_until(
        self, path: str, payload: bytes, end: float, budget: float, once: bool = False
    ) -> dict[str, Any]:
        last = "no member answered"
        tries = 0
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0.01:
                raise RegistryUnavailable(f"etcd did not answer within {budget:g} s ({last})")
            index = (self._current + tries) % len(self.endpoints)
            endpoint = self.endpoints[index]
            tries += 1
            try:
                answer = await self._post(endpoint, path, payload, min(self.attempt_timeout, remaining))
            except _MemberDown as exc:
                # A bare timeout says less than what another try said (a refused certificate, say).
                if str(exc) not in _BARE or last == "no member answered":
                    last = f"{endpoint}: {exc}"
                if once and tries >= len(self.endpoints):
                    raise RegistryUnavailable(f"no etcd member answered ({last})") from exc
            else:
                self._current = index
                return answer
            if tries % len(self.endpoints) == 0:
                # Every member failed once: give an election a moment rather than spin.
                await asyncio.sleep(
                    min(0.05 * (tries // len(self.endpoints)), 0.5, max(end - time.monotonic(), 0))
                )

    async def _post(self, endpoint: str, path: str, payload: bytes, limit_s: float) -> dict[str, Any]:
        try:
            async with self.session.post(
                endpoint + path,
                data=payload,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=limit_s),
                # A member never redirects; a login's body (the password) must not follow one.
                allow_redirects=False,
            ) as resp:
                raw = await _read_capped(resp.content, MAX_ANSWER_BYTES)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _MemberDown(_failure(endpoint, exc)) from exc
        if raw is None:
            raise _MemberDown(f"HTTP {resp.status}, an answer over {MAX_ANSWER_BYTES} bytes")
        if 300 <= resp.status < 400:
            raise _MemberDown(
                f"HTTP {resp.status}: a redirect, which an etcd member never sends (not followed)"
            )
        try:
            answer = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as exc:
            # Not etcd's JSON (a proxy's page, the gateway refusing a client certificate): its
            # first words say more than "not JSON" does; never for a login, whose body a proxy
            # might echo, password included.
            login = path.endswith("/authenticate")
            said = "" if login else f": {loggable(raw[:200].decode(errors='replace'))}"
            raise _MemberDown(f"HTTP {resp.status}, not JSON{said}") from exc
        if not isinstance(answer, dict):
            raise _MemberDown(f"HTTP {resp.status}, unexpected answer")
        code = answer.get("code")
        if resp.status >= 400 or code:
            code = int(code or 0)
            message = str(answer.get("message") or answer.get("error") or f"HTTP {resp.status}")
            if code in _RETRYABLE_CODES or (code == 0 and resp.status >= 500):
                raise _MemberDown(message)
            raise EtcdRejected(code, message)
        return answer

    # -- key-value ---------------------------------------------------------------------------

    async def get(
        self, key: str, *, deadline: float | None = None, serializable: bool = False
    ) -> tuple[int, KeyValue | None]:
        """``(store revision, the key-value or None)``; ``serializable`` reads the member's own
        copy, without asking the leader (enough where only etcd's permission check matters)."""
        body: dict[str, Any] = {"key": _b64(key)}
        if serializable:
            body["serializable"] = True
        answer = await self.call("/v3/kv/range", body, deadline=deadline)
        kvs = answer.get("kvs") or []
        return int(answer["header"]["revision"]), (_kv(kvs[0]) if kvs else None)

    async def get_prefix(
        self, prefix: str, *, page: int = 500, once: bool = False
    ) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` at one revision, read in pages (no answer grows unbounded);
        ``once``: its first page tries each member once at most (:meth:`call`)."""
        end = _b64(prefix_end(prefix))
        start = prefix
        revision = 0
        found: list[KeyValue] = []
        while True:
            body: dict[str, Any] = {"key": _b64(start), "range_end": end, "limit": str(page)}
            if revision:
                body["revision"] = str(revision)  # later pages read the first page's revision
            answer = await self.call("/v3/kv/range", body, once=once and not revision)
            if not revision:
                revision = int(answer["header"]["revision"])
            kvs = [_kv(raw) for raw in answer.get("kvs") or []]
            found.extend(kvs)
            if not answer.get("more") or not kvs:
                return revision, found
            start = kvs[-1].key + "\x00"

    async def keys(self, prefix: str, *, limit: int = 100_000) -> list[KeyValue]:
        """The keys under ``prefix`` without their values (each KeyValue's value is empty), at
        most ``limit`` of them: a listing that costs etcd and the answer no value bytes."""
        body = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "keys_only": True,
            "limit": str(limit),
        }
        answer = await self.call("/v3/kv/range", body)
        return [_kv(raw) for raw in answer.get("kvs") or []]

    async def put(self, key: str, value: bytes, *, lease: int = 0, deadline: float | None = None) -> int:
        body = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        answer = await self.call("/v3/kv/put", body, deadline=deadline)
        return int(answer["header"]["revision"])

    async def delete(self, key: str, *, deadline: float | None = None) -> int:
        """Delete ``key``; returns how many keys went (0 when it was not there)."""
        answer = await self.call("/v3/kv/deleterange", {"key": _b64(key)}, deadline=deadline)
        return int(answer.get("deleted") or 0)

    async def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
        *,
        deadline: float | None = None,
    ) -> TxnResult:
        body = {"compare": compare, "success": success, "failure": failure or []}
        answer = await self.call("/v3/kv/txn", body, deadline=deadline)
        ranges = [
            [_kv(raw) for raw in (item["response_range"].get("kvs") or [])]
            for item in answer.get("responses") or []
            if "response_range" in item
        ]
        return TxnResult(bool(answer.get("succeeded")), int(answer["header"]["revision"]), ranges)

    # -- leases ------------------------------------------------------------------------------

    async def grant(self, ttl: float, *, deadline: float | None = None, once: bool = False) -> int:
        # etcd counts whole seconds; never round a lease down to less than it was asked for.
        answer = await self.call(
            "/v3/lease/grant", {"TTL": str(max(int(-(-ttl // 1)), 1))}, deadline=deadline, once=once
        )
        return int(answer["ID"])

    async def keepalive(self, lease: int, *, deadline: float | None = None) -> int:
        """Refresh ``lease``; returns its TTL in seconds, 0 when etcd no longer has it."""
        answer = await self.call("/v3/lease/keepalive", {"ID": str(lease)}, deadline=deadline)
        return int((answer.get("result") or {}).get("TTL", 0))

    async def revoke(self, lease: int, *, deadline: float | None = None) -> None:
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease)}, deadline=deadline)
        except EtcdRejected as exc:
            if not exc.not_found:  # already gone is what revoking wants
                raise

    async def status(self, endpoint: str, limit_s: float) -> bool:
        """Whether ``endpoint`` answers a status call within ``limit_s`` (it has a leader).

        The answer also lists the cluster's raised alarms, kept in :attr:`alarms`."""
        try:
            answer = await self._post(endpoint, "/v3/maintenance/status", b"{}", limit_s)
        except _MemberDown as exc:
            said = str(exc)
            self.failures[endpoint] = f"no answer within {limit_s:g} s" if said in _BARE else said
            return False
        except EtcdRejected as exc:
            self.failures[endpoint] = str(exc)
            return False
        self.alarms = _alarms(answer.get("errors"))
        if str(answer.get("leader", "0")) == "0":
            self.failures[endpoint] = "it answers, but has no leader (fewer than a quorum of members are up)"
            return False
        self.failures.pop(endpoint, None)
        return True

    async def compact(self, revision: int, *, deadline: float | None = None) -> bool:
        """Drop the history before ``revision``; False when it was compacted already."""
        try:
            await self.call("/v3/kv/compaction", {"revision": str(revision)}, deadline=deadline)
        except EtcdRejected as exc:
            if exc.code == _OUT_OF_RANGE and "compacted" in exc.message:
                return False  # another Router (or etcd's own auto-compaction) was first
            raise
        return True

    # -- watch -------------------------------------------------------------------------------

    async def watch(
        self, endpoint: str, prefix: str, start_revision: int, *, on_created: Callable[[], None] | None = None
    ) -> AsyncIterator[list[Event]]:
        """Stream batches of events under ``prefix`` from ``start_revision`` on ``endpoint``;
        ``on_created`` runs when etcd has accepted the watch.

        Ends (returns) when the member closes the stream; raises :class:`Compacted` when the
        revision is gone, and :class:`RegistryUnavailable` when the member cannot be reached.
        """
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        token = None
        if self._credentials is not None:
            token = await self._logged_in(time.monotonic() + self.deadline, self.deadline)
        try:
            async with self.session.post(
                endpoint + "/v3/watch",
                data=orjson.dumps(body),
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.attempt_timeout),
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    raise RegistryUnavailable(f"etcd watch on {endpoint} answered HTTP {resp.status}")
                async for line in _lines(resp.content):
                    message = orjson.loads(line)
                    events = self._watch_events(message, endpoint, token)
                    if on_created is not None and (message.get("result") or {}).get("created"):
                        on_created()
                    if events:
                        yield events
        except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError) as exc:
            raise RegistryUnavailable(f"etcd watch on {endpoint} broke: {type(exc).__name__}") from exc

    def _watch_events(self, message: dict[str, Any], endpoint: str, token: str | None) -> list[Event]:
        """The events of one watch message; raises what a refusal or a broken stream means."""
        result = message.get("result") or {}
        if "error" in message:
            raise RegistryUnavailable(f"etcd watch on {endpoint}: {message['error']}")
        compacted = int(result.get("compact_revision", 0))
        if compacted:
            raise Compacted(compacted)
        if result.get("canceled"):
            reason = str(result.get("cancel_reason") or "no reason given")
            refusal = EtcdRejected(_PERMISSION_DENIED, reason)
            if refusal.token_refused and self._credentials is not None:
                self._drop_token(token)  # the next try logs in again
            elif refusal.token_refused or "permission denied" in reason:
                raise refusal  # no login would help, or no login is configured: the operator's
            raise RegistryUnavailable(f"etcd cancelled the watch on {endpoint}: {reason}")
        return [Event(_kv(raw["kv"]), raw.get("type") == "DELETE") for raw in result.get("events") or []]


def _alarms(errors: Any) -> frozenset[str]:
    """The alarm names in a status answer's ``errors`` (``"memberID:… alarm:NOSPACE "``)."""
    if not isinstance(errors, list):
        return frozenset()
    found = set()
    for error in errors[:64]:
        for word in str(error)[:200].split():
            if word.startswith("alarm:"):
                found.add(word.removeprefix("alarm:")[:32])
    return frozenset(found)


def _failure(endpoint: str, exc: BaseException) -> str:
    """What went wrong reaching a member, with the setting that usually fixes it; never the
    request (its headers hold the token)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return (
            f"TLS: its certificate was refused ({exc.certificate_error}); trust the CA that signed "
            "it with registry.etcd.ca_file, and name this host in the certificate"
        )
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno == errno.ECONNREFUSED:
        return "connection refused, nothing listens there: is etcd running at this address?"
    if isinstance(exc, aiohttp.ClientOSError):
        said = str(exc.strerror or exc.errno)
        if "CERTIFICATE" in said.upper() and "ALERT" in said.upper():
            return f"TLS: {said}; it asks for a client certificate: set registry.etcd.client_cert_file"
        return f"{type(exc).__name__}: {said}"
    if isinstance(exc, aiohttp.ServerDisconnectedError) and endpoint.startswith("http://"):
        return (
            "it closed the connection without answering (a member that serves TLS does that to "
            "plain HTTP: write it as https://)"
        )
    return type(exc).__name__


# Failures that say only that time ran out.
_BARE = {"TimeoutError", "ServerTimeoutError"}


class _MemberDown(Exception):
    """One member did not answer usefully; the call moves on to the next."""


async def _read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole answer, or None once it passes ``limit`` bytes (the rest is never buffered)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited messages of a streamed answer, each bounded by MAX_LINE_BYTES."""
    buffer = bytearray()
    async for chunk in stream.iter_any():
        buffer.extend(chunk)
        while True:
            cut = buffer.find(b"\n")
            if cut < 0:
                break
            line = bytes(buffer[:cut]).strip()
            del buffer[: cut + 1]
            if line:
                yield line
        if len(buffer) > MAX_LINE_BYTES:
            raise RegistryUnavailable("an etcd watch message exceeded the line bound")
    if buffer.strip():
        yield bytes(buffer).strip()
