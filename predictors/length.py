"""Length predictors for ``trace_plus``: predicted generated tokens of one rollout from an anchor.

A bare rollout costs L~(root) tokens and a continuation from prefix H_t costs L~(H_t), only its
remaining turns. Chosen by name from ``LENGTH_PREDICTORS`` (ridge, or 'module:attr').

Targets, fitted from finished trees (``length_targets``): every node y that has children gets

    R(y) = mean over y's children c of g(c's path from c to its leaf),    weight = number of children,

with g the model-generated tokens of those turns. [choice] As the debiased success targets do
(platform/tracerl/tree.py), each child counts once as one policy-sampled rollout from y, however
far its own subtree was expanded, so prefixes expanded more often do not weigh more. [choice] A
turn without tokens (the simulator) counts as one token, so there lengths are turns.

``ridge``: weighted ridge regression of log(1 + R) on [x(H), depth, 1] (x the featurizer's
vector: the simulator's numeric features, else prompt length and tokens generated so far), predicting exp(.) - 1 clipped to at least one token.
Sufficient statistics are discounted by ``discount`` per fit (online, exact, no replay).
[choice] Before the first fit, and for anchors of another feature width, it predicts
``prior_tokens``; a change of feature width restarts the fit. [choice] It is ``ready`` after 200
targets in all (``min_examples``): a 3-step smoke run that priced from 9 targets under-predicted
continuation costs and spent 3027 generated tokens against a 600-token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from tracerl.predictor import LENGTH_PREDICTORS
from tracerl.predictors.features import Featurizer, NumericFeaturizer
from tracerl.tree import Node, RolloutTree
from tracerl.types import Anchor

__all__ = ["LENGTH_PREDICTORS", "LengthTargets", "RidgeLengthPredictor", "length_targets"]


@dataclass(frozen=True)
class LengthTargets:
    """Training examples: one per node with children."""

    anchors: list[Anchor]
    tokens: np.ndarray
    """R(y): mean generated tokens of one rollout from the anchor, shape (n,)."""
    weights: np.ndarray
    """Number of children of the node, shape (n,)."""


def generated_tokens(node: Node) -> int:
    """Model-generated tokens of one turn (1 for a turn without tokens: the simulator)."""
    if node.model_mask:
        return int(sum(node.model_mask))
    return len(node.token_ids) if node.token_ids else 1


def length_targets(trees: Sequence[RolloutTree]) -> LengthTargets:
    """R(y) and its weight for every node whose children's paths finished (module docstring)."""
    anchors: list[Anchor] = []
    tokens: list[float] = []
    weights: list[float] = []
    for tree in trees:
        finished = {n.path_id for n in tree.nodes[1:] if n.is_leaf}
        # rest[n]: tokens from node n down its own path to that path's leaf (n included).
        rest = np.zeros(len(tree.nodes))
        for node in reversed(tree.nodes[1:]):
            own = [c for c in node.children if tree.nodes[c].path_id == node.path_id]
            rest[node.node_id] = generated_tokens(node) + (rest[own[0]] if own else 0.0)
        history: list[tuple[Node, ...]] = [()]
        for node in tree.nodes[1:]:
            history.append(history[node.parent or 0] + (node,))
        for node in tree.nodes:
            samples = [rest[c] for c in node.children if tree.nodes[c].path_id in finished]
            if node.is_leaf or not samples:
                continue
            anchors.append(Anchor(tree.prompt, history[node.node_id]))
            tokens.append(float(np.mean(samples)))
            weights.append(float(len(samples)))
    return LengthTargets(anchors, np.asarray(tokens, float), np.asarray(weights, float))


class LengthFeatures(NumericFeaturizer):
    """The numeric featurizer where prompts carry features (simulator); otherwise, for text environments,
    [log(1 + prompt characters), log(1 + generated tokens so far on the prefix)]."""

    def __call__(self, anchors: Sequence[Anchor]) -> np.ndarray:
        if anchors and anchors[0].prompt.features is not None:
            return super().__call__(anchors)
        return np.array(
            [
                [np.log1p(len(a.prompt.text)), np.log1p(sum(generated_tokens(n) for n in a.history))]
                for a in anchors
            ],
            dtype=np.float32,
        ).reshape(len(anchors), 2)


