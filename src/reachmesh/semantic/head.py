"""The few-shot head: a softmax regression over the capabilities' example vectors.

Similarity to the nearest rows tells a text *near* a capability from one that is not (the
refusal signal), but among capabilities that are all near, the rows of one capability are a
better judge than any single row: a linear classifier trained on every capability's examples
learns which directions of the embedding tell them apart. On Banking77 (docs/semantic-eval.md)
it chose the right intent far more often than the nearest example.

It trains on the capability texts embedded *as queries* (e5's "query: " prefix, as a request is
embedded), not on the passage rows similarity scores against: a request is then classified
among vectors of its own kind. On Banking77's validation phrases that gave 64.9% right at 2.9%
wrong where the passage rows gave 59.1% (docs/semantic-eval.md). Similarity still shortlists and
refuses on the passage rows.

The head is trained off the request path (a worker thread, a time budget), whenever the rows of
the index change, and replaces the previous one only when done: a request always reads a whole
head, the old one meanwhile. It covers the tasks that have examples (or learned phrases);
capabilities with a description only are judged by similarity alone, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]

# A task needs this many rows (its name and description count) to be a class of the head: one
# row says too little about where a capability ends.
MIN_ROWS = 3
# Logits are this times the dot product of unit vectors: cosines between texts span a narrow band,
# and the scale lets a few steps of gradient descent separate classes without huge weights.
SCALE = 20.0
# L2 penalty on the weights, relative to the data term: keeps each class's weights near its
# examples' mean direction when examples are few.
L2 = 1e-3
STEPS = 300
LEARNING_RATE = 0.5
# The most a retrain may take, wall clock; past it, the weights reached so far are used.
BUDGET_S = 5.0


@dataclass(slots=True, frozen=True)
class Head:
    """A trained head: its classes (tasks), weights and biases."""

    tasks: tuple[str, ...]
    weights: Vector  # (dim, classes)
    bias: Vector  # (classes,)
    generation: int  # the index generation it was trained on
    steps: int  # gradient steps taken (fewer than STEPS when the budget ran out)

    def covers(self, task: str) -> bool:
        return task in self.tasks

    def probabilities(self, query: Vector) -> Vector:
        logits = SCALE * (query @ self.weights) + self.bias
        logits -= logits.max()
        odds = np.exp(logits)
        out: Vector = (odds / odds.sum()).astype(np.float32)
        return out

    def probability(self, query: Vector, task: str, aside: Collection[str] = ()) -> float:
        """The probability of ``task`` (one of :attr:`tasks`) over all the head's classes but
        those ``aside`` (tasks a caller's request may not go to: their share is not a doubt)."""
        probs = self.probabilities(query)
        total = 1.0 - sum(float(probs[self.tasks.index(t)]) for t in aside if t in self.tasks)
        return float(probs[self.tasks.index(task)]) / max(total, 1e-9)

    def pick(self, query: Vector, allowed: Callable[[str], bool]) -> tuple[str, float, float] | None:
        """The most probable allowed task, its probability and the runner-up's (among the
        allowed ones, renormalised); None when fewer than one is allowed."""
        probs = self.probabilities(query)
        order = np.argsort(-probs)
        kept: list[int] = []
        for i in order:
            if allowed(self.tasks[int(i)]):
                kept.append(int(i))
                if len(kept) == 2:
                    break
        if not kept:
            return None
        total = float(sum(probs[i] for i in order if allowed(self.tasks[int(i)])))
        total = total if total > 0 else 1.0
        first = float(probs[kept[0]]) / total
        second = float(probs[kept[1]]) / total if len(kept) > 1 else 0.0
        return self.tasks[kept[0]], first, second


def query_rows(passages: Mapping[str, Vector], queries: Mapping[str, Vector]) -> dict[str, Vector] | None:
    """What the head trains on: every task's texts embedded as queries; None while some task
    the head would cover still lacks some of them (they are embedded after its passage rows, in
    the background), so a head is never trained on half of one kind and half of the other.
    ``queries`` holds only texts whose passage row is in (:class:`CapabilityVectors`), so equal
    counts mean the same texts."""
    out = {}
    for task, matrix in passages.items():
        if len(matrix) < MIN_ROWS:
            continue
        asked = queries.get(task)
        if asked is None or len(asked) != len(matrix):
            return None
        out[task] = asked
    return out


def train(
    rows: Mapping[str, Vector],
    generation: int,
    *,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> Head | None:
    """A head over the tasks with at least MIN_ROWS rows; None when fewer than two have."""
    tasks = tuple(sorted(task for task, matrix in rows.items() if len(matrix) >= MIN_ROWS))
    if len(tasks) < 2:
        return None
    features = np.concatenate([rows[task] for task in tasks]).astype(np.float32)
    labels = np.concatenate([np.full(len(rows[task]), i) for i, task in enumerate(tasks)])
    # Each class weighs the same whatever its number of examples.
    counts = np.bincount(labels, minlength=len(tasks)).astype(np.float32)
    sample_weight = (1.0 / counts[labels]) / len(tasks)
    target = np.zeros((len(labels), len(tasks)), dtype=np.float32)
    target[np.arange(len(labels)), labels] = 1.0
    # Start from each class's mean direction: already a nearest-centroid classifier.
    weights = np.stack([rows[task].mean(axis=0) for task in tasks], axis=1).astype(np.float32)
    bias = np.zeros(len(tasks), dtype=np.float32)
    deadline = clock() + budget_s
    steps = 0
    while steps < STEPS and clock() < deadline:
        logits = SCALE * (features @ weights) + bias
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        error = (probs - target) * sample_weight[:, None]
        weights -= LEARNING_RATE * (SCALE * (features.T @ error) + L2 * weights)
        bias -= LEARNING_RATE * error.sum(axis=0)
        steps += 1
    return Head(tasks, weights.astype(np.float32), bias.astype(np.float32), generation, steps)
