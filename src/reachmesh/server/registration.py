"""What one registration may cost the shared registry: its profile's size, and how often a token
may register at all.

Each registration that changes a profile is a whole new revision of it in etcd, kept until
compaction; an agent token re-registering a large profile in a loop filled etcd's quota and
stopped every team's registrations. These bounds hold for the memory registry too (a profile's
size is Router memory there).
"""

from __future__ import annotations

import math

import orjson

from reachmesh.clock import Clock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import InvalidProfile, RegistrationThrottled
from reachmesh.protocol import AgentProfile


def check_profile_size(profile: AgentProfile, limit: int) -> None:
    """Refuse (422 INVALID_PROFILE) a profile whose stored form is over ``limit`` bytes."""
    size = len(orjson.dumps(profile.model_dump(mode="json", by_alias=True, exclude_none=True)))
    if size > limit:
        message = f"{size} bytes as compact JSON; at most {limit} (registry.max_profile_bytes)"
        raise InvalidProfile(
            f"the profile is too large: {message}", details=[{"field": "(body)", "message": message}]
        )


class RegistrationThrottle:
    """A token bucket per agent token: ``registration_burst_per_token`` registrations at once,
    refilled at ``registrations_per_minute_per_token``.

    Keyed by the token's fingerprint, so it holds at most one bucket per configured agent token;
    a full bucket is dropped, so an idle token costs nothing.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # token key -> (tokens left, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, label: str, policy: RegistryPolicy) -> None:
        """Spend one registration of ``key``'s bucket, or raise 429 saying when one is free."""
        now = self._clock.monotonic()
        burst = float(policy.registration_burst_per_token)
        per_second = policy.registrations_per_minute_per_token / 60.0
        left, at = self._buckets.get(key, (burst, now))
        left = min(burst, left + max(now - at, 0.0) * per_second)
        if left < 1.0:
            self._buckets[key] = (left, now)
            wait = max(1, math.ceil((1.0 - left) / per_second))
            raise RegistrationThrottled(
                f"the agent token {label} registers too often: at most "
                f"{policy.registrations_per_minute_per_token:g} a minute after a burst of "
                f"{policy.registration_burst_per_token} (registry.registrations_per_minute_per_token); "
                f"retry in {wait} s",
                retry_after_s=wait,
            )
        self._buckets[key] = (left - 1.0, now)
        self._prune(now, burst, per_second)

    def _prune(self, now: float, burst: float, per_second: float) -> None:
        """Drop buckets that have refilled: they hold nothing a new bucket would not."""
        if len(self._buckets) < 64:
            return
        for key, (left, at) in list(self._buckets.items()):
            if left + (now - at) * per_second >= burst:
                del self._buckets[key]
