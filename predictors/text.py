"""Featurizers for text anchors (real environments): what the learned predictor reads of a history.

* ``HashedNgramFeaturizer``: word uni/bigrams of the question and of the turns so far, hashed into two
  fixed-size count vectors (log-scaled, L2-normalised), plus depth and the number of error
  observations. No training, no download; the head learns what matters.
* ``PolicyHiddenFeaturizer``: the policy's own last hidden state at the end of the anchor's context,
  under stop-gradient (a text encoder that already knows the task format), plus depth.

[choice] Histories are left-truncated to ``max_tokens`` keeping the question (docs/method.md, "The shared predictor").
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from tracerl.types import Anchor

_WORD = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")


def _history_text(a: Anchor) -> str:
    return "".join(n.content for n in a.history)


class HashedNgramFeaturizer:
    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _vec(self, text: str) -> np.ndarray:
        words = _WORD.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        v = np.zeros(self.dim, dtype=np.float32)
        for g in grams:
            v[zlib.crc32(g.encode()) % self.dim] += 1.0
        v = np.log1p(v)
        n = np.linalg.norm(v)
        return v / n if n > 0 else v

    def __call__(self, anchors: Sequence[Anchor]) -> np.ndarray:
        out = np.zeros((len(anchors), 2 * self.dim + 2), dtype=np.float32)
        for i, a in enumerate(anchors):
            hist = _history_text(a)
            out[i, : self.dim] = self._vec(a.prompt.text)
            out[i, self.dim : 2 * self.dim] = self._vec(hist)
            out[i, -2] = a.depth / 8.0
            out[i, -1] = hist.count("Error:") / 4.0
        return out


class PolicyHiddenFeaturizer:
    """Last-layer hidden state of the policy at the last token of the anchor's text, no gradient."""

    def __init__(
        self, model: Any, tokenizer: Any, render: Any, max_tokens: int = 512, batch_size: int = 32
    ) -> None:
        self.model, self.tok, self.render = model, tokenizer, render
        self.max_tokens, self.batch_size = max_tokens, batch_size

    def __call__(self, anchors: Sequence[Anchor]) -> np.ndarray:
        import torch

        feats = []
        for i in range(0, len(anchors), self.batch_size):
            chunk = anchors[i : i + self.batch_size]
            ids = []
            for a in chunk:
                q = self.tok(self.render(a.prompt.text), add_special_tokens=False)["input_ids"]
                h = self.tok(_history_text(a), add_special_tokens=False)["input_ids"]
                room = max(self.max_tokens - len(q), 0)
                ids.append(q + (h[-room:] if room else []))  # left-truncate the history, keep the question
            width = max(len(x) for x in ids)
            x = torch.full((len(ids), width), self.tok.pad_token_id)
            m = torch.zeros_like(x)
            for r, row in enumerate(ids):
                x[r, width - len(row) :] = torch.tensor(row)
                m[r, width - len(row) :] = 1
            with torch.no_grad():
                out = self.model(input_ids=x, attention_mask=m, output_hidden_states=True)
            last = out.hidden_states[-1][:, -1, :].float().numpy()
            depth = np.array([[a.depth / 8.0] for a in chunk], dtype=np.float32)
            feats.append(np.concatenate([last, depth], axis=1))
        return np.concatenate(feats) if feats else np.zeros((0, 1), dtype=np.float32)
