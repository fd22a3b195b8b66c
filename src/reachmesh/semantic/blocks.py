"""Capability vectors as bytes, so that one Router's embeddings serve every Router.

A shared registry (etcd) stores one block per agent and model: the (task, text) rows and their
float32 vectors. A Router that sees the agent registered through another Router takes the rows
from the block instead of embedding them again; with float32 kept as is, every Router routes
on the very same numbers.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson

from reachmesh.semantic.index import Vector

Row = tuple[str, str]


def encode_block(model: str, rows: list[Row], matrix: Vector) -> bytes:
    """One agent's rows and their vectors (``matrix[i]`` is ``rows[i]``'s vector)."""
    data = np.ascontiguousarray(matrix, dtype=np.float32)
    return orjson.dumps(
        {
            "model": model,
            "dim": int(data.shape[1]) if data.ndim == 2 else 0,
            "rows": rows,
            "data": base64.b64encode(data.tobytes()).decode("ascii"),
        }
    )


def decode_block(block: bytes, model: str, dim: int) -> dict[Row, Vector]:
    """The rows of a block made with ``model`` at ``dim``; empty when it is not one (or broken)."""
    try:
        raw = orjson.loads(block)
        if raw.get("model") != model or int(raw.get("dim", 0)) != dim:
            return {}
        rows = [(str(task), str(text)) for task, text in raw["rows"]]
        matrix = np.frombuffer(base64.b64decode(raw["data"]), dtype=np.float32).reshape(len(rows), dim)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return {}
    return {row: matrix[i] for i, row in enumerate(rows)}
