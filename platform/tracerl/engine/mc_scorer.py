"""Monte-Carlo scores for trace_mc (docs/method.md, "trace_mc"): success rates of extra rollouts of the policy.

    v(root)   = (s + a) / (K + 2a),  s successes among K extra bare rollouts of the prompt
    p(prefix) = (s + a) / (K + 2a),  s successes among K continuations from the prefix, on a copy of its tree

K is ``allocator.mc_samples`` and a ``allocator.mc_prior``. The extra rollouts run on the step's own backend (the
sampler pool, the ReAct engine or the simulator), so they sample the current policy, but apart from the step:

* their seeds are keyed under ``seeds.salted(run seed, "monte-carlo")``, not the run seed, so an estimate never
  replays the rollouts it predicts (with the run seed, the K extra bare rollouts of a prompt would be its first K
  training rollouts: an oracle, not an estimate);
* prefixes are continued on ``RolloutTree.detached`` copies, so the training trees do not change;
* the backend's ledger is swapped for a fresh one while they run, so the step's ledger (the token budget,
  ``budget/`` metrics, leaves) counts none of their work; ``take_metrics`` reports it as ``mc/`` metrics.

The step calls ``score`` on roots and ``score_prefixes`` on a tree's bare prefixes (``engine.step.TreeScorer``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import numpy as np

from tracerl import metrics as M
from tracerl.algos.allocators import Allocator, Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import TreeBackend
from tracerl.engine.seeds import salted
from tracerl.predictor import Predictor
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt

SALT = "monte-carlo"
"""Names the seed family of the Monte-Carlo rollouts (``seeds.salted``)."""


class SeededBackend(TreeBackend, Protocol):
    """A tree backend whose samples are keyed by its ``seed`` (the sampler pool, the ReAct engine, the simulator)."""

    seed: int


@runtime_checkable
class _Counting(Protocol):
    ledger: BudgetLedger


class MonteCarloScorer(Predictor):
    """Scores anchors by ``samples`` extra rollouts each on ``backend`` (module docstring); always ready.

    It stands in for ``inner``, the configured predictor, which still fits on every step's trees (its fit metrics and
    checkpoints are those of a run without trace_mc) but scores nothing.
    """

    def __init__(self, inner: Predictor, backend: SeededBackend, samples: int, prior: float = 1.0) -> None:
        super().__init__(inner.cfg, inner.seed)
        if samples < 1:
            raise ValueError(f"allocator.mc_samples must be >= 1 (got {samples})")
        self.inner, self.backend, self.samples, self.prior = inner, backend, samples, prior
        self._mc = BudgetLedger()
        self._seconds, self._rollouts = 0.0, 0
        self._held: list[RolloutTree] = []

    @property
    def ready(self) -> bool:
        return True

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """Roots: the success rate of ``samples`` extra bare rollouts of each prompt."""
        if any(a.depth for a in anchors):
            raise ValueError(
                "a Monte-Carlo prefix score continues from the prefix's tree: call score_prefixes"
            )
        return self.score_roots([a.prompt for a in anchors])

    def score_roots(self, prompts: Sequence[Prompt]) -> np.ndarray:
        if not prompts:
            return np.zeros(0)
        k = self.samples
        with self._apart(k * len(prompts)):
            trees = self.backend.rollout(prompts, [k] * len(prompts))
        # Held until the next step's roots: the sampler pool maps trees to the worker holding them by id(tree), and a
        # prefix copy made later in this step must not get the id of a dropped Monte-Carlo tree.
        self._held = trees
        return np.array([self._rate(sum(t.path_rewards().values()), k) for t in trees])

    def score_prefixes(self, trees: Sequence[RolloutTree], node_ids: Sequence[np.ndarray]) -> np.ndarray:
        """``node_ids[i]`` of ``trees[i]`` (non-leaf prefixes): the success rate of ``samples`` continuations from
        each, on a copy of the tree; one array over all trees, in order."""
        k = self.samples
        work = [
            (t.detached(), np.asarray(ids, dtype=np.int64)) for t, ids in zip(trees, node_ids) if len(ids)
        ]
        if not work:
            return np.zeros(0)
        sizes = [len(c.nodes) for c, _ in work]
        with self._apart(k * sum(len(ids) for _, ids in work)):
            copies = [c for c, _ in work]
            self.backend.expand(copies, [Expansion(ids, np.full(len(ids), k), 0) for _, ids in work])
        out = []
        for (copy, ids), size in zip(work, sizes):
            rewards = copy.path_rewards()
            wins: dict[int, float] = {}
            for node in copy.nodes[size:]:
                if node.parent is not None and node.parent < size:  # the first turn of a continuation
                    wins[node.parent] = wins.get(node.parent, 0.0) + rewards.get(node.path_id, 0.0)
            out += [self._rate(wins.get(int(i), 0.0), k) for i in ids]
        return np.array(out)

    def _rate(self, successes: float, k: int) -> float:
        return (successes + self.prior) / (k + 2 * self.prior)  # k >= 1

    @contextmanager
    def _apart(self, rollouts: int) -> Iterator[None]:
        """Run the body's ``rollouts`` rollouts under the Monte-Carlo seed and into their own ledger, counted in
        ``mc/``."""
        b = self.backend
        seed, ledger = b.seed, b.ledger if isinstance(b, _Counting) else None
        own = BudgetLedger()
        b.seed = salted(seed, SALT)
        if ledger is not None:
            assert isinstance(b, _Counting)
            b.ledger = own
        t0 = time.perf_counter()
        try:
            yield
        finally:
            b.seed = seed
            if ledger is not None:
                assert isinstance(b, _Counting)
                b.ledger = ledger
            self._seconds += time.perf_counter() - t0
            self._mc.add_engine(own)
            self._rollouts += rollouts

    def take_metrics(self) -> dict[str, float]:
        """The ``mc/`` metrics of the Monte-Carlo work since the last call (a step's: its Stage 1 and Stage 2)."""
        mc, seconds, rollouts = self._mc, self._seconds, self._rollouts
        self._mc, self._seconds, self._rollouts = BudgetLedger(), 0.0, 0
        return {
            M.MC_ROLLOUTS: float(rollouts),
            M.MC_GENERATED_TOKENS: float(mc.generated_tokens),
            M.MC_LLM_CALLS: float(mc.llm_calls),
            M.MC_TOOL_CALLS: float(mc.tool_calls),
            M.MC_SECONDS: seconds,
        }

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        return self.inner.fit(trees)

    def state_dict(self) -> dict[str, object]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.inner.load_state_dict(state)


def with_monte_carlo(allocator: Allocator, predictor: Predictor, backend: SeededBackend) -> Predictor:
    """The step's scorer: ``predictor``, or for a Monte-Carlo allocator (trace_mc) a ``MonteCarloScorer`` over
    ``backend`` standing in for it."""
    if not allocator.monte_carlo:
        return predictor
    return MonteCarloScorer(predictor, backend, allocator.cfg.mc_samples, allocator.cfg.mc_prior)


def mc_metrics(scorer: object) -> dict[str, float]:
    """The ``mc/`` metrics of a step scored by a ``MonteCarloScorer`` (none for any other scorer)."""
    return scorer.take_metrics() if isinstance(scorer, MonteCarloScorer) else {}
