import numpy as np
import pytest

from tracerl.predictors import LENGTH_PREDICTORS
from tracerl.predictors.length import RidgeLengthPredictor, length_targets
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt, Status


def add_path(t: RolloutTree, parent: int, turns: list[int], reward: float, bare: bool) -> list[int]:
    """A path from ``parent``: one node per entry, with that many generated tokens; the last is a leaf."""
    pid = t.new_path(bare)
    ids = []
    for i, n in enumerate(turns):
        last = i == len(turns) - 1
        node = t.add_node(
            parent,
            pid,
            token_ids=[7] * (n + 3),
            model_mask=[True] * n + [False] * 3,
            status=Status.ANSWERED if last else Status.TURN,
            reward=reward if last else None,
            features=np.array([(t.nodes[parent].depth + 1) / 4.0]),
        )
        ids.append(node.node_id)
        parent = node.node_id
    return ids


def test_targets_count_each_child_once() -> None:
    t = RolloutTree(Prompt("a", features=np.array([0.0])))
    a = add_path(t, 0, [10, 20, 30], 1.0, bare=True)  # a rollout of 60 generated tokens
    add_path(t, 0, [5, 5], 0.0, bare=True)  # 10 tokens
    add_path(t, a[0], [1], 0.0, bare=False)  # two continuations from the first turn of path a
    add_path(t, a[0], [3, 4], 0.0, bare=False)
    data = length_targets([t])
    by_node = {
        (len(x.history), x.history[-1].node_id if x.history else 0): (v, w)
        for x, v, w in zip(data.anchors, data.tokens, data.weights)
    }
    assert by_node[(0, 0)] == (pytest.approx(35.0), 2.0)  # root: (60 + 10) / 2 bare rollouts
    assert by_node[(1, a[0])] == (
        pytest.approx((50 + 1 + 7) / 3),
        3.0,
    )  # own path 20+30, continuations 1 and 7
    assert by_node[(2, a[1])] == (pytest.approx(30.0), 1.0)


def test_ridge_learns_a_synthetic_length_relation() -> None:
    # Each turn generates 10 + 40 x tokens for prompt feature x; every rollout has 4 turns, so one rollout
    # from depth d generates (4 - d)(10 + 40 x) tokens.
    rng = np.random.default_rng(0)
    pred = LENGTH_PREDICTORS.get("ridge")(l2=1e-3)
    assert pred.predict([Anchor(Prompt("z", features=np.array([0.5])))]).tolist() == [256.0]  # the prior
    for step in range(6):
        trees = []
        for i in range(20):
            x = float(rng.random())
            t = RolloutTree(Prompt(f"p{step}-{i}", features=np.array([x])))
            per_turn = int(round(10 + 40 * x))
            for _ in range(2):
                add_path(t, 0, [per_turn] * 4, 1.0, bare=True)
            trees.append(t)
        stats = pred.fit(trees)
    assert stats["length_examples"] == 20 * 7  # per tree: the root and 2 x 3 interior turns
    test = RolloutTree(Prompt("t", features=np.array([0.8])))
    ids = add_path(test, 0, [42] * 4, 0.0, bare=True)
    got = pred.predict([test.anchor(0), test.anchor(ids[0]), test.anchor(ids[2])])
    true = np.array([4 * 42, 3 * 42, 42])
    np.testing.assert_allclose(got, true, rtol=0.25)
    assert got[0] > got[1] > got[2]
    low = pred.predict([Anchor(Prompt("u", features=np.array([0.1])))])[0]
    assert low == pytest.approx(4 * 14, rel=0.25)


def test_state_round_trip_and_bad_settings() -> None:
    pred = RidgeLengthPredictor()
    t = RolloutTree(Prompt("a", features=np.array([0.3])))
    add_path(t, 0, [5, 6], 1.0, bare=True)
    pred.fit([t])
    other = RidgeLengthPredictor()
    other.load_state_dict(pred.state_dict())
    assert other.predict([t.anchor(0)]).tolist() == pred.predict([t.anchor(0)]).tolist()
    with pytest.raises(ValueError, match="length predictor needs l2 > 0"):
        RidgeLengthPredictor(l2=0.0)
