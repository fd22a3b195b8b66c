"""Input and output schemas: the ``{field: type}`` shorthand, full JSON Schema, and validation.

A capability's schema is written either way in a profile:

- shorthand: ``{product_id: string, currency: string?}``: every value is one of ``string``,
  ``number``, ``integer``, ``boolean``, ``object``, ``array``, and a trailing ``?`` makes the
  field optional;
- full JSON Schema: any mapping with a ``$schema`` or ``properties`` key, or ``type: object``.

Both become one JSON Schema, compiled once at registration. Remote ``$ref`` is refused: the
Router must never fetch a URL because a stranger's profile named it.

The compiler (jsonschema-rs, 15 MB) is the Router's, in the ``router`` extra: on an agent's light
install, an agent's own profile is checked here for its shorthand and references, and the Router
checks the rest when the agent registers (``422 INVALID_PROFILE`` naming the field).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any


@functools.cache
def _compiler() -> ModuleType | None:
    """jsonschema-rs, loaded when a schema is first compiled; None on an agent's light install."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs


SHORTHAND_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array"})


def is_full_schema(schema: dict[str, Any]) -> bool:
    """True when ``schema`` is written as JSON Schema rather than as the shorthand."""
    return "$schema" in schema or "properties" in schema or schema.get("type") == "object"


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema for ``schema``, expanding the shorthand; raises ``ValueError``."""
    if is_full_schema(schema):
        return schema
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field, spec in schema.items():
        if not isinstance(spec, str) or spec.rstrip("?") not in SHORTHAND_TYPES:
            allowed = ", ".join(sorted(SHORTHAND_TYPES))
            raise ValueError(
                f"field {field!r}: shorthand type must be one of {allowed} "
                f"(with an optional trailing '?'), got {spec!r}"
            )
        properties[field] = {"type": spec.rstrip("?")}
        if not spec.endswith("?"):
            required.append(field)
    return {"type": "object", "properties": properties, "required": required}


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``schema`` is a usable shorthand or JSON Schema."""
    full = to_json_schema(schema)
    for ref in _refs(full):
        if not ref.startswith("#"):
            raise ValueError(f"$ref {ref!r} is not allowed: only local references (#/...)")
    compiler = _compiler()
    if compiler is None:
        return
    try:
        compiler.validator_for(full)
    except (compiler.ValidationError, compiler.ReferencingError, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else "invalid schema"
        raise ValueError(f"not a valid JSON Schema: {first_line}") from exc


class PayloadValidator:
    """A compiled schema: a fast yes/no on the hot path, field-level details on a no."""

    __slots__ = ("_required", "_validator", "schema")

    def __init__(self, schema: dict[str, Any]) -> None:
        compiler = _compiler()
        if compiler is None:
            raise ImportError("validating payloads needs jsonschema-rs: pip install 'reachmesh[router]'")
        self.schema = to_json_schema(schema)
        self._validator = compiler.validator_for(self.schema)
        self._required = compiler.ValidationErrorKind.Required

    def errors(self, payload: Any) -> list[dict[str, Any]]:
        """``[]`` when ``payload`` is valid, else ``[{"field", "message"}]`` naming each fault."""
        if self._validator.is_valid(payload):
            return []
        details = []
        for err in self._validator.iter_errors(payload):
            path = [str(p) for p in err.instance_path]
            missing = getattr(err.kind, "property", None)
            if isinstance(missing, str) and isinstance(err.kind, self._required):
                path.append(missing)
            field = ".".join(["payload", *path])
            details.append({"field": field, "message": err.message})
        return details
