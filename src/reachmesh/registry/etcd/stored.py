"""What the etcd registry writes under its keys, and how it reads them back.

Whatever is under the prefix may have been written by something else: every reader here skips a
record it cannot use, with a warning naming the key, rather than failing the watch.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
from pydantic import ValidationError

from reachmesh.clock import Clock
from reachmesh.protocol import AgentProfile
from reachmesh.registry.entry import AgentEntry, LearnedRoute, compile_capabilities
from reachmesh.registry.etcdclient import KeyValue

log = logging.getLogger("reachmesh.registry")

LIVE = "live"
GONE = "deregistered"  # a deregistration's last word before its lease is revoked


def decode(kv: KeyValue) -> dict[str, Any] | None:
    """``kv``'s value as a JSON object, or None (with a warning) when it is not one."""
    try:
        record = orjson.loads(kv.value)
    except orjson.JSONDecodeError:
        log.warning("[registry] skipping %s: not JSON (written by something else?)", kv.key)
        return None
    if not isinstance(record, dict):
        log.warning("[registry] skipping %s: not a JSON object (written by something else?)", kv.key)
        return None
    return record


def live_record(kv: KeyValue | None) -> dict[str, Any] | None:
    """The agent record under ``kv``, unless there is none or it is a deregistration's."""
    record = decode(kv) if kv is not None else None
    if record is None or record.get("state") == GONE:
        return None
    return record


def read_entry(
    record: dict[str, Any], kv: KeyValue, clock: Clock, lease_id: str = "", expect_id: str | None = None
) -> AgentEntry | None:
    """The snapshot entry an agent record stands for, or None (with a warning) when it is not one."""
    try:
        profile = AgentProfile.model_validate(record["profile"])
        ttl = float(record["ttl"])
        lease_digest = str(record["leaseDigest"])
        if not (ttl == 0 or 0 < ttl < 1e9):  # NaN, infinities and negatives fail both
            raise ValueError("ttl")
        if expect_id is not None and profile.id != expect_id:
            # A record under another id's key would route that id to its endpoint while
            # etcd holds the real one, and never leave the snapshot.
            raise ValueError(f"the key holds the profile of {profile.id!r}")
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        why = type(exc).__name__ if isinstance(exc, ValidationError) else str(exc) or type(exc).__name__
        log.warning("[registry] skipping %s: not an agent record (%s)", kv.key, why)
        return None
    caps, validators = compile_capabilities(profile)
    now = clock.monotonic()
    managed = bool(record.get("managed", False))
    return AgentEntry(
        profile=profile,
        lease_id=lease_id,
        ttl_seconds=ttl,
        last_heartbeat=now,
        last_heartbeat_wall=float(record.get("at") or clock.time()),
        expires_at=math.inf if managed else now + ttl,
        capabilities=caps,
        validators=validators,
        holder=record.get("holder"),
        lease_digest=lease_digest,
        instance_digest=record.get("instanceDigest"),
        lease_tag=str(record.get("leaseTag") or "-"),
        revision=kv.mod_revision,
        backend_lease=kv.lease,
        managed=managed,
    )


def draft(
    profile: AgentProfile,
    secret: str,
    ttl: float,
    *,
    instance_id: str | None,
    holder: str | None,
    managed: bool,
    clock: Clock,
    router: str,
) -> tuple[AgentEntry, bytes]:
    """The entry this Router will hold, and the record etcd will (digests, never secrets)."""
    now = clock.monotonic()
    entry = AgentEntry(
        profile=profile,
        lease_id=secret,
        ttl_seconds=ttl,
        last_heartbeat=now,
        last_heartbeat_wall=clock.time(),
        expires_at=math.inf if managed else now + ttl,
        instance_id=instance_id,
        holder=holder,
        managed=managed,
    )
    entry.capabilities, entry.validators = compile_capabilities(profile)
    record = {
        "state": LIVE,
        "profile": profile.model_dump(mode="json", by_alias=True, exclude_none=True),
        "ttl": ttl,
        "managed": managed,
        "leaseDigest": entry.lease_digest,
        "leaseTag": entry.lease_tag,
        "instanceDigest": entry.instance_digest,
        "holder": holder,
        "at": entry.last_heartbeat_wall,
        "router": router,
    }
    return entry, orjson.dumps(record)


# What a record says about when and through which Router it was written, not what it registers.
_CIRCUMSTANCES = ("at", "router")


def same_record(stored: bytes, new: bytes) -> bool:
    """Whether two agent records register the same thing (profile, lease, holder, TTL alike)."""
    if stored == new:
        return True
    try:
        old, fresh = orjson.loads(stored), orjson.loads(new)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(old, dict) or not isinstance(fresh, dict):
        return False
    for name in _CIRCUMSTANCES:
        old.pop(name, None)
        fresh.pop(name, None)
    return bool(old == fresh)


def read_route(kv: KeyValue, what: str) -> LearnedRoute | None:
    """The learned route (or negative: ``what`` names which) under ``kv``, or None when not one."""
    record = decode(kv) or {}
    try:
        return LearnedRoute.from_json(record)
    except (KeyError, TypeError, ValueError):
        log.warning("[registry] skipping %s: not a %s", kv.key, what)
        return None


def route_value(route: LearnedRoute, router: str) -> bytes:
    """What a learned route (or negative) is stored as: the route, and who learned it."""
    return orjson.dumps({**route.to_json(), "router": router})
