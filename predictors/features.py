"""Anchor featurizers: turn roots and prefixes into fixed-size vectors for the learned predictor.

``NumericFeaturizer`` reads the numeric features the simulator puts on prompts and prefix nodes:
x = [prompt features, prefix features (zeros for a root), 1 if root else 0]. Text environments
plug in a text encoder with the same call signature.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from tracerl.predictor import Featurizer
from tracerl.types import Anchor

__all__ = ["Featurizer", "NumericFeaturizer", "prompt_bucket"]


def prompt_bucket(prompt_id: str, buckets: int) -> int:
    """Stable hash of a prompt id into ``buckets`` rows (crc32; Python's hash is salted per process)."""
    return zlib.crc32(prompt_id.encode()) % max(buckets, 1)


class NumericFeaturizer:
    """Concatenate the prompt's and the prefix node's numeric features."""

    def __init__(self) -> None:
        self.prompt_dim: int | None = None
        self.prefix_dim: int | None = None

    def __call__(self, anchors: Sequence[Anchor]) -> np.ndarray:
        rows = []
        for a in anchors:
            pf = a.prompt.features
            if pf is None:
                raise ValueError(
                    f"prompt {a.prompt.prompt_id!r} has no numeric features; the numeric featurizer "
                    "serves the simulator; text environments need a text featurizer"
                )
            self.prompt_dim = self.prompt_dim or len(pf)
            node = a.node
            if node is not None and node.features is not None:
                self.prefix_dim = self.prefix_dim or len(node.features)
                xf = node.features
            else:
                xf = np.zeros(self.prefix_dim or 0)
            rows.append((pf, xf, node is None))
        # Roots seen before any prefix get zero-padded to the prefix width once it is known.
        width = self.prefix_dim or 0
        out = np.zeros((len(rows), (self.prompt_dim or 0) + width + 1), dtype=np.float32)
        for i, (pf, xf, is_root) in enumerate(rows):
            out[i, : len(pf)] = pf
            out[i, len(pf) : len(pf) + len(xf)] = xf
            out[i, -1] = float(is_root)
        return out
