import numpy as np
import pytest

from tests.conftest import chain
from tracerl.algos.advantages import ADVANTAGES
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status


def adv(name: str, tree: RolloutTree, **kw: object) -> dict[int, list[float]]:
    out = ADVANTAGES.get(name)(tree, **kw)
    return {leaf: list(a) for leaf, a in zip(out.leaf_ids, out.per_turn)}


def flat(a: dict[int, list[float]]) -> list[float]:
    return [x for k in sorted(a) for x in a[k]]


def test_grpo_golden(small_tree: RolloutTree) -> None:
    a = adv("grpo", small_tree)
    assert sorted(a) == [2, 4, 5, 6]
    assert flat(a) == pytest.approx([-0.75, -0.75, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25])
    std = np.std([0, 1, 1, 1])
    assert adv("grpo", small_tree, normalize_std=True)[2][0] == pytest.approx(-0.75 / std, rel=1e-5)


def test_tree_subgroup_golden(small_tree: RolloutTree) -> None:
    # Leaf 2: mean(0 - 3/4, 0 - 2/3); leaf 4: its depth-1 group has one leaf, so only d=0 counts;
    # leaves 5, 6: mean(1 - 3/4, 1 - 2/3).
    a = adv("tree_subgroup", small_tree)
    assert a[2] == pytest.approx([-(0.75 + 2 / 3) / 2] * 2)
    assert a[4] == pytest.approx([0.25, 0.25])
    assert a[5] == pytest.approx([(0.25 + 1 / 3) / 2] * 2) and a[6] == a[5]


def test_node_mc_golden(small_tree: RolloutTree) -> None:
    # V^ = [3/4, 2/3, 0, 1, 1, 1, 1]; A_t = V^(n_t) - V^(n_{t-1}).
    a = adv("node_mc", small_tree)
    assert a[2] == pytest.approx([2 / 3 - 0.75, -2 / 3])
    assert a[4] == pytest.approx([0.25, 0.0])
    assert a[5] == pytest.approx([2 / 3 - 0.75, 1 / 3])


def test_tree_grpo_golden(small_tree: RolloutTree) -> None:
    z = (np.array([0, 1, 1, 1]) - 0.75) / np.std([0, 1, 1, 1])
    sub = np.std([0, 1, 1])
    a = adv("tree_grpo", small_tree)
    assert a[2][0] == pytest.approx(z[0] + (0 - 2 / 3) / sub, rel=1e-5)
    assert a[4][0] == pytest.approx(z[1], rel=1e-5)  # no sibling subgroup of 2+ below the root
    assert a[5][0] == pytest.approx(z[2] + (1 - 2 / 3) / sub, rel=1e-5)


def test_uneven_groups_and_variable_depth() -> None:
    #   root ── a ── b ── c (r=1, depth 3)
    #       │    └── e (r=0, continuation from a)
    #       └── d (r=0, depth 1)
    tree = RolloutTree(Prompt("u"))
    (c,) = chain(tree, 0, [(1.0, 3)])
    (d,) = chain(tree, 0, [(0.0, 1)])
    (e,) = chain(tree, 1, [(0.0, 1)], bare=False)
    a = adv("tree_subgroup", tree)
    assert a[c] == pytest.approx([((1 - 1 / 3) + (1 - 0.5)) / 2] * 3)
    assert a[d] == pytest.approx([-1 / 3])
    assert a[e] == pytest.approx([((0 - 1 / 3) + (0 - 0.5)) / 2] * 2)


@pytest.mark.parametrize("turns", [1, 3])
def test_tree_without_branching_equals_mean_centred_grpo(turns: int) -> None:
    tree = RolloutTree(Prompt("flat"))
    chain(tree, 0, [(r, turns) for r in [1.0, 0.0, 0.0, 1.0, 1.0]])
    assert flat(adv("tree_subgroup", tree)) == pytest.approx(flat(adv("grpo", tree)))
    assert flat(adv("tree_grpo", tree)) == pytest.approx(
        flat(adv("grpo", tree, normalize_std=True)), rel=1e-5
    )


