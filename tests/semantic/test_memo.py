"""The calibration's embedder cache: each (kind, text) reaches the model once, vectors unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from reachmesh.exceptions import EmbeddingError
from reachmesh.semantic.embedders.base import Kind, Vectors, normalise
from reachmesh.semantic.embedders.memo import MemoEmbedder


class Recording:
    """A tiny deterministic embedder that records what it was asked."""

    model = "recording"
    dim = 0
    thresholds = (0.1, 0.01)

    def __init__(self) -> None:
        self.asked: list[tuple[Kind, list[str]]] = []
        self.closed = False

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        if not texts:
            raise EmbeddingError("nothing to embed")
        self.asked.append((kind, list(texts)))
        self.dim = 3
        offset = 0.5 if kind == "query" else 0.0
        return normalise(np.array([[len(t), ord(t[0]), offset + 1] for t in texts], dtype=np.float32))

    async def close(self) -> None:
        self.closed = True


async def test_each_text_reaches_the_model_once_per_kind_and_rows_are_the_models() -> None:
    """Repeats within and across calls are served from memory, a text asked as another kind is
    embedded again, every row equals the model's own, and progress counts what the model did."""
    inner = Recording()
    counts: list[int] = []
    memo = MemoEmbedder(inner, counts.append)
    first = await memo.embed(["ab", "c", "ab"], "query")
    second = await memo.embed(["c", "def"], "query")
    third = await memo.embed(["c"], "passage")
    again = await memo.embed(["def", "ab"], "query")
    assert inner.asked == [("query", ["ab", "c"]), ("query", ["def"]), ("passage", ["c"])]
    assert counts == [2, 3, 4]
    fresh = Recording()
    np.testing.assert_array_equal(first, await fresh.embed(["ab", "c", "ab"], "query"))
    np.testing.assert_array_equal(second, await fresh.embed(["c", "def"], "query"))
    np.testing.assert_array_equal(third, await fresh.embed(["c"], "passage"))
    np.testing.assert_array_equal(again, await fresh.embed(["def", "ab"], "query"))
    assert (memo.model, memo.dim, memo.thresholds) == ("recording", 3, (0.1, 0.01))
    with pytest.raises(EmbeddingError, match="nothing to embed"):
        await memo.embed([], "query")
    await memo.close()
    assert inner.closed


async def test_the_name_is_the_inner_embedders_even_when_it_changes() -> None:
    """An HTTP embedder takes the name its service reports with the first answer; the memo shows
    that name, so the calibration it prints is keyed as the Router will look it up."""

    class Renaming(Recording):
        model = "http:http://127.0.0.1:1"

        async def embed(self, texts: list[str], kind: Kind) -> Vectors:
            self.model = "served-e5"
            return await super().embed(texts, kind)

    memo = MemoEmbedder(Renaming())
    assert memo.model == "http:http://127.0.0.1:1" and memo.dim == 0
    await memo.embed(["a"], "passage")
    assert memo.model == "served-e5" and memo.dim == 3
