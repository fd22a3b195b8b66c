"""The configuration reference (docs/configuration.md) documents every policy key the code reads,
with the default the code uses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reachmesh.config import RouterConfig

CONFIGURATION = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(
    encoding="utf-8"
)


def leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf key of the policy, dotted, with its default."""
    found: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.extend(leaves(annotation, f"{prefix}{name}."))
        else:
            found.append((f"{prefix}{name}", field.default))
    return found


def policy_table() -> str:
    """The section of the configuration reference that holds the policy file's table."""
    return CONFIGURATION.split("\n## The policy file\n", 1)[1].split("\n## ", 1)[0]


def test_every_policy_key_is_in_the_configuration_table() -> None:
    """Each leaf of RouterConfig appears in the configuration reference's policy table."""
    table = policy_table()
    first_cells = re.findall(r"^\| ([^|]+) \|", table, flags=re.MULTILINE)
    documented = {token for cell in first_cells for token in re.findall(r"`([^`]+)`", cell)}
    # `tasks.<task>.{connect_ms,...}` documents the per-task map as a whole.
    missing = [
        key
        for key, _ in leaves(RouterConfig)
        if key not in documented and not any(token.startswith(f"{key}.") for token in documented)
    ]
    assert not missing, f"undocumented policy keys: {missing}"


def test_documented_numeric_defaults_match_the_code() -> None:
    """Where the table gives a number as a key's default, it is the code's default."""
    table = policy_table()
    rows = dict(re.findall(r"^\| `([^|`]+)` \| ([0-9.]+) \|", table, flags=re.MULTILINE))
    defaults = dict(leaves(RouterConfig))
    wrong = {
        key: (value, defaults[key])
        for key, value in rows.items()
        if key in defaults and isinstance(defaults[key], int | float) and float(value) != float(defaults[key])
    }
    assert not wrong, f"docs/configuration.md default differs from the code: {wrong}"
