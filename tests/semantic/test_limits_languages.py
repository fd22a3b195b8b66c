"""Declared limits in English and Chinese, through a Router with the bundled model (issue 41 item 4).

Each capability of ``tests/data/limits_bilingual.yaml`` declares its limits in both languages.
Every ``refused`` phrase must be kept off its capability by a limit (reason ``declared_limit``),
whichever language the phrase and the limit are in; no ``kept`` phrase may be, and each goes
where it goes when no capability declares limits. The Router's own limit margin for the model
is used (no override), as an operator would run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

CASES = yaml.safe_load((Path(__file__).parent.parent / "data" / "limits_bilingual.yaml").read_text("utf-8"))
CAPS: list[dict[str, Any]] = CASES["capabilities"]


def _agents(limits: bool) -> list[FakeAgent]:
    return [
        FakeAgent(
            f"{cap['task']}-agent",
            tasks=(cap["task"],),
            descriptions={cap["task"]: cap["description"]},
            examples={cap["task"]: cap["examples"]},
            limits={cap["task"]: cap["limits"]} if limits else {},
        )
        for cap in CAPS
    ]


@pytest.fixture(scope="module")
def routed() -> dict[str, dict[str, Any]]:
    """Every phrase of the file, asked once of one Router serving all three capabilities."""
    import asyncio

    return asyncio.run(_ask_all(limits=True))


@pytest.fixture(scope="module")
def unlimited() -> dict[str, dict[str, Any]]:
    """The same, the capabilities declaring no limits: where each phrase goes without them."""
    import asyncio

    return asyncio.run(_ask_all(limits=False))


async def _ask_all(*, limits: bool) -> dict[str, dict[str, Any]]:
    config = RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {"backend": "auto"},
            "limits": {"loop_lag_ms": 10_000},
        }
    )
    agents = _agents(limits)
    answers: dict[str, dict[str, Any]] = {}
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        try:
            for agent in agents:
                await agent.start()
                await agent.register(server.url)
            for cap in CAPS:
                for text in [*cap["refused"], *cap["kept"]]:
                    body = await http.post("/reach", json={"targetTask": text, "payload": {}})
                    answers[text] = body.json()
        finally:
            for agent in agents:
                await agent.stop()
    return answers


def _set_aside_by_limit(answer: dict[str, Any], task: str) -> str | None:
    """The limit that kept ``answer``'s text off ``task``, if one did."""
    for candidate in (answer.get("error") or {}).get("candidates") or []:
        if candidate["task"] == task and candidate["reason"] == "declared_limit":
            return str(candidate["limit"])
    return None


@pytest.mark.parametrize(
    ("task", "text"), [(c["task"], t) for c in CAPS for t in c["refused"]], ids=lambda v: str(v)
)
def test_a_limit_keeps_the_text_off_its_capability_in_either_language(routed, task, text) -> None:
    answer = routed[text]
    assert (answer.get("route") or {}).get("task") != task, answer
    assert _set_aside_by_limit(answer, task) is not None, answer


@pytest.mark.parametrize(
    ("task", "text"), [(c["task"], t) for c in CAPS for t in c["kept"]], ids=lambda v: str(v)
)
def test_the_capability_s_own_questions_are_not_taken_by_its_limits(routed, unlimited, task, text) -> None:
    answer, control = routed[text], unlimited[text]
    assert _set_aside_by_limit(answer, task) is None, answer
    assert answer["status"] == control["status"], (answer, control)
    assert (answer.get("route") or {}).get("task") == (control.get("route") or {}).get("task")


def test_a_refund_beside_a_capability_whose_examples_say_my_order() -> None:
    """The case issue 41 reported: the order tracker's examples all say "my order", so "I want a
    refund for my order" scored nearly as well against the tracker (mean of its best rows) as
    against the limit "refunds and returns", and comparing the two scores let the tracker keep
    it. Judged beyond what the tracker explains, the refund is what is left, and the limit
    holds; the tracker's own question stays below the margin."""
    from reachmesh.semantic.embedders.base import calibrated_limit_margin
    from reachmesh.semantic.embedders.local import LocalEmbedder
    from reachmesh.semantic.index import (
        BACKGROUND,
        SemanticIndex,
        capability_texts,
        language_means,
        limit_rows,
    )

    embedder = LocalEmbedder()
    run = _sync(embedder)
    texts = capability_texts(
        "track_order",
        "Track an order's shipping status",
        ["where is my order", "track my package", "has my order shipped yet", "when will my order arrive"],
    )
    index = SemanticIndex(dim=384)
    index.add("tracker", "track_order", texts, run(texts, "passage"))
    key, limits = limit_rows("track_order", ["refunds and returns"])
    index.add("tracker", key, limits, run(limits, "passage"))
    languages = language_means(run(list(BACKGROUND), "passage"))
    margin = calibrated_limit_margin(embedder.model)
    assert margin is not None
    refund, own = run(["I want a refund for my order", "where is my order 1234"], "query")
    hit = index.limit_hit(refund, "track_order", languages)
    assert hit is not None and hit[0] > margin, hit
    miss = index.limit_hit(own, "track_order", languages)
    assert miss is not None and miss[0] <= margin, miss


def _sync(embedder: Any) -> Any:
    import asyncio

    def run(texts: list[str], kind: str) -> np.ndarray:
        return np.asarray(asyncio.run(embedder.embed(texts, kind)), dtype=np.float32)

    return run


def test_the_kept_limit_basis_follows_the_limits_and_the_rows() -> None:
    """The residuals of a task's limits are kept between requests; a limit another agent adds,
    or one that leaves with its agent, counts from the next request on."""
    from reachmesh.semantic.index import SemanticIndex, limit_rows

    rng = np.random.default_rng(3)
    unit = rng.normal(size=(6, 16)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    index = SemanticIndex(dim=16)
    index.add("a", "task", ["t1", "t2"], unit[:2])
    key, texts = limit_rows("task", ["first"])
    index.add("a", key, texts, unit[2:3])
    query = unit[4]
    assert set(index.limit_hits(query, "task")) == {"a"}
    key, texts = limit_rows("task", ["the query itself"])
    index.add("b", key, texts, query[None, :])
    hits = index.limit_hits(query, "task")
    assert set(hits) == {"a", "b"} and hits["b"][0] > 0.99
    index.remove_agent("b")
    assert set(index.limit_hits(query, "task")) == {"a"}
