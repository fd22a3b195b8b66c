"""The JSON answers of the Starlette side (the registry API, the admin surface)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from reachmesh.server.asgi import error_body


class JsonResponse(Response):
    """A JSON body written by orjson; bytes are sent as they are (already encoded)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else orjson.dumps(content)


def json_error(status: int, code: str, message: str, details: Any = None) -> JsonResponse:
    """The one error shape, ``{"error": {...}}``, with ``status``."""
    return JsonResponse(error_body(code, message, details=details), status_code=status)


__all__ = ["JsonResponse", "json_error"]
