"""Reading a YAML file with errors that name the file, the line and the column.

Used by the Router's policy and by an agent's ``reach_config.yaml`` alike, so it sits at the
bottom of the package: the SDK reads its own files without importing the Router's config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from reachmesh.exceptions import ConfigError


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML file, mapping I/O and syntax errors to :class:`ConfigError`."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{file}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
