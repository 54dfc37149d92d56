"""trace_mc's Monte-Carlo scorer (tracerl/engine/mc_scorer.py): its estimates approach the true success probabilities,
its rollouts leave the training trees and the step's ledger alone, sample apart from the training rollouts, and on a
small case with exact probabilities trace_mc allocates as trace given the truth (both stages brute-force optimal)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest

from tracerl import metrics as M
from tracerl.algos.allocators import Expansion, build_allocator
from tracerl.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.engine import mc_scorer
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.mc_scorer import SALT, MonteCarloScorer, with_monte_carlo
from tracerl.engine.seeds import continuations_at, salted
from tracerl.engine.step import StepOutcome, run_step
from tracerl.engine.stepper import Stepper
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.predictors import build_predictor
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt, Status

BUDGET = BudgetConfig(num_leaves=48, pool_factor=2)  # M = 16 bare rollouts, N = 2, 12 candidates


class FakeCountingSim:
    """A fake counting backend: the simulator's seed-keyed trees, a ledger counting 10 tokens per rollout, and a
    record of every tree it rolled out."""

    def __init__(self, seed: int, num_prompts: int = 64) -> None:
        self.sim = Simulator(SimulatorConfig(num_prompts=num_prompts), seed=seed)
        self.ledger = BudgetLedger()
        self.rolled: list[RolloutTree] = []

    @property
    def seed(self) -> int:
        return self.sim.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.sim.seed = value

    def begin_step(self, step: int) -> None:
        self.sim.step, self.ledger = step, BudgetLedger()

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        self.ledger.generated_tokens += 10 * sum(counts)
        trees = self.sim.rollout(prompts, counts)
        self.rolled += trees
        return trees

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        self.ledger.generated_tokens += 10 * sum(e.leaves for e in expansions)
        self.sim.expand(trees, expansions)


def _scorer(backend: object, samples: int, prior: float = 1.0) -> MonteCarloScorer:
    inner = build_predictor(PredictorConfig(name="tabular", warmup_steps=1))
    return MonteCarloScorer(inner, backend, samples, prior)


def _bound(v: np.ndarray, k: int) -> np.ndarray:
    """5 binomial standard deviations plus the prior's pull: a miss has probability < 1e-6 per estimate."""
    return 5 * np.sqrt(v * (1 - v) / k) + 2.0 / k


def test_large_k_estimates_approach_the_true_success_probabilities() -> None:
    backend = FakeCountingSim(seed=4)
    prompts = [backend.sim.prompt(i) for i in range(40)]
    prompts = [p for p in prompts if 0.05 < (p.true_value or 0) < 0.95][:4]
    assert len(prompts) >= 3
    k = 800
    mc = _scorer(backend, k)
    v = np.array([p.true_value for p in prompts])
    got = mc.score([Anchor(p) for p in prompts])
    assert np.all(np.abs(got - v) <= _bound(v, k))
    trees = backend.sim.rollout(prompts, [1] * len(prompts))
    ids = [np.array(t.bare_prefixes()) for t in trees]
    got = mc.score_prefixes(trees, ids)
    truth = np.array([t.nodes[int(i)].true_value for t, n in zip(trees, ids) for i in n])
    assert len(got) == len(truth) >= 4
    assert np.all(np.abs(got - truth) <= _bound(truth, k))


def _shape(trees: Sequence[RolloutTree]) -> list[tuple[str, int, int, list[list[int]], list[float]]]:
    return [
        (
            t.prompt.prompt_id,
            t.num_paths,
            t.num_bare,
            [list(n.children) for n in t.nodes],
            list(t.path_rewards()),
        )
        for t in trees
    ]


def test_monte_carlo_rollouts_change_no_training_tree() -> None:
    backend = FakeCountingSim(seed=1)
    prompts = [backend.sim.prompt(i) for i in range(5)]
    trees = backend.sim.rollout(prompts, [3] * 5)
    before = _shape(trees)
    scores = _scorer(backend, 4).score_prefixes(trees, [np.array(t.bare_prefixes()) for t in trees])
    assert len(scores) == sum(len(t.bare_prefixes()) for t in trees)
    assert _shape(trees) == before


class Replay:
    """A fake scorer replaying another step's scores in the order the step asks for them."""

    def __init__(self, out: StepOutcome) -> None:
        self.roots, self.prefixes = out.root_scores, np.array([p for _, _, p in out.prefix_scores])
        self.calls = 0

    @property
    def ready(self) -> bool:
        return True

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        self.calls += 1
        return self.roots if self.calls == 1 else self.prefixes


