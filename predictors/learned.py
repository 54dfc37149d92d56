"""The learned predictor: an MLP over anchor features, the prompt's outcome history and identity.

    V~(H) = sigmoid(MLP([x(H), h(prompt), e[id]]) + b[id])

* x(H): the featurizer's vector (simulator: prompt and prefix features; text: an encoder's).
* h(prompt): the prompt's discounted bare-rollout history *before* the step being predicted
  (posterior mean, log evidence, seen flag; predictors/history.py), so the head learns how far to
  trust revisits over features.
* e[id], b[id]: a hashed prompt-identity embedding (``embedding_buckets`` rows, 0 = off) and a
  per-prompt logit bias, updated by sparse Adam at ``embedding_lr``, as a text encoder effectively
  recognises a prompt it has seen.

Trained online each RL step by MSE on the recursive targets V^ of the step's trees (section 6),
weighted by leaf counts n_y (normalised to mean 1) if ``weight_by_leaves``, for ``fit_steps`` Adam
steps on minibatches from a replay window of the last ``replay_steps`` steps. With
``targets=debiased`` the targets are D and the weights each node's number of children
(platform/tracerl/tree.py).

[choice] Architecture: 2-layer tanh MLP of width ``hidden_size``; 4-dim identity embedding plus
bias; cold start is uniform allocation until ``warmup_steps`` fits (predictor.ready).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from tracerl.algos.config import PredictorConfig
from tracerl.predictors.base import FeaturizerFactory, Predictor, tree_targets
from tracerl.predictors.features import Featurizer, NumericFeaturizer, prompt_bucket
from tracerl.predictors.history import PromptHistory
from tracerl.tree import RolloutTree
from tracerl.types import Anchor

EMBED_DIM = 4


class _Net(nn.Module):
    def __init__(self, in_dim: int, hidden: int, buckets: int) -> None:
        super().__init__()
        # EMBED_DIM inputs to the MLP plus one per-prompt logit bias (the last column), zero at start.
        self.embed = nn.Embedding(buckets, EMBED_DIM + 1, sparse=True) if buckets else None
        if self.embed is not None:
            nn.init.zeros_(self.embed.weight)
        self.in_dim = in_dim
        width = in_dim + (EMBED_DIM if buckets else 0)
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.embed is None:
            return self.mlp(x).squeeze(-1)
        e = self.embed(ids)
        return self.mlp(torch.cat([x, e[:, :EMBED_DIM]], dim=-1)).squeeze(-1) + e[:, EMBED_DIM]


class LearnedPredictor(Predictor):
    def __init__(
        self, cfg: PredictorConfig, seed: int = 0, features: FeaturizerFactory | None = None
    ) -> None:
        super().__init__(cfg, seed, features)
        self.featurizer: Featurizer = features() if features is not None else NumericFeaturizer()
        self.history = PromptHistory(cfg.discount)
        self.net: _Net | None = None
        self.replay: deque[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = deque(
            maxlen=cfg.replay_steps
        )
        self._gen = torch.Generator().manual_seed(cfg.seed + 7919 * seed)
        self._opts: list[torch.optim.Optimizer] = []

    def _inputs(self, anchors: Sequence[Anchor]) -> tuple[np.ndarray, np.ndarray]:
        ids = [a.prompt.prompt_id for a in anchors]
        x = np.concatenate([self.featurizer(anchors), self.history.features(ids)], axis=1)
        b = self.cfg.embedding_buckets
        return x.astype(np.float32), np.array([prompt_bucket(i, b) for i in ids], dtype=np.int64)

    def _build(self, in_dim: int) -> _Net:
        torch.manual_seed(self.cfg.seed + 7919 * self.seed)
        net = _Net(in_dim, self.cfg.hidden_size, self.cfg.embedding_buckets)
        self._opts = [torch.optim.Adam(net.mlp.parameters(), lr=self.cfg.lr)]
        if net.embed is not None:
            self._opts.append(torch.optim.SparseAdam(list(net.embed.parameters()), lr=self.cfg.embedding_lr))
        return net

    def _check_width(self, width: int) -> None:
        """A featurizer whose width changes after the first fit would make the net score garbage (or, as it once
        did, return 0.5 while reporting ready): fail and say what changed."""
        assert self.net is not None
        if width != self.net.in_dim:
            raise ValueError(
                f"the learned predictor was fit on {self.net.in_dim} input features but now gets {width} "
                f"(featurizer {type(self.featurizer).__name__} plus the prompt history): the featurizer must "
                "return one width for every anchor, roots and prefixes alike"
            )

    def _score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        if self.net is None:
            return np.full(len(anchors), 0.5)  # not fit yet: cold start (allocation is uniform until ready)
        x, ids = self._inputs(anchors)
        self._check_width(x.shape[1])
        with torch.no_grad():
            logits = self.net(torch.from_numpy(x), torch.from_numpy(ids))
        return torch.sigmoid(logits).numpy().astype(float)

    def _fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        data = tree_targets(trees, self.cfg.targets)
        x, ids = self._inputs(data.anchors)  # history as it was when these anchors were scored
        self.history.update(trees)
        if not data.anchors:
            return {}
        w = data.weights if self.cfg.weight_by_leaves else np.ones_like(data.weights)
        self.replay.append((x, ids, data.values.astype(np.float32), w.astype(np.float32)))
        if self.net is None:
            self.net = self._build(x.shape[1])
        self._check_width(x.shape[1])
        rows = list(self.replay)
        xs, idx_all, ys, ws = (torch.from_numpy(np.concatenate([r[k] for r in rows])) for k in range(4))
        ws = ws / ws.mean()
        n = len(ys)
        loss_val = 0.0
        for _ in range(self.cfg.fit_steps):
            idx = torch.randint(0, n, (min(self.cfg.batch_size, n),), generator=self._gen)
            pred = torch.sigmoid(self.net(xs[idx], idx_all[idx]))
            loss = (ws[idx] * (pred - ys[idx]) ** 2).mean()
            for opt in self._opts:
                opt.zero_grad()
            loss.backward()
            for opt in self._opts:
                opt.step()
            loss_val = float(loss.detach())
        return {"loss": loss_val, "examples": float(n)}

    def state_dict(self) -> dict[str, object]:
        """A deep copy of everything needed to resume (weights, optimiser moments, replay, rng)."""
        return copy.deepcopy(
            {
                **super().state_dict(),
                "history": self.history.state_dict(),
                "net": None if self.net is None else self.net.state_dict(),
                "in_dim": None if self.net is None else self.net.in_dim,
                "opts": [o.state_dict() for o in self._opts],
                "replay": list(self.replay),
                "gen": self._gen.get_state(),
            }
        )

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(cast("dict[str, object]", state["history"]))
        self.replay = deque(
            cast("list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]", state["replay"]),
            maxlen=self.cfg.replay_steps,
        )
        if state["net"] is not None:
            self.net = self._build(int(cast(int, state["in_dim"])))
            self.net.load_state_dict(cast("dict[str, Any]", state["net"]))
            for opt, s in zip(self._opts, cast("list[dict[str, Any]]", state["opts"])):
                opt.load_state_dict(s)
        self._gen.set_state(cast(torch.Tensor, state["gen"]))
