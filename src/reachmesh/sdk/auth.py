"""The SDK's and the CLI's credentials: the bearer token from ``REACH_TOKEN``."""

from __future__ import annotations

import os


def auth_headers(token: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer`` from ``token`` or ``REACH_TOKEN``; none when neither is set.

    Never logged: the header goes on the wire and nowhere else.
    """
    token = token or os.environ.get("REACH_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}
