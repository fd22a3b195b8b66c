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
import json
import re
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any, NamedTuple

# How to add the `router` extra, for every message that needs it (here, and `reach router` on a
# light install: cli/console.py). Not `pip install 'reachmesh[router]'`: that asks PyPI, where
# reachmesh is not published (and where the name could be anyone's).
ROUTER_EXTRA_HINT = (
    "install it again with the router extra, from the clone or the wheel it came from: "
    "pip install '/path/to/clone[router]' (or the wheel's path with [router] after it; "
    "reachmesh is not on PyPI)"
)


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


# How many nodes (objects, arrays, scalars) a payload may hold for the Router to list every one
# of its faults. jsonschema-rs finds all the faults of an instance before handing over the first,
# at about 3 us each, holding the GIL: a 1 MB array of wrong types is 340,000 faults and a second
# of a stalled event loop. Past this size only the first fault is looked for (its own scan stops
# there), so the cost of a refusal is bounded whatever the payload.
SCAN_NODES = 5_000


class Faults(NamedTuple):
    """A payload's faults as ``details`` entries, at most the limit asked for; ``omitted`` is how
    many more there are, or None when the payload was too large to count them."""

    details: list[dict[str, Any]]
    omitted: int | None


class PayloadValidator:
    """A compiled schema: a fast yes/no on the hot path, field-level details on a no."""

    __slots__ = ("_error", "_required", "_validator", "schema")

    def __init__(self, schema: dict[str, Any]) -> None:
        compiler = _compiler()
        if compiler is None:
            raise ImportError(
                f"validating payloads needs jsonschema-rs, which this install leaves out: {ROUTER_EXTRA_HINT}"
            )
        self.schema = to_json_schema(schema)
        self._validator = compiler.validator_for(self.schema)
        self._required = compiler.ValidationErrorKind.Required
        self._error = compiler.ValidationError

    def is_valid(self, payload: Any) -> bool:
        return bool(self._validator.is_valid(payload))

    def errors(self, payload: Any, limit: int = 20) -> list[dict[str, Any]]:
        """``[]`` when ``payload`` is valid, else up to ``limit`` ``{"field", "message"}`` faults."""
        return self.faults(payload, limit).details

    def faults(self, payload: Any, limit: int) -> Faults:
        """Up to ``limit`` faults of ``payload`` (none when it is valid) and how many were left out.

        The work is bounded whatever the payload: every fault is listed (and counted) only for a
        payload of at most :data:`SCAN_NODES` nodes; a larger one gets its first fault alone.
        """
        validator = self._validator
        if validator.is_valid(payload):
            return Faults([], 0)
        if not _within(payload, SCAN_NODES):
            try:
                validator.validate(payload)
            except self._error as err:
                return Faults([_detail(err, self._required)], None)
            return Faults([], 0)  # pragma: no cover - is_valid said it was not
        found = validator.evaluate(payload).errors()
        details = [_evaluated(entry) for entry in found[:limit]]
        return Faults(details, len(found) - len(details))


def _detail(err: Any, required: type) -> dict[str, Any]:
    path = [str(p) for p in err.instance_path]
    missing = getattr(err.kind, "property", None)
    if isinstance(missing, str) and isinstance(err.kind, required):
        path.append(missing)
    return {"field": ".".join(["payload", *path]), "message": err.message}


_REQUIRED = re.compile(r"^(.*) is a required property$")


def _evaluated(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One ``evaluate()`` error entry as a ``details`` entry: the instance location as a dotted
    path (JSON Pointer unescaped), with a missing required property named as its own field."""
    pointer = str(entry.get("instanceLocation") or "")
    path = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]] if pointer else []
    message = str(entry.get("error") or "invalid")
    required = _REQUIRED.match(message)
    if required is not None and str(entry.get("schemaLocation", "")).endswith("/required"):
        name = required.group(1)
        # The message quotes the name as JSON does.
        try:
            decoded = json.loads(name)
        except ValueError:
            decoded = name
        if isinstance(decoded, str):
            path.append(decoded)
    return {"field": ".".join(["payload", *path]), "message": message}


def _within(value: Any, budget: int) -> bool:
    """Whether ``value`` holds at most ``budget`` nodes; stops counting once it is past."""
    stack = [value]
    seen = 1
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            # Counted before they are stacked: a million-item array is refused in one step.
            seen += len(node)
            if seen > budget:
                return False
            stack.extend(node.values() if isinstance(node, dict) else node)
    return seen <= budget