class RidgeLengthPredictor:
    """Weighted ridge regression of log(1 + tokens) on anchor features (module docstring)."""

    def __init__(
        self,
        featurizer: Featurizer | None = None,
        l2: float = 1.0,
        discount: float = 0.9,
        prior_tokens: float = 256.0,
        min_examples: int = 200,
    ) -> None:
        if l2 <= 0 or not 0 < discount <= 1 or prior_tokens < 1:
            raise ValueError(
                f"length predictor needs l2 > 0, 0 < discount <= 1, prior_tokens >= 1 "
                f"(got l2={l2}, discount={discount}, prior_tokens={prior_tokens})"
            )
        self.featurizer: Featurizer = featurizer or LengthFeatures()
        self.l2, self.discount, self.prior_tokens = l2, discount, prior_tokens
        self.xtx: np.ndarray | None = None
        self.xty: np.ndarray | None = None
        self.coef: np.ndarray | None = None
        self.steps_fit = 0
        self.examples_seen = 0
        self.min_examples = min_examples

    @property
    def ready(self) -> bool:
        """True once fitted on ``min_examples`` targets in all; until then trace_plus allocates as trace."""
        return self.examples_seen >= self.min_examples

    def _design(self, anchors: Sequence[Anchor]) -> np.ndarray:
        x = np.asarray(self.featurizer(anchors), float)
        depth = np.array([[a.depth] for a in anchors], float)
        return np.concatenate([x, depth, np.ones((len(anchors), 1))], axis=1)

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """Predicted generated tokens of one rollout from each anchor, shape (n,), each >= 1."""
        if not anchors:
            return np.zeros(0)
        x = self._design(anchors)
        if self.coef is None or x.shape[1] != len(self.coef):
            return np.full(len(anchors), self.prior_tokens)
        return np.maximum(np.expm1(np.clip(x @ self.coef, 0.0, 30.0)), 1.0)

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """One online update on the finished trees of a step; returns the fit's weighted log-MSE."""
        data = length_targets(trees)
        self.steps_fit += 1
        if not data.anchors:
            return {}
        x = self._design(data.anchors)
        self.examples_seen += len(data.anchors)
        y = np.log1p(data.tokens)
        w = data.weights / data.weights.mean()
        if self.xtx is None or self.xty is None or self.xtx.shape[0] != x.shape[1]:
            self.xtx, self.xty = np.zeros((x.shape[1], x.shape[1])), np.zeros(x.shape[1])
        self.xtx = self.discount * self.xtx + (x * w[:, None]).T @ x
        self.xty = self.discount * self.xty + (x * w[:, None]).T @ y
        reg = self.l2 * np.eye(x.shape[1])
        reg[-1, -1] = 0.0  # the intercept is not shrunk
        self.coef = np.linalg.solve(self.xtx + reg, self.xty)
        return {
            "length_log_mse": float(np.average((x @ self.coef - y) ** 2, weights=w)),
            "length_examples": float(len(y)),
        }

    def state_dict(self) -> dict[str, object]:
        """Everything needed to resume (checkpoints), with the numeric featurizer's widths."""
        dims = (
            (self.featurizer.prompt_dim, self.featurizer.prefix_dim)
            if isinstance(self.featurizer, NumericFeaturizer)
            else None
        )
        return {
            "xtx": self.xtx,
            "xty": self.xty,
            "coef": self.coef,
            "steps_fit": self.steps_fit,
            "dims": dims,
            "examples_seen": self.examples_seen,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.xtx, self.xty, self.coef = (cast("np.ndarray | None", state[k]) for k in ("xtx", "xty", "coef"))
        self.steps_fit = int(cast(int, state["steps_fit"]))
        self.examples_seen = int(cast(int, state.get("examples_seen", 0)))
        if isinstance(self.featurizer, NumericFeaturizer) and state.get("dims") is not None:
            self.featurizer.prompt_dim, self.featurizer.prefix_dim = cast(
                "tuple[int | None, int | None]", state["dims"]
            )
