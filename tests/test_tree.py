import numpy as np
import pytest

from tests.conftest import chain
from tracerl.tree import (
    RolloutTree,
    effective_ratio,
    leaf_effective_ratio,
    prefix_group_effective_ratio,
    total_contrast_pairs,
)
from tracerl.types import Prompt, Status


def test_structure_and_recursive_targets(small_tree: RolloutTree) -> None:
    t = small_tree
    assert [n.depth for n in t.nodes] == [0, 1, 2, 1, 2, 2, 2]
    assert t.nodes[1].children == [2, 5, 6]
    assert t.num_bare == 2 and t.num_paths == 4
    np.testing.assert_array_equal(t.leaf_counts(), [4, 3, 1, 1, 1, 1, 1])
    # V^(1) = (0 + 1 + 1) / 3, V^(3) = 1, V^(root) = (3 * 2/3 + 1 * 1) / 4 = 3/4: leaf-count weighted.
    np.testing.assert_allclose(t.targets(), [0.75, 2 / 3, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert t.bare_prefixes() == [1, 3]
    assert t.path_rewards() == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert t.path(5) == [0, 1, 5]
    assert t.anchor(5).depth == 2 and t.anchor(5).node is t.nodes[5]


def test_contrast_pairs_by_split_depth(small_tree: RolloutTree) -> None:
    # Leaf 2 (fail) vs 5, 6 split at node 1 (depth 1); vs 4 splits at the root.
    assert small_tree.contrast_pairs() == {1: 2, 0: 1}
    assert total_contrast_pairs([small_tree]) == 3  # = successes x failures = 3 x 1


def test_effective_ratios() -> None:
    mixed, flat_fail, empty = RolloutTree(Prompt("a")), RolloutTree(Prompt("b")), RolloutTree(Prompt("c"))
    chain(mixed, 0, [(1.0, 1), (0.0, 1)])
    chain(flat_fail, 0, [(0.0, 1)] * 6)
    assert mixed.is_mixed() and not flat_fail.is_mixed()
    assert effective_ratio([mixed, flat_fail, empty]) == 0.5  # the empty tree is not an active prompt
    assert leaf_effective_ratio([mixed, flat_fail]) == pytest.approx(2 / 8)


def test_leaves_cannot_grow_and_bare_rollouts_come_first(small_tree: RolloutTree) -> None:
    with pytest.raises(ValueError, match="is a leaf"):
        small_tree.add_node(2, 0, status=Status.TURN)
    with pytest.raises(ValueError, match="before any continuation"):
        small_tree.new_path(bare=True)


def nested_tree() -> RolloutTree:
    """Two bare rollouts; continuations at depth 2 and depth 1 of the first, and at depth 1 of the second.

    0 (root)
    ├── 1 ── 2 ── 3 (r=0)        bare path 0
    │   │    ├── 6 (r=1)         continuation path 2 from node 2
    │   │    └── 7 (r=1)         continuation path 3 from node 2
    │   └── 8 ── 9 (r=0)         continuation path 4 from node 1
    └── 4 ── 5 (r=1)             bare path 1
         └── 10 (r=1)            continuation path 5 from node 4
    """
    tree = RolloutTree(Prompt("n"))
    chain(tree, 0, [(0.0, 3), (1.0, 2)])
    chain(tree, 2, [(1.0, 1), (1.0, 1)], bare=False)
    chain(tree, 1, [(0.0, 2)], bare=False)
    chain(tree, 4, [(1.0, 1)], bare=False)
    return tree


def test_debiased_targets_golden() -> None:
    t = nested_tree()
    # Recursive: the leaf mean below each node, weighted by leaf counts (root: 4 successes of 6 leaves).
    np.testing.assert_allclose(t.targets(), [4 / 6, 0.5, 2 / 3, 0, 1, 1, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(t.leaf_counts(), [6, 4, 3, 1, 2, 1, 1, 1, 1, 1, 1])
    # Debiased: each child counts once, as its own path's reward. Node 2: paths 0, 2, 3 -> (0 + 1 + 1) / 3.
    # Node 1: its children start or continue paths 0 and 4, both failed -> 0 (the two successes below node 2
    # sample V(node 2), not V(node 1)). Root: bare paths 0 and 1 -> 1/2 (the literal recursion, mean of the
    # children's own means, would give mean(mean(2/3, 0), mean(1, 1)) = 2/3).
    d, w = t.debiased_targets()
    np.testing.assert_allclose(d, [0.5, 0, 2 / 3, 0, 1, 1, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(w, [2, 2, 3, 1, 2, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(t.continuation_counts(), [0, 1, 2, 0, 1, 0, 0, 0, 0, 0, 0])
    # The fit's examples: per node its path's reward (weight 1), then its continuations' mean (weight K);
    # together they are the node's (D, W).
    ids, vals, wts = t.debiased_examples()
    assert ids.tolist() == [0, 1, 1, 2, 2, 4, 4, 8]
    np.testing.assert_allclose(vals, [0.5, 0, 0, 0, 1, 1, 1, 0])
    np.testing.assert_array_equal(wts, [2, 1, 1, 1, 2, 1, 1, 1])
    for node in set(ids.tolist()):
        sel = ids == node
        assert (
            np.sum(wts[sel] * vals[sel]) / np.sum(wts[sel]) == pytest.approx(d[node])
            and np.sum(wts[sel]) == w[node]
        )


def test_debiased_targets_are_unbiased_under_outcome_dependent_expansion() -> None:
    """Exact expectations by enumeration, derived by hand.

    Root (V = 1/2) -> node y with V(y) = 0.2 or 0.8 (equally likely) -> leaf r0 ~ Bernoulli(V(y)). The
    allocator expands y with K = 3 one-turn continuations (each ~ Bernoulli(V(y))) only after a surprise
    success at V(y) = 0.2 (as V_pref does), else K = 0. Recursive root target, n-weighted:
    E[sum of leaves - n/2] = 0.1 (1 + 0.6 - 2) + 0.4 (0 - 0.5) + 0.4 (1 - 0.5) + 0.1 (0 - 0.5) = -0.09,
    E[n] = 0.1 * 4 + 0.9 = 1.3: bias -0.09 / 1.3. Debiased root = r0: bias 0. At y, the plain mean of its
    children has E[D(y) - V(y)] = 1/2 (0.2 * 0.8 / 4 - 0.8 * 0.2) = -0.06, but weighted by its number of
    children the bias is exactly 0. Only over expanded y (K > 0), W (D - V) has expectation
    0.1 * (1 - 0.2) = 0.08 (the original path's success that triggered the expansion); the continuation
    example alone, K (mean - V), has 0.
    """
    import itertools

    acc = {
        "old": 0.0,
        "n": 0.0,
        "root": 0.0,
        "y_plain": 0.0,
        "y_weighted": 0.0,
        "expanded_d": 0.0,
        "expanded_cont": 0.0,
    }
    for v, r0 in itertools.product([0.2, 0.8], [0.0, 1.0]):
        k = 3 if (v, r0) == (0.2, 1.0) else 0
        for conts in itertools.product([0.0, 1.0], repeat=k):
            prob = 0.5 * (v if r0 else 1 - v) * np.prod([v if c else 1 - v for c in conts])
            tree = RolloutTree(Prompt("e"))
            chain(tree, 0, [(r0, 2)])
            chain(tree, 1, [(c, 1) for c in conts], bare=False)
            old, n = tree.targets(), tree.leaf_counts()
            d, w = tree.debiased_targets()
            acc["old"] += prob * n[0] * (old[0] - 0.5)
            acc["n"] += prob * n[0]
            acc["root"] += prob * w[0] * (d[0] - 0.5)
            acc["y_plain"] += prob * (d[1] - v)
            acc["y_weighted"] += prob * w[1] * (d[1] - v)
            if k:
                ids, vals, wts = tree.debiased_examples()
                acc["expanded_d"] += prob * w[1] * (d[1] - v)
                acc["expanded_cont"] += prob * wts[-1] * (vals[-1] - v)  # node 1's second example
    assert acc["old"] / acc["n"] == pytest.approx(-0.09 / 1.3)
    assert acc["root"] == pytest.approx(0.0, abs=1e-12)
    assert acc["y_plain"] == pytest.approx(-0.06)
    assert acc["y_weighted"] == pytest.approx(0.0, abs=1e-12)
    assert acc["expanded_d"] == pytest.approx(0.08)
    assert acc["expanded_cont"] == pytest.approx(0.0, abs=1e-12)


def test_prefix_group_effective_ratio() -> None:
    # Expanded prefixes of nested_tree: node 1 (depth 1; leaves 0, 1, 1, 0: mixed), node 2 (depth 2; 0, 1, 1:
    # mixed), node 4 (depth 1; 1, 1: not mixed).
    t = nested_tree()
    assert t.prefix_groups() == [(1, True), (2, True), (1, False)]
    ratio, count, by_depth = prefix_group_effective_ratio([t])
    assert (ratio, count, by_depth) == (pytest.approx(2 / 3), 3, {1: 0.5, 2: 1.0})
    flat = RolloutTree(Prompt("f"))
    chain(flat, 0, [(1.0, 2), (0.0, 2)])
    ratio, count, by_depth = prefix_group_effective_ratio([flat])
    assert np.isnan(ratio) and count == 0 and by_depth == {}


def test_step_metrics_log_the_prefix_group_ratio_per_step_and_depth() -> None:
    from tracerl import metrics as M
    from tracerl.engine.step import StepOutcome
    from tracerl.engine.step_stats import step_metrics

    t = nested_tree()
    m = step_metrics(StepOutcome([t.prompt], [t], [t], np.array([2]), np.array([0.5])))
    assert m[M.PREFIX_GROUP_ER] == pytest.approx(2 / 3) and m[M.EXPANDED_PREFIXES] == 3.0
    assert m[M.prefix_group_depth(1)] == 0.5 and m[M.prefix_group_depth(2)] == 1.0
    # Per-depth keys come and go between steps; NaN is "undefined this step".
    mean = M.mean_metrics([{"a": 1.0, "b": float("nan")}, {"a": 3.0, "c": 2.0}])
    assert mean["a"] == 2.0 and np.isnan(mean["b"]) and mean["c"] == 2.0


def test_grow_to_takes_the_expanded_copy_in_place(small_tree: RolloutTree) -> None:
    import copy

    grown = copy.deepcopy(small_tree)
    chain(grown, 3, [(0.0, 1)], bare=False)
    prompt, same = small_tree.prompt, small_tree
    small_tree.grow_to(grown)
    assert same is small_tree and small_tree.prompt is prompt  # the caller's objects stay
    assert (
        small_tree.num_leaves == 5 and small_tree.num_paths == 5 and small_tree.rewards().tolist()[-1] == 0.0
    )
    other = RolloutTree(Prompt("other"))
    with pytest.raises(ValueError, match="cannot grow to a tree of prompt 'other'"):
        small_tree.grow_to(other)
