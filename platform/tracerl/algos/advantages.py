"""Advantage estimators over rollout trees (docs/method.md, "Tree-aware advantages" and "Loss", "Baselines").

Each estimator maps one tree to a :class:`TreeAdvantages`: for every leaf, one advantage per turn
on its root-to-leaf path (``per_turn[leaf][t]`` for the turn at depth t + 1). Collation broadcasts a
turn's advantage to that turn's model-generated tokens only (tool / observation tokens are masked).

* ``grpo``: A = r - mean(r over the prompt's leaves); divided by (std + eps) if ``normalize_std``.
* ``tree_subgroup`` (default, TreePO-style): for depth d = 0..depth(leaf)-1 take the group of leaves
  that share the leaf's first d turn nodes (d = 0: every leaf of the prompt);
  a_d = r - mean(group); keep d = 0 always and d > 0 only for groups of 2 or more; A = mean_d a_d.
  A tree without branching gives exactly mean-centred GRPO.
* ``node_mc``: node-level Monte-Carlo credit, A_t = V^(n_t) - V^(n_{t-1}) on the turn at depth t,
  with V^ the recursive target (section 6) and n_0 the root.
* ``tree_grpo``: [choice] two-level normalisation after Tree-GRPO:
  A = z(r; prompt's leaves) + z(r; the leaf's deepest sibling subgroup at d > 0 with >= 2 leaves),
  z(x; S) = (x - mean S) / (std S + eps); the second term is 0 where no such subgroup exists.

All per-leaf estimators (grpo, tree_subgroup, tree_grpo) give every turn of a leaf the same value.

``debiased=True`` (``loss.debiased_values``, by default on for tree allocators: ``tracerl.algos.batch``'s
``debiased_setting``): every node value an estimator uses (the prompt's mean,
a subgroup's mean, V^) is the node's debiased target D instead (platform/tracerl/tree.py): the mean,
over the node's children, of each child's path reward, free of the allocator's selection of where
continuations went. Group membership and std normalisation are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracerl.registry import Registry
from tracerl.tree import RolloutTree

EPS = 1e-6


@dataclass(frozen=True)
class TreeAdvantages:
    """Advantages of one tree."""

    leaf_ids: list[int]
    """Leaf node ids, in node-id order."""
    per_turn: list[np.ndarray]
    """per_turn[i][t]: advantage of the turn at depth t + 1 on the path to leaf_ids[i]; shape (depth,)."""

    def leaf_values(self) -> np.ndarray:
        """One number per leaf: the mean over its turns (equal to every turn for per-leaf estimators)."""
        return np.array([a.mean() if a.size else 0.0 for a in self.per_turn])


ADVANTAGES: Registry[Callable[..., TreeAdvantages]] = Registry("advantage estimator")


def _leaf_paths(tree: RolloutTree) -> tuple[list[int], list[list[int]], np.ndarray]:
    leaves = [n.node_id for n in tree.nodes if n.is_leaf]
    paths = [tree.path(i) for i in leaves]
    rewards = np.array([float(tree.nodes[i].reward or 0.0) for i in leaves])
    return leaves, paths, rewards


def _broadcast(leaves: list[int], paths: list[list[int]], values: np.ndarray) -> TreeAdvantages:
    return TreeAdvantages(leaves, [np.full(len(p) - 1, v) for p, v in zip(paths, values)])


def _values(tree: RolloutTree, debiased: bool) -> np.ndarray:
    """Node values: debiased targets D or recursive targets V^ (the mean of the leaves below)."""
    return tree.debiased_targets()[0] if debiased else tree.targets()


@ADVANTAGES.register("grpo")
def grpo_advantages(tree: RolloutTree, normalize_std: bool = False, debiased: bool = False) -> TreeAdvantages:
    """Group-relative advantage over all leaves of the prompt (mean-centred; std optional)."""
    leaves, paths, r = _leaf_paths(tree)
    a = r - (_values(tree, True)[0] if debiased else r.mean()) if r.size else r
    if normalize_std and r.size:
        a = a / (r.std() + EPS)
    return _broadcast(leaves, paths, a)


def _subgroups(paths: list[list[int]]) -> dict[tuple[int, int], list[int]]:
    """(depth d, node id at depth d) -> indices of leaves whose path passes that node (d >= 1)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(paths):
        for d in range(1, len(p) - 1):  # the leaf itself (d = depth) is a group of one: skip
            groups.setdefault((d, p[d]), []).append(i)
    return groups


@ADVANTAGES.register("tree_subgroup")
def tree_subgroup_advantages(
    tree: RolloutTree, normalize_std: bool = False, debiased: bool = False
) -> TreeAdvantages:
    """TreePO-style: mean over depths of r minus the mean of the leaves sharing the first d turns."""
    leaves, paths, r = _leaf_paths(tree)
    if not r.size:
        return TreeAdvantages([], [])
    groups = _subgroups(paths)
    vals = _values(tree, True) if debiased else None
    means = {
        key: r[idx].mean() if vals is None else vals[key[1]] for key, idx in groups.items() if len(idx) >= 2
    }
    base = r.mean() if vals is None else vals[0]
    out = np.empty(len(leaves))
    for i, p in enumerate(paths):
        terms = [r[i] - base]
        terms += [r[i] - means[(d, p[d])] for d in range(1, len(p) - 1) if (d, p[d]) in means]
        out[i] = np.mean(terms)
    if normalize_std:
        out = out / (r.std() + EPS)
    return _broadcast(leaves, paths, out)


@ADVANTAGES.register("node_mc")
def node_mc_advantages(
    tree: RolloutTree, normalize_std: bool = False, debiased: bool = False
) -> TreeAdvantages:
    """Per-turn Monte-Carlo credit V^(child) - V^(parent) from the recursive (or debiased) targets."""
    leaves, paths, r = _leaf_paths(tree)
    v = _values(tree, debiased)
    per_turn = [np.diff(v[p]) for p in paths]
    if normalize_std and r.size:
        per_turn = [a / (r.std() + EPS) for a in per_turn]
    return TreeAdvantages(leaves, per_turn)


@ADVANTAGES.register("tree_grpo")
def tree_grpo_advantages(
    tree: RolloutTree, normalize_std: bool = True, debiased: bool = False
) -> TreeAdvantages:
    """Two-level (prompt + deepest sibling subgroup) std-normalised advantages; always normalised."""
    leaves, paths, r = _leaf_paths(tree)
    if not r.size:
        return TreeAdvantages([], [])
    vals = _values(tree, True) if debiased else None
    z_global = (r - (r.mean() if vals is None else vals[0])) / (r.std() + EPS)
    groups = _subgroups(paths)
    out = z_global.copy()
    for i, p in enumerate(paths):
        for d in range(len(p) - 2, 0, -1):
            idx = groups.get((d, p[d]), [])
            if len(idx) >= 2:
                sub = r[idx]
                out[i] += (r[i] - (sub.mean() if vals is None else vals[p[d]])) / (sub.std() + EPS)
                break
    return _broadcast(leaves, paths, out)
