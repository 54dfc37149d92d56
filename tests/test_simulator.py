import numpy as np
import pytest

from envs import ENVS
from envs.simulator import Simulator, SimulatorConfig, calibrate
from tracerl.algos.allocators import Expansion
from tracerl.config_loader import compose, conf_dir
from tracerl.experiment_config import BenchAllocationConfig


def shipped() -> SimulatorConfig:
    return compose(BenchAllocationConfig, conf_dir() / "bench/allocation.yaml").env.simulator


def test_shipped_calibration_meets_the_informativeness_and_difficulty_bounds() -> None:
    c = calibrate(shipped(), seed=0, samples=100_000)
    assert c["prompt_r2"] <= 0.5 and c["prefix_r2"] <= 0.5  # features explain at most half the variance
    assert c["prompt_r2"] >= 0.3 and c["prefix_r2"] >= 0.3  # ... but are not useless either
    assert 0.20 <= c["grpo_effective_ratio"] <= 0.35  # the paper saw 26.8 %


def test_value_is_a_martingale() -> None:
    sim = Simulator(SimulatorConfig(num_prompts=8), seed=0)
    v0 = np.full(40_000, 0.3)
    length, path, reward = sim._episodes(v0, np.zeros(len(v0), dtype=np.int64))
    for t in range(1, 6):
        alive = length >= t
        assert path[alive, t].mean() == pytest.approx(0.3, abs=0.01)
    assert reward.mean() == pytest.approx(0.3, abs=0.01)
    assert ((path[~np.isnan(path)] >= 0) & (path[~np.isnan(path)] <= 1)).all()


def test_continuations_start_from_the_stored_prefix() -> None:
    sim = Simulator(SimulatorConfig(num_prompts=64), seed=1)
    (tree,) = sim.rollout(sim.sample_pool(1), [2])
    prefix = tree.bare_prefixes()[0]
    before = len(tree.nodes)
    sim.expand([tree], [Expansion(np.array([prefix]), np.array([3]), extra_bare=1)])
    assert tree.num_paths == 6 and tree.num_bare == 3
    new_children = [c for c in tree.nodes[prefix].children if c >= before]
    assert len(new_children) == 3
    assert all(tree.nodes[c].depth == tree.nodes[prefix].depth + 1 for c in new_children)


def test_pools_and_drift_depend_on_the_seed_only() -> None:
    a, b = Simulator(SimulatorConfig(), seed=5), Simulator(SimulatorConfig(), seed=5)
    assert [p.prompt_id for p in a.sample_pool(10)] == [p.prompt_id for p in b.sample_pool(10)]
    a.rollout(a.sample_pool(3), [4, 4, 4])  # rollouts use their own stream: drift is unaffected
    a.advance(), b.advance()
    np.testing.assert_array_equal(a.success_probability(), b.success_probability())
    assert np.abs(a.drift - Simulator(SimulatorConfig(), seed=5).drift).max() > 0  # it does move


def test_registered() -> None:
    assert ENVS.get("simulator") is Simulator
