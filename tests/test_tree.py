import numpy as np
import pytest

from tests.conftest import chain
from tracerl.tree import RolloutTree, effective_ratio, leaf_effective_ratio, total_contrast_pairs
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
