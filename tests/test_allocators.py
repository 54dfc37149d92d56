import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from tracerl.algos.allocators import ALLOCATORS, PrefixCandidates, StepPlan, TreePOAllocator, build_allocator
from tracerl.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.engine.mc_scorer import with_monte_carlo
from tracerl.engine.step import run_step
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.predictors import build_predictor
from tracerl.types import Anchor

ALL = [
    "grpo",
    "pcl",
    "knapsack",
    "treepo",
    "trace",
    "trace_debiased",
    "trace_root_only",
    "trace_prefix_only",
    "oracle_trace",
    "dapo",
    "trace_plus",
    "trace_mc",
]
BUDGET = BudgetConfig()  # L = 288, M = 96, N = 2, G = 8, B = 144


def run_steps(
    name: str,
    steps: int = 4,
    seed: int = 0,
    sim: SimulatorConfig | None = None,
    budget: BudgetConfig = BUDGET,
):
    alloc = build_allocator(AllocatorConfig(name=name))
    env = Simulator(sim or SimulatorConfig(num_prompts=512), seed=seed)
    pred = build_predictor(PredictorConfig(name="tabular", warmup_steps=1), seed=seed, name=alloc.predictor)
    pred = with_monte_carlo(alloc, pred, env)  # trace_mc: scored by extra simulator rollouts
    rng = np.random.default_rng(seed)
    outs = []
    for _ in range(steps):
        out = run_step(env.sample_pool(budget.num_candidates), alloc, pred, env, budget, rng)
        pred.fit(out.sampled_trees)
        env.advance()
        outs.append(out)
    return outs


def test_registry_lists_every_allocator() -> None:
    assert ALLOCATORS.names() == sorted(ALL)
    with pytest.raises(KeyError, match="unknown allocator 'nope'; known: dapo, grpo"):
        build_allocator(AllocatorConfig(name="nope"))


def test_the_step_carries_out_the_plan_an_allocator_makes() -> None:
    """No allocator flag is read: an allocator that plans two generation batches (3 prompts x 2 bare rollouts each,
    in its own order) and 1 continuation per bare rollout gets exactly that."""

    class TwoBatches(TreePOAllocator):
        def plan_step(
            self,
            v: np.ndarray | None,
            anchors: Sequence[Anchor],
            budget: BudgetConfig,
            rng: np.random.Generator,
        ) -> StepPlan:
            counts = np.zeros(len(anchors), np.int64)
            counts[:6] = 2
            return StepPlan(counts, [np.array([4, 0, 2]), np.array([1, 5, 3])], continuations=1)

    env = Simulator(SimulatorConfig(num_prompts=64), seed=0)
    pred = build_predictor(PredictorConfig(name="tabular"), seed=0)
    pool = env.sample_pool(10)
    out = run_step(pool, TwoBatches(AllocatorConfig()), pred, env, BUDGET, np.random.default_rng(0))
    assert [t.prompt for t in out.trees] == [pool[i] for i in (4, 0, 2, 1, 5, 3)]
    assert out.root_counts.tolist() == [2] * 6 + [0] * 4
    assert [e.leaves for e in out.expansions] == [2] * 6  # m N = 2 x 1 continuations (or extra bare) each
    assert out.ledger.leaves == sum(t.num_leaves for t in out.trees) == 6 * (2 + 2)


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("dapo", "trace_plus")])  # trace_plus: tokens
def test_equal_leaves_every_step(name: str) -> None:
    for out in run_steps(name):
        assert out.ledger.leaves == BUDGET.leaves == 288
        assert sum(t.num_leaves for t in out.trees) == 288
        if name in ("grpo", "pcl"):
            assert len(out.trees) == 36 and all(t.num_bare == 8 for t in out.trees)
        elif name == "knapsack":  # flat, counts 0 or 2..16 per prompt
            assert out.ledger.bare_rollouts == 288 and out.ledger.continuations == out.ledger.extra_bare == 0
            assert all(2 <= t.num_bare <= 16 and t.num_leaves == t.num_bare for t in out.trees)
        else:
            assert out.ledger.bare_rollouts - out.ledger.extra_bare == 96
            # each prompt's local budget m N is spent inside its own tree
            for tree, m in zip(out.trees, out.root_counts[out.root_counts > 0]):
                assert tree.num_leaves == m * (1 + BUDGET.continuations)


def test_active_roots_respect_bounds_after_warm_up() -> None:
    for out in run_steps("trace", steps=5)[1:]:
        c = out.root_counts
        assert c.sum() == 96 and ((c == 0) | ((c >= 2) & (c <= 16))).all()


def test_dapo_reports_its_extra_spend() -> None:
    for out in run_steps("dapo"):
        assert out.ledger.sampled_leaves >= out.ledger.leaves
        assert all(t.is_mixed() for t in out.trees)
        assert len(out.trees) <= BUDGET.num_groups
        assert out.ledger.sampled_leaves == 8 * len(out.sampled_trees)
    assert any(out.ledger.sampled_leaves > 288 for out in run_steps("dapo"))


def test_unspendable_local_budget_becomes_extra_bare_rollouts() -> None:
    single_turn = SimulatorConfig(num_prompts=512, min_turns=1, max_turns=1)  # no prefix to continue from
    for out in run_steps("trace", sim=single_turn):
        assert out.ledger.continuations == 0
        assert out.ledger.extra_bare == 192
        assert out.ledger.leaves == 288


def test_k_max_caps_continuations_and_the_rest_goes_bare() -> None:
    alloc = build_allocator(AllocatorConfig(name="trace", k_max=1))
    cands = [PrefixCandidates(np.array([1, 2]), np.array([0.0, 1.0]), np.array([0.5, 0.5]), local_budget=6)]
    (ex,) = alloc.prefixes(cands, np.random.default_rng(0))
    assert ex.counts.tolist() == [1, 1] and ex.extra_bare == 4 and ex.leaves == 6


def test_cold_start_is_uniform() -> None:
    alloc = build_allocator(AllocatorConfig(name="trace", root_group_size=4))
    counts = alloc.roots(None, 144, BUDGET, np.random.default_rng(0))
    assert sorted(set(counts.tolist())) == [0, 4] and counts.sum() == 96


def test_pcl_picks_prompts_closest_to_half() -> None:
    v = np.linspace(0, 1, 144)
    counts = build_allocator(AllocatorConfig(name="pcl")).roots(v, 144, BUDGET, np.random.default_rng(0))
    chosen = np.flatnonzero(counts)
    assert len(chosen) == 36 and (counts[chosen] == 8).all()
    assert np.abs(v[chosen] - 0.5).max() < np.abs(v[counts == 0] - 0.5).min()


def test_same_seed_same_trees() -> None:
    def shape(outs):
        return [[(n.parent, n.depth, n.reward, n.true_value) for t in o.trees for n in t.nodes] for o in outs]

    assert shape(run_steps("trace", seed=3)) == shape(run_steps("trace", seed=3))
    assert shape(run_steps("trace", seed=3)) != shape(run_steps("trace", seed=4))


def test_user_allocator_by_import_path() -> None:
    alloc = build_allocator(AllocatorConfig(name="tracerl.algos.allocators:TreePOAllocator"))
    assert alloc.name == "treepo"


def test_budget_shapes() -> None:
    b = dataclasses.replace(BUDGET, num_leaves=None, num_roots=64)
    assert (b.leaves, b.roots, b.num_groups, b.num_candidates) == (192, 64, 24, 96)
    out = run_steps("trace", steps=2, budget=b)[-1]
    assert out.ledger.leaves == 192
