"""Loading an agent application for ``reach agent --app module:attribute``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from reachmesh.exceptions import ConfigError
from reachmesh.sdk.agent import ReachAgent


def load_app(spec: str) -> ReachAgent:
    """Import ``module:attribute`` or ``path/to/file.py:attribute``; it must be a ReachAgent.

    The working directory goes on ``sys.path`` (as ``python -m`` does), which is why this lives
    with the command line: only an entry point may change process-wide state.
    """
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app must look like module:attribute or path/to/file.py:attribute, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise ConfigError(f"--app: no such file {module_name!r}")
            loader_spec = importlib.util.spec_from_file_location(f"reach_app_{file.stem}", file)
            if loader_spec is None or loader_spec.loader is None:
                raise ConfigError(f"--app: cannot load {module_name!r}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    except SyntaxError as exc:
        # The user's own typo: where it is, in one line (the traceback's frames are the loader's).
        where = f"{exc.filename or module_name}, line {exc.lineno}"
        raise ConfigError(f"cannot import {module_name!r}: {where}: {exc.msg}") from exc
    if not hasattr(module, attr):
        raise ConfigError(f"{module_name!r} has no attribute {attr!r}")
    agent = getattr(module, attr)
    if not isinstance(agent, ReachAgent):
        raise ConfigError(f"{spec} is not a ReachAgent (got {type(agent).__name__})")
    return agent
