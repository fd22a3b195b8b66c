"""The public API: every name in ``reachmesh.__all__`` resolves, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import reachmesh


def test_every_public_name_resolves_to_the_object_in_its_module() -> None:
    assert set(reachmesh.__all__) == {"__version__", *reachmesh._PUBLIC}
    for name in reachmesh.__all__:
        assert getattr(reachmesh, name) is not None, name
    from reachmesh.sdk import ReachAgent
    from reachmesh.server.app import create_app

    assert reachmesh.ReachAgent is ReachAgent
    assert reachmesh.create_app is create_app


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        reachmesh.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("reachmesh.NoSuchThing resolved")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_an_agent_importing_the_sdk_does_not_load_the_router() -> None:
    loaded = _modules_after("from reachmesh import ReachAgent, ReachClient")
    assert "reachmesh.sdk.agent" in loaded
    router_side = {
        m for m in loaded if m.startswith(("reachmesh.server", "reachmesh.router", "reachmesh.routing"))
    }
    assert router_side == set()
    assert "uvicorn" not in loaded and "starlette" not in loaded
