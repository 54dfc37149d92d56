"""`tracerl bench baseline`: exact baseline bias on enumerated toy trees, and the command on a small sample."""

import itertools
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.test_bench_targets import run_sim_bench
from tests.test_tree import nested_tree
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status
from tracerl.workflows.experiments.baseline import baseline_records, over_bins, over_seeds, seed_errors


def _path(tree: RolloutTree, parent: int, reward: int, turns: int, bare: bool) -> int:
    """A path of ``turns`` turns below ``parent``, every node at true value 1/2; returns its first node."""
    pid, cur, first = tree.new_path(bare), parent, -1
    for t in range(turns):
        last = t == turns - 1
        node = tree.add_node(
            cur,
            pid,
            status=Status.ANSWERED if last else Status.TURN,
            reward=float(reward) if last else None,
            true_value=0.5,
        )
        cur = node.node_id
        first = cur if first < 0 else first
    return first


def _toy_tree(bits: tuple[int, ...], expand_failed: bool) -> RolloutTree:
    """V = 1/2 everywhere; two bare rollouts of two turns (rewards bits[0:2]); two one-turn continuations from the
    first turn of each expanded bare rollout (rewards from bits[2:]). ``expand_failed``: expand the failed rollouts
    (outcome-dependent, as TRACE's Stage 2 at a prefix predicted on track); else always the first one (blind)."""
    tree = RolloutTree(Prompt("toy", true_value=0.5))
    firsts = [_path(tree, 0, bits[j], 2, bare=True) for j in range(2)]
    chosen = [j for j in range(2) if bits[j] == 0] if expand_failed else [0]
    conts = iter(bits[2:])
    for j in chosen:
        for _ in range(2):
            _path(tree, firsts[j], next(conts), 1, bare=False)
    return tree


@pytest.mark.parametrize(
    ("expand_failed", "root_leaf_mean", "subgroup"), [(True, 1 / 12, -1 / 6), (False, 0.0, 0.0)]
)
def test_exact_bias_over_every_outcome(expand_failed: bool, root_leaf_mean: float, subgroup: float) -> None:
    # Every reward is a fair coin, so the 2^6 bit vectors are equally likely and the mean over them is the exact
    # expectation. Expanding the failures adds continuations to the trees whose bare rollouts failed: the leaf
    # mean is pulled up, E = 1/4 * 1 + 1/2 * (1 + 1) / 4 + 1/4 * (0 + 2) / 6 = 7/12 against V = 1/2; the mean of
    # the bare rollouts is exact. A subgroup exists only where a rollout failed, so both of its values, leaves
    # (0, c1, c2), have E = 1/3 against 1/2. Expanding blind leaves both unbiased.
    trees = [_toy_tree(bits, expand_failed) for bits in itertools.product((0, 1), repeat=6)]
    recs = baseline_records(trees)
    root, sub = seed_errors(recs["root"])["all"], seed_errors(recs["subgroups"])["all"]
    assert root["count"] == 64 and sub["count"] == 64  # expected failures a tree: 1; blind: always 1
    assert root["leaf_mean"]["bias"] == pytest.approx(root_leaf_mean, abs=1e-12)
    assert root["debiased"]["bias"] == pytest.approx(0.0, abs=1e-12)
    assert sub["leaf_mean"]["bias"] == pytest.approx(subgroup, abs=1e-12)
    assert sub["debiased"]["bias"] == pytest.approx(subgroup, abs=1e-12)


def test_records_and_errors_on_a_nested_tree() -> None:
    tree = nested_tree()  # tests/test_tree.py: V^ = [2/3, 1/2, 2/3, ...], D = [1/2, 0, 2/3, ...]
    tree.prompt = Prompt("n", true_value=0.5)
    for node, v in zip(tree.nodes[1:], [0.4, 0.6, 0.3, 0.7, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]):
        node.true_value = v
    recs = baseline_records([tree])
    assert recs["root"] == [(0.5, pytest.approx(2 / 3), 0.5)]
    # Subgroups: non-leaf nodes below the root with two or more leaves: 1 (4 leaves), 2 (3), 4 (2); not 8.
    assert recs["subgroups"] == [
        (0.4, 0.5, 0.0),
        (0.6, pytest.approx(2 / 3), pytest.approx(2 / 3)),
        (0.7, 1.0, 1.0),
    ]
    sub = seed_errors(recs["subgroups"])
    assert sub["all"]["leaf_mean"]["bias"] == pytest.approx((0.1 + 2 / 3 - 0.6 + 0.3) / 3)
    assert sub["all"]["debiased"]["rmse"] == pytest.approx(np.sqrt((0.16 + (2 / 3 - 0.6) ** 2 + 0.09) / 3))
    assert sub["0.4-0.6"]["count"] == 1 and sub["0.6-0.8"]["count"] == 2 and sub["0.0-0.2"]["count"] == 0
    assert sub["0.0-0.2"]["debiased"]["bias"] is None