def _step(replay: StepOutcome | None = None) -> tuple[StepOutcome, object]:
    """One trace_mc step (K = 6) on the fake; with ``replay``, the same step scored by replaying its scores."""
    seed = 2
    backend = FakeCountingSim(seed)
    prompts = [backend.sim.prompt(i) for i in range(64)]
    alloc = build_allocator(AllocatorConfig(name="trace_mc", mc_samples=6))
    inner = build_predictor(PredictorConfig(name="tabular", warmup_steps=1))
    scorer = with_monte_carlo(alloc, inner, backend) if replay is None else Replay(replay)
    out = Stepper(prompts, alloc, scorer, backend, np.random.default_rng(seed)).run(0, BUDGET)
    return out, scorer


def test_the_step_counts_no_monte_carlo_work() -> None:
    """trace_mc's step equals a step that gets the same scores for free: same trees, same ledger; the extra rollouts
    are counted in mc/ alone."""
    out, scorer = _step()
    assert isinstance(scorer, MonteCarloScorer)
    mc = mc_scorer.mc_metrics(scorer)
    free, replay = _step(out)
    assert mc_scorer.mc_metrics(replay) == {}
    assert _shape(out.trees) == _shape(free.trees) and len(out.trees) > 0
    assert sum(t.num_paths - t.num_bare for t in out.trees) > 0  # Stage 2 ran
    counts = [{k: v for k, v in o.ledger.as_metrics().items() if k.startswith(M.BUDGET)} for o in (out, free)]
    assert counts[0] == counts[1]
    assert out.ledger.leaves == BUDGET.leaves
    assert out.ledger.generated_tokens == 10 * BUDGET.leaves  # the fake's 10 tokens per training rollout
    assert mc[M.MC_ROLLOUTS] == 6 * (BUDGET.num_candidates + len(out.prefix_scores))
    assert mc[M.MC_GENERATED_TOKENS] == 10 * mc[M.MC_ROLLOUTS] and mc[M.MC_SECONDS] > 0
    assert mc_scorer.mc_metrics(scorer)[M.MC_ROLLOUTS] == 0  # taken once


def test_the_mc_ledger_gets_the_backends_counts() -> None:
    backend = FakeCountingSim(seed=0)
    mc = _scorer(backend, 3)
    training = backend.ledger
    mc.score([Anchor(backend.sim.prompt(i)) for i in range(4)])
    assert backend.ledger is training and training.generated_tokens == 0
    got = mc.take_metrics()
    assert got[M.MC_ROLLOUTS] == 12 and got[M.MC_GENERATED_TOKENS] == 120


def _episodes(trees: Sequence[RolloutTree]) -> list[tuple[float | None, ...]]:
    return [tuple(n.true_value for n in t.nodes[1:]) for t in trees]


