import numpy as np
import pytest

from tracerl.algos.allocators import build_allocator
from tracerl.algos.trace_plus import TracePlusAllocator
from tracerl.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.engine.allocation import build_allocation
from tracerl.engine.step import run_step
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.types import Anchor


def test_trace_plus_spends_within_its_token_shares_on_the_simulator() -> None:
    budget = BudgetConfig()  # L = 288, M = 96, N = 2
    env = Simulator(SimulatorConfig(num_prompts=512), seed=0)
    alloc, pred = build_allocation(
        AllocatorConfig(name="trace_plus"), PredictorConfig(name="tabular", warmup_steps=1), 0, env
    )
    assert isinstance(alloc, TracePlusAllocator) and alloc.targets == "debiased"
    assert pred.cfg.targets == "debiased"  # the allocator's forced targets
    rng = np.random.default_rng(0)
    for step in range(4):
        pool = env.sample_pool(budget.num_candidates)
        root_cost = alloc.price([Anchor(p) for p in pool])
        assert (root_cost is None) == (step == 0)  # the length predictor is ready after one step's targets
        out = run_step(pool, alloc, pred, env, budget, rng)
        if step == 0:  # trace's allocation: equal leaves
            assert out.ledger.leaves == budget.leaves
        else:  # warm: the token knapsacks decide
            assert root_cost is not None
            active = np.flatnonzero(out.root_counts)
            m, c = out.root_counts[active], root_cost[active]
            t = budget.leaves * float(root_cost.mean())
            assert float(m @ c) * (1 + budget.continuations) <= t
            assert m.min() >= 2 and m.max() <= 16
            for tree, exp, mi, ci in zip(out.trees, out.expansions, m, c):
                prefix_cost = alloc.price([tree.anchor(int(i)) for i in exp.node_ids])
                assert prefix_cost is not None
                assert float(exp.counts @ prefix_cost) <= mi * ci * budget.continuations + 1e-6
                assert exp.extra_bare == 0
        pred.fit(out.sampled_trees)
        fit = alloc.observe(out.sampled_trees)
        assert fit["length_examples"] > 0
        env.advance()
    # The simulator's turns have no tokens, so a turn costs one: a continuation from a deeper prefix costs less.
    tree = max(out.trees, key=lambda t: max(n.depth for n in t.nodes))
    deep = max(tree.nodes[1:], key=lambda n: (not n.is_leaf, n.depth))
    costs = alloc.price([tree.anchor(0), tree.anchor(deep.node_id)])
    assert costs is not None and costs[0] > costs[1]
    # Checkpoints: a fresh trace_plus restored from the state prices the same.
    fresh, _ = build_allocation(AllocatorConfig(name="trace_plus"), PredictorConfig(name="tabular"), 0, env)
    fresh.load_state_dict(alloc.state_dict())
    again = fresh.price([tree.anchor(0), tree.anchor(deep.node_id)])
    assert again is not None and again.tolist() == costs.tolist()
    assert build_allocator(AllocatorConfig(name="trace")).state_dict() == {}


def test_trace_plus_without_a_length_predictor_says_how_to_attach_one() -> None:
    alloc = build_allocator(AllocatorConfig(name="trace_plus"))
    with pytest.raises(ValueError, match="build_allocation"):
        alloc.price([])