def test_over_seeds_interval() -> None:
    a = seed_errors([(0.5, 0.6, 0.5)])
    b = seed_errors([(0.5, 0.8, 0.4)])
    row = over_seeds([a, b])["all"]
    assert row["count"] == 2 and row["seeds"] == 2
    assert row["leaf_mean"]["bias"] == pytest.approx(0.2) and row["debiased"]["bias"] == pytest.approx(-0.05)
    assert row["leaf_mean"]["bias_ci95"] == pytest.approx(
        stats.t.ppf(0.975, 1) * np.std([0.1, 0.3], ddof=1) / 2**0.5
    )
    assert row["difference"]["bias"] == pytest.approx(-0.25)
    assert over_seeds([a])["all"]["leaf_mean"]["bias_ci95"] is None


def test_over_bins_counts_intervals_that_exclude_zero() -> None:
    # Three seeds with the leaf mean +0.10..0.12 off in bin 0.0-0.2 and -0.10..-0.08 in 0.8-1.0: a pull towards 1/2
    # that nearly cancels in "all"; the debiased value is off by at most 0.01, either way, around 0.
    a = seed_errors([(0.1, 0.2, 0.11), (0.9, 0.8, 0.89)])
    b = seed_errors([(0.1, 0.22, 0.09), (0.9, 0.82, 0.91)])
    c = seed_errors([(0.1, 0.21, 0.1), (0.9, 0.81, 0.9)])
    groups = over_seeds([a, b, c])
    assert groups["all"]["leaf_mean"]["bias"] == pytest.approx(0.01)
    s = over_bins(groups)
    assert (
        s["leaf_mean"]["mean_abs_bias"] == pytest.approx(0.1) and s["leaf_mean"]["bins_excluding_zero"] == 2
    )
    assert (
        s["debiased"]["mean_abs_bias"] == pytest.approx(0.0, abs=1e-12)
        and s["debiased"]["bins_excluding_zero"] == 0
    )
    assert s["debiased"]["bins"] == 2 and groups["all"]["seeds"] == 3


def test_records_need_true_values() -> None:
    with pytest.raises(ValueError, match="only the simulator provides"):
        baseline_records([nested_tree()])


def test_bench_baseline_command_on_a_small_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    printed, summary = run_sim_bench("baseline", 4, 2, tmp_path, capsys, "allocators=[grpo,oracle_trace]")
    assert "grpo, root:" in printed and "oracle_trace, subgroups:" in printed
    assert summary["warmup_steps"] == 1 and summary["seeds"] == 2
    grpo, trace = summary["allocators"]["grpo"], summary["allocators"]["oracle_trace"]
    # No continuations: the mean of the leaves is the mean of the bare rollouts, in every tree; no subgroups.
    for group in grpo["root"]["groups"].values():
        assert group["leaf_mean"] == group["debiased"]
        assert group["difference"]["bias"] in (0.0, None)
    assert (
        grpo["root"]["groups"]["all"]["count"] == 3 * 36 * 2
        and grpo["subgroups"]["groups"]["all"]["count"] == 0
    )
    assert grpo["root"]["over_bins"]["leaf_mean"] == grpo["root"]["over_bins"]["debiased"]
    assert grpo["subgroups"]["over_bins"]["debiased"] == {
        "mean_abs_bias": None,
        "bins_excluding_zero": 0,
        "bins": 0,
    }
    # A branching allocator: both values differ somewhere, and there are subgroups.
    assert trace["subgroups"]["groups"]["all"]["count"] > 0
    root = trace["root"]["groups"]["all"]
    assert root["leaf_mean"]["rmse"] != root["debiased"]["rmse"]
