"""Input schemas: the shorthand, full JSON Schema, and payload validation."""

from __future__ import annotations

import pytest

from reachmesh.schema import PayloadValidator, check_schema, is_full_schema, to_json_schema


def test_shorthand_expands_with_optional_fields() -> None:
    """`{field: type}` becomes an object schema; a trailing ? makes a field optional."""
    schema = to_json_schema({"product_id": "string", "currency": "string?", "n": "integer"})
    assert schema["properties"]["currency"] == {"type": "string"}
    assert schema["required"] == ["product_id", "n"]


def test_full_schema_is_kept_as_is() -> None:
    """A mapping with properties or type: object is JSON Schema, not shorthand."""
    full = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}
    assert is_full_schema(full)
    assert to_json_schema(full) is full
    assert PayloadValidator(full).errors({"a": 1})[0]["field"] == "payload.a"


def test_validator_names_missing_and_wrong_fields() -> None:
    """Each fault names its field: missing required ones and wrong types alike."""
    validator = PayloadValidator({"product_id": "string", "currency": "string?"})
    assert validator.errors({"product_id": "x"}) == []
    assert validator.errors({"product_id": "x", "extra": 1}) == []
    fields = {d["field"] for d in validator.errors({"currency": 5})}
    assert fields == {"payload.product_id", "payload.currency"}


@pytest.mark.parametrize(
    "schema",
    [
        {"a": "text"},
        {"a": 3},
        {"type": "object", "properties": {"a": {"type": "nonsense"}}},
        {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}},
    ],
)
def test_unusable_schemas_are_refused(schema: dict) -> None:
    """Unknown shorthand types, invalid JSON Schema and remote $ref are refused."""
    with pytest.raises(ValueError):
        check_schema(schema)


def test_local_refs_are_allowed() -> None:
    """A local $ref into the same schema is fine."""
    check_schema(
        {"type": "object", "$defs": {"id": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/id"}}}
    )


def test_a_light_install_is_told_how_to_add_the_router_extra_as_the_cli_tells_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Validating a payload without jsonschema-rs names the router extra with the same hint as
    `reach router` on a light install (it once gave a shorter copy, without the wheel's way)."""
    import typer

    from reachmesh import schema
    from reachmesh.cli import console

    monkeypatch.setattr(schema, "_compiler", lambda: None)
    with pytest.raises(ImportError) as refused:
        PayloadValidator({"a": "string"})
    monkeypatch.setattr(console, "_ROUTER_MODULES", ("reachmesh_no_such_module",))
    with pytest.raises(typer.Exit):
        console.need_router("reach router")
    said = " ".join(capsys.readouterr().err.split())
    assert "the wheel's path with [router]" in schema.ROUTER_EXTRA_HINT
    assert schema.ROUTER_EXTRA_HINT in str(refused.value), refused.value
    assert schema.ROUTER_EXTRA_HINT in said, said