def test_monte_carlo_samples_are_not_the_training_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator keys every episode by (seed, step, prompt, path): MC rollouts are keyed under a salted seed, so
    they differ from the training rollouts of the same prompts at the same step; with the run's own seed they would
    replay them (the estimate would be the outcome it predicts)."""
    assert (
        salted(0, SALT) != 0 and salted(0, SALT) != salted(1, SALT) and salted(0, SALT) != salted(0, "other")
    )
    for replay in (False, True):
        if replay:
            monkeypatch.setattr(mc_scorer, "salted", lambda seed, salt: seed)
        backend = FakeCountingSim(seed=3)
        prompts = [backend.sim.prompt(i) for i in range(6)]
        mc_scores = _scorer(backend, 4, prior=0.0).score([Anchor(p) for p in prompts])
        mc_trees = list(backend.rolled)
        train = backend.rollout(prompts, [4] * 6)
        assert backend.seed == 3  # restored
        same = [a == b for a, b in zip(_episodes(mc_trees), _episodes(train))]
        rates = np.array([sum(t.path_rewards().values()) / 4 for t in train])
        if replay:
            assert all(same) and np.array_equal(mc_scores, rates)
        else:
            assert not any(same)
    # and continuations: MC continuations from a prefix are not the training continuations from it
    backend = FakeCountingSim(seed=3)
    tree = backend.sim.rollout([backend.sim.prompt(0)], [1])[0]
    node = tree.bare_prefixes()[0]
    ref = tree.detached()
    backend.expand([ref], [Expansion(np.array([node]), np.array([3]), 0)])
    mc = _scorer(backend, 3)
    mc.score_prefixes([tree], [np.array([node])])
    assert continuations_at(tree, node) == 0
    backend.expand([tree], [Expansion(np.array([node]), np.array([3]), 0)])
    assert _episodes([tree]) == _episodes([ref])  # training continuations are the seed's, MC or not


# -- a small brute-force case with exact probabilities -------------------------------------------------------------
K = 12
TURNS = 3


def _numer(i: int, j: int, t: int) -> int:
    """K V of the node at depth t of bare rollout j of prompt i, in 1..K - 1."""
    return (7 * i + 5 * j + 3 * t) % (K - 1) + 1


class FakeExact:
    """A fake backend whose success probabilities are exact multiples of 1/K: the j-th rollout started at a node of
    value V = c / K (a prompt's value, or a prefix node's) succeeds iff j mod K < c; episodes have TURNS turns. K
    rollouts from an anchor then succeed exactly c times, whatever the seed."""

    def __init__(self) -> None:
        self.seed = 0
        self.ledger = BudgetLedger()

    def _grow(self, tree: RolloutTree, start: int, index: int, bare: bool) -> None:
        i = int(tree.prompt.prompt_id.split("-")[1])
        c = round(K * (tree.nodes[start].true_value if start else tree.prompt.true_value or 0))
        pid, parent = tree.new_path(bare), start
        for t in range(tree.nodes[start].depth + 1, TURNS + 1):
            last = t == TURNS
            node = tree.add_node(
                parent,
                pid,
                status=Status.ANSWERED if last else Status.TURN,
                reward=float(index % K < c) if last else None,
                true_value=_numer(i, pid, t) / K if bare else c / K,
            )
            parent = node.node_id

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        trees = [RolloutTree(p) for p in prompts]
        for t, m in zip(trees, counts):
            for j in range(int(m)):
                self._grow(t, 0, j, True)
        return trees

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        for t, ex in zip(trees, expansions):
            assert ex.extra_bare == 0
            for n, k in zip(ex.node_ids, ex.counts):
                for _ in range(int(k)):
                    self._grow(t, int(n), continuations_at(t, int(n)), False)


def _v_root(v: float, m: int) -> float:
    return 0.0 if m == 0 else 1 - v**m - (1 - v) ** m


def test_small_case_trace_mc_allocates_as_trace_given_the_truth() -> None:
    budget = BudgetConfig(num_leaves=24, continuations=2, group_size=4, pool_factor=1)  # M = 8, 6 candidates
    values = [1, 3, 6, 8, 11, 5]
    prompts = [Prompt(f"p-{i}", true_value=c / K) for i, c in enumerate(values)]
    cfg = AllocatorConfig(name="trace_mc", mc_samples=K, mc_prior=0.0, m_max=3)
    mc_alloc = build_allocator(cfg)
    oracle_alloc = build_allocator(AllocatorConfig(name="trace", m_max=3))
    oracle = build_predictor(PredictorConfig(name="oracle", warmup_steps=0))
    backend = FakeExact()
    mc = with_monte_carlo(mc_alloc, build_predictor(PredictorConfig(name="tabular")), backend)
    got = run_step(prompts, mc_alloc, mc, backend, budget, np.random.default_rng(5))
    want = run_step(prompts, oracle_alloc, oracle, FakeExact(), budget, np.random.default_rng(5))
    assert np.array_equal(got.root_scores, [c / K for c in values])
    assert np.array_equal(got.root_counts, want.root_counts)
    assert [p for *_, p in got.prefix_scores] == [p for *_, p in want.prefix_scores]
    assert all(
        np.array_equal(a.node_ids, b.node_ids) and np.array_equal(a.counts, b.counts)
        for a, b in zip(got.expansions, want.expansions)
    )
    assert _shape(got.trees) == _shape(want.trees)
    # Stage 1 is optimal over every count vector (0 or 2..3 each, M in all) ...
    v = np.array(values) / K
    gain = sum(_v_root(x, int(m)) for x, m in zip(v, got.root_counts))
    best = max(
        sum(_v_root(x, m) for x, m in zip(v, ms))
        for ms in itertools.product([0, 2, 3], repeat=len(v))
        if sum(ms) == budget.roots
    )
    assert gain == pytest.approx(best, abs=1e-12)
    # ... and so is every tree's Stage 2 (m N continuations over its bare prefixes)
    for cand, ex in zip(got.stage2_inputs, got.expansions):
        q = cand.rewards * cand.scores + (1 - cand.rewards) * (1 - cand.scores)
        value = float(np.sum(1 - q**ex.counts))
        best = max(
            float(np.sum(1 - q ** np.bincount(pick, minlength=len(q))))
            for pick in itertools.combinations_with_replacement(range(len(q)), cand.local_budget)
        )
        assert value == pytest.approx(best, abs=1e-12)
    assert len(got.expansions) >= 2


def test_trace_mc_is_registered_and_checked() -> None:
    alloc = build_allocator(AllocatorConfig(name="trace_mc"))
    assert alloc.monte_carlo and not build_allocator(AllocatorConfig(name="trace")).monte_carlo
    inner = build_predictor(PredictorConfig(name="tabular"))
    assert with_monte_carlo(build_allocator(AllocatorConfig(name="trace")), inner, FakeExact()) is inner
    with pytest.raises(ValueError, match="allocator.mc_samples must be >= 1"):
        AllocatorConfig(name="trace_mc", mc_samples=0)
