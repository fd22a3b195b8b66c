"""One composition root: the parts are built in one place, and each part reloads itself (#37.10).

These read the source, as the layer contracts do: the failure they guard against is a shape of
the code (a part's attribute set from outside, a default built and then overwritten), which no
single request would show.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reachmesh.config import LimitsPolicy, RouterConfig
from reachmesh.server.components import RouterParts
from reachmesh.transport.fake import FakeTransport

SRC = Path(__file__).resolve().parents[1] / "src" / "reachmesh"

# The composition root, the app and the dispatcher: where parts used to be reached into.
WIRING = ["server/components.py", "server/app.py", "dispatch/dispatcher.py"]

# Data, not parts: the decision record is written by the stages and read by the observers.
RECORDS = {"record"}

# What the dispatcher may not take from the pipeline: it is handed what it uses.
PIPELINE_INSIDES = {"breakers", "affinity", "registry", "vectors", "capacity", "stats"}


def _foreign_assignments(tree: ast.AST) -> list[str]:
    """Assignments to an attribute of anything but ``self`` itself (``self.x.y = …``, ``a.b = …``)."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            while isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name):
                if owner.value.id not in RECORDS:
                    break
                owner = owner.value
            if isinstance(owner, ast.Name) and (owner.id == "self" or owner.id in RECORDS):
                continue
            found.append(f"line {target.lineno}: {ast.unparse(target)} = …")
    return found


@pytest.mark.parametrize("module", WIRING)
def test_no_part_has_its_attributes_set_from_outside(module: str) -> None:
    """A reload goes through each part's own apply(); wiring hands parts in at construction."""
    tree = ast.parse((SRC / module).read_text(encoding="utf-8"))
    assert _foreign_assignments(tree) == [], module


def test_the_dispatcher_does_not_reach_into_the_pipeline() -> None:
    tree = ast.parse((SRC / "dispatch/dispatcher.py").read_text(encoding="utf-8"))
    reached = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in PIPELINE_INSIDES
        and isinstance(node.value, (ast.Name, ast.Attribute))
        and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "pipeline"
    ]
    assert reached == []


def test_the_dispatcher_builds_no_part_of_its_own() -> None:
    """Every part it uses is a parameter: nothing is constructed in its __init__."""
    tree = ast.parse((SRC / "dispatch/dispatcher.py").read_text(encoding="utf-8"))
    dispatcher = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Dispatcher")
    init = next(n for n in dispatcher.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built = [
        ast.unparse(call.func)
        for call in ast.walk(init)
        if isinstance(call, ast.Call) and ast.unparse(call.func)[:1].isupper()
    ]
    assert built == []


def test_the_admin_page_labels_the_backend_without_knowing_etcd() -> None:
    source = (SRC / "server/ui.py").read_text(encoding="utf-8")
    assert "registry.etcd" not in source


def test_a_reload_reaches_every_part_through_its_own_method() -> None:
    parts = RouterParts.build(RouterConfig(), transport=FakeTransport())
    limits = LimitsPolicy(max_queued_per_agent=7, max_inflight=99)
    config = RouterConfig.model_validate(
        {
            "limits": limits.model_dump(),
            "routing": {"merit": {"ewma_tau_seconds": 9.0}},
            "outbound": {"allow_loopback": True},
            "logging": {"redact": ["card"]},
        }
    )
    parts.apply(config)
    assert parts.capacity.max_queued == 7
    assert parts.shedder.policy.max_inflight == 99
    assert parts.stats.tau == 9.0
    assert parts.url_guard.policy.allow_loopback
    assert parts.trace_log.redact_fields == ["card"]
    # The dispatcher's replyTo checks use the Router's one guard, so they follow it too.
    assert parts.dispatcher.url_guard is parts.url_guard
