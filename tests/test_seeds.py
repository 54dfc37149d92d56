"""Seed keys and path addresses (tracerl.engine.seeds), and the simulator drawing each episode from its key."""

import numpy as np
import pytest

from tracerl.algos.allocators import Expansion
from tracerl.engine.seeds import SeedKey, address, continuations_at, path_identity, uniforms
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status


def test_seed_key_is_a_stable_hash_of_every_field() -> None:
    key = SeedKey(0, 3, "math-17", (2, 0, 1), 4)
    assert key.value() == 6658178977844693549  # the same in every process and run (no salted hash())
    others = [
        SeedKey(1, 3, "math-17", (2, 0, 1), 4),
        SeedKey(0, 4, "math-17", (2, 0, 1), 4),
        SeedKey(0, None, "math-17", (2, 0, 1), 4),
        SeedKey(0, 3, "math-18", (2, 0, 1), 4),
        SeedKey(0, 3, "math-17", (2, 1), 4),
        SeedKey(0, 3, "math-17", (2, 0, 1), 5),
    ]
    values = {k.value() for k in others} | {key.value()}
    assert len(values) == 7 and all(0 <= v < 2**63 for v in values)
    assert SeedKey(0, 0, "p", (1,), 1).value() != SeedKey(0, None, "p", (1,), 1).value()  # eval vs step 0


def _tree() -> RolloutTree:
    """Two bare paths of 3 turns; two continuations from path 0's turn 1, one more from path 1's turn 2."""
    t = RolloutTree(Prompt("p"))
    for _ in range(2):
        pid, parent = t.new_path(True), 0
        for d in range(3):
            parent = t.add_node(parent, pid, status=Status.ANSWERED if d == 2 else Status.TURN).node_id
    # path 0 is nodes 1, 2, 3; path 1 is nodes 4, 5, 6
    for start in (1, 1, 5):
        pid = t.new_path(False)
        t.add_node(start, pid, status=Status.ANSWERED)
    return t


def test_addresses_follow_the_structure() -> None:
    t = _tree()
    assert address(t, 0) == ()
    assert [address(t, n) for n in (1, 2, 3)] == [(0,), (0, 0), (0, 0, 0)]
    assert [address(t, n) for n in (4, 5, 6)] == [(1,), (1, 0), (1, 0, 0)]
    assert [address(t, n) for n in (7, 8, 9)] == [(0, 1), (0, 2), (1, 0, 1)]
    assert continuations_at(t, 1) == 2 and continuations_at(t, 5) == 1 and continuations_at(t, 0) == 0
    assert path_identity(t, 1, 3) == (0, 3) and path_identity(t, 0, 2) == (2,)
    assert len({address(t, n) for n in range(len(t.nodes))}) == len(t.nodes)


def test_uniforms_per_row_depend_on_that_row_alone() -> None:
    values = np.array([SeedKey(0, 0, f"p{i}", (0,), 1).value() for i in range(2000)], dtype=np.uint64)
    u = uniforms(values, 5)
    assert u.shape == (2000, 5) and ((u >= 0) & (u < 1)).all()
    assert np.array_equal(uniforms(values[7:8], 5)[0], u[7])
    assert u.mean() == pytest.approx(0.5, abs=0.01) and abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.05


def _shape(tree: RolloutTree) -> list[tuple[object, ...]]:
    return [(address(tree, n.node_id), n.status, n.reward, n.true_value) for n in tree.nodes[1:]]


def test_simulator_episodes_do_not_depend_on_their_company_or_phase() -> None:
    cfg = SimulatorConfig(num_prompts=32)
    a, b = Simulator(cfg, seed=5), Simulator(cfg, seed=5)
    pool = a.sample_pool(4)
    assert [p.prompt_id for p in b.sample_pool(4)] == [p.prompt_id for p in pool]
    together = a.rollout(pool, [3, 2, 4, 1])
    alone = b.rollout(pool[2:3], [4])[0]
    assert _shape(alone) == _shape(together[2])  # other prompts in the call change nothing
    # A bare rollout added in the expansion phase is the one a larger first phase would have drawn.
    c = Simulator(cfg, seed=5)
    c.sample_pool(4)
    (more,) = c.rollout(pool[2:3], [5])
    prefix = alone.bare_prefixes()[0]
    b.expand([alone], [Expansion(np.array([prefix]), np.array([2]), extra_bare=1)])
    bare_shape = [s for s in _shape(alone) if s[0][0] == 4]
    assert bare_shape == [s for s in _shape(more) if s[0][0] == 4]
    assert continuations_at(alone, prefix) == 2
    assert _shape(Simulator(cfg, seed=6).rollout(pool[2:3], [4])[0]) != _shape(b.rollout(pool[2:3], [4])[0])