def test_grpo_group_advantages_sum_to_zero() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        tree = RolloutTree(Prompt("s"))
        chain(
            tree,
            0,
            [(float(rng.integers(0, 2)), int(rng.integers(1, 4))) for _ in range(int(rng.integers(2, 9)))],
        )
        total = sum(v[0] for v in adv("grpo", tree).values())
        assert total == pytest.approx(0.0, abs=1e-9)


def test_user_estimator_by_import_path() -> None:
    fn = ADVANTAGES.get("tracerl.algos.advantages:grpo_advantages")
    assert fn is ADVANTAGES.get("grpo")
    with pytest.raises(KeyError, match="known: grpo, node_mc, tree_grpo, tree_subgroup"):
        ADVANTAGES.get("nope")


def test_statuses_mark_leaves() -> None:
    tree = RolloutTree(Prompt("x"))
    n = tree.add_node(0, tree.new_path(True), status=Status.MAX_TURNS, reward=0.0)
    assert n.is_leaf and tree.num_leaves == 1 and Status.MAX_TURNS.terminal and not Status.TURN.terminal


def test_debiased_values_golden(small_tree: RolloutTree) -> None:
    # Debiased targets D (each child counted once, as its path's reward): node 1 -> paths 0, 2, 3 = (0 + 1 + 1) / 3;
    # node 3 -> 1; root -> bare paths 0 and 1 = 1/2 (the recursive V^(root) is 3/4).
    assert small_tree.debiased_targets()[0] == pytest.approx([0.5, 2 / 3, 0, 1, 1, 1, 1])
    g = adv("grpo", small_tree, debiased=True)
    assert flat(g) == pytest.approx([-0.5, -0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    a = adv("tree_subgroup", small_tree, debiased=True)
    assert a[2] == pytest.approx([-(0.5 + 2 / 3) / 2] * 2)
    assert a[4] == pytest.approx([0.5, 0.5])
    assert a[5] == pytest.approx([(0.5 + 1 / 3) / 2] * 2) and a[6] == a[5]
    mc = adv("node_mc", small_tree, debiased=True)
    assert mc[2] == pytest.approx([2 / 3 - 0.5, -2 / 3])
    assert mc[4] == pytest.approx([0.5, 0.0])
    assert mc[5] == pytest.approx([2 / 3 - 0.5, 1 / 3])
    z = (np.array([0, 1, 1, 1]) - 0.5) / np.std([0, 1, 1, 1])
    tg = adv("tree_grpo", small_tree, debiased=True)
    assert tg[2][0] == pytest.approx(z[0] + (0 - 2 / 3) / np.std([0, 1, 1]), rel=1e-5)
    assert tg[4][0] == pytest.approx(z[1], rel=1e-5)
    # The flag off is the recursive estimator, unchanged.
    assert adv("tree_subgroup", small_tree, debiased=False) == adv("tree_subgroup", small_tree)


def test_a_prefix_is_pushed_by_the_sum_of_its_leaves_advantages() -> None:
    # docs/method.md, "Loss": a prefix's tokens appear once per leaf below it, each with that leaf's advantage, so
    # under token_mean they move with the sum of those advantages. tree_subgroup with leaf means: where every leaf
    # below y keeps the same number D of depth terms, the groups at y's depth and below sum to 0 over y's leaves,
    # leaving (n_y / D) * sum over kept d < depth(y) of (V^(y) - b_d).
    from tests.test_tree import nested_tree

    t = nested_tree()  # node 2 (depth 2) has leaves 3, 6, 7, each with terms at d = 0, 1 (node 1), 2 (node 2)
    v, d = t.targets(), t.debiased_targets()[0]
    a = adv("tree_subgroup", t)
    assert sum(a[i][0] for i in (3, 6, 7)) == pytest.approx((3 / 3) * ((v[2] - v[0]) + (v[2] - v[1])))
    # Debiased values: a group g at y's depth or below adds n_g (V^(g) - D(g)) instead of 0 (0 again here, since
    # node 2's children are its leaves: D(2) = V^(2)); the shallower terms use D(1) = 0 and D(0) = 1/2.
    b = adv("tree_subgroup", t, debiased=True)
    assert sum(b[i][0] for i in (3, 6, 7)) == pytest.approx(
        (3 / 3) * ((v[2] - d[0]) + (v[2] - d[1]) + (v[2] - d[2]))
    )
