"""Rollout trees: typed turn nodes, recursive targets, leaf counts, contrast statistics.

A tree's root (node 0, depth 0) is the prompt; each other node is one ReAct turn
(thought, action, observation). A bare rollout is a root-to-leaf chain; a continuation re-uses a
prefix verbatim and adds a new chain below it (docs/method.md, "Objects"). Node ids are assigned in
creation order, so a parent's id is always smaller than its children's: one reverse pass computes
every bottom-up quantity.

Recursive targets (section 6):
    V^(leaf) = r,    V^(y) = sum_{c in children(y)} n_c * V^(c) / n_y
which is the mean reward of the leaves below y; n_y is the number of leaves below y.

Debiased targets (allocator ``trace_debiased``; ``RolloutTree.debiased_targets``). V^ is biased: the
allocator chose where continuations go after seeing the bare rollouts' rewards, so the leaves below y
over-represent prefixes expanded because a flip was predicted, and a continuation from a prefix y'
below y samples V(y'), not V(y). What is unbiased, given how a tree is recorded (every child c of y
starts or continues exactly one path, ``path_id``, whose leaf carries its reward r(c)):

1. Each child gives one unbiased sample of V(y): E[r(c) | H_c] = V(c) and E[V(c) | H_y] = V(y). After
   c the path is the policy's; nothing about its future decided that c exists (bare rollouts are placed
   before any reward is seen; a continuation's start and the count K_y are chosen from the bare
   rollouts, which given H_y are independent of the continuation).
2. The number of children is not: K_y depends on the reward r_0 of the original path through y (V_pref
   expands failed paths that were predicted on track, successful ones predicted lost). So the plain
   mean D(y) = (r_0 + sum_k r_k) / (1 + K_y) is biased, E[D(y) - V(y)] = E[(r_0 - V(y)) / (1 + K_y)],
   but weighting y by its number of children W(y) = 1 + K_y removes it:
       E[W (D - V)] = E[r_0 - V(y)] + E[sum_{k <= K_y} (r_k - V(y))] = 0 + 0,
   since r_0 has weight 1 whatever K_y is and each r_k is independent of K_y given H_y. This is the
   sense the MSE fit needs: among anchors with the same history, the W-weighted mean target is V.
3. A child therefore enters its parent as its path's reward r(c), not as its own mean D(c): D(c) is
   unbiased only under W(c), which was chosen after seeing r(c) (at low V a success gets the
   continuations and is diluted towards V, a failure keeps 0: D(c) is low). No unbiased estimate of
   V(c) can use continuations whose number depends on the outcome, so a continuation refines only the
   value of the prefix it started from and is not an extra sample of that prefix's ancestors.

Hence D(leaf) = r, W(leaf) = 1; D(y) = mean over children c of r(c), W(y) = number of children
(the root: its bare rollouts). W never grows with expansion below y, as n_y did.

4. The fit takes (D, W) apart into examples that are each unbiased given that they exist
   (``debiased_examples``): the root's (D, W); for every other non-leaf node n, its own path's reward
   with weight 1 (every such node is in the tree whatever that reward is); and, where continuations
   started at n, their mean reward with weight K_n (whether they exist was decided without them). In
   the squared loss the two examples at n have the gradient of one example (D(n), 1 + K_n). Taken
   alone, an expanded prefix's D is not unbiased: E[r_0 - V | K > 0] != 0, since the expansion was
   chosen after seeing r_0; its continuation example is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from tracerl.types import Anchor, Node, Prompt


class RolloutTree:
    """All rollouts of one prompt in one step, as a tree of turn nodes."""

    def __init__(self, prompt: Prompt) -> None:
        self.prompt = prompt
        self.nodes: list[Node] = [Node(node_id=0, parent=None, depth=0, path_id=-1, content=prompt.text)]
        self.num_paths = 0
        self.num_bare = 0
        self._leaf_ids: list[int] = []
        self.fork_state: dict[int, Any] = {}
        """Per-node data a backend keeps so continuations can start there (context tokens, env state)."""
        self.prompt_token_ids: list[int] = []
        """The rendered prompt's tokens (LM backends); a leaf's sequence is these plus its path's turn tokens."""

    # -- building -------------------------------------------------------------------------------
    def new_path(self, bare: bool) -> int:
        """Reserve a path id for a new bare rollout or continuation."""
        if bare and self.num_paths != self.num_bare:
            raise ValueError("bare rollouts must be added before any continuation")
        pid = self.num_paths
        self.num_paths += 1
        if bare:
            self.num_bare += 1
        return pid

    def add_node(self, parent: int, path_id: int, **fields: Any) -> Node:
        """Append a child of ``parent``; extra keyword fields go to :class:`Node`."""
        par = self.nodes[parent]
        if par.is_leaf:
            raise ValueError(f"node {parent} is a leaf ({par.status.value}); it cannot have children")
        node = Node(node_id=len(self.nodes), parent=parent, depth=par.depth + 1, path_id=path_id, **fields)
        self.nodes.append(node)
        par.children.append(node.node_id)
        if node.is_leaf:
            self._leaf_ids.append(node.node_id)
        return node

    def detached(self) -> RolloutTree:
        """A copy to expand without changing this tree: its own nodes (children lists and leaves copied), the same
        prompt object and the same fork-state values (backends read those and add states for new nodes only)."""
        out = RolloutTree(self.prompt)
        out.nodes = [replace(n, children=list(n.children)) for n in self.nodes]
        out.num_paths, out.num_bare = self.num_paths, self.num_bare
        out._leaf_ids, out.fork_state = list(self._leaf_ids), dict(self.fork_state)
        out.prompt_token_ids = self.prompt_token_ids
        return out

    def grow_to(self, grown: RolloutTree) -> None:
        """Take the nodes, paths and fork states of ``grown``, a copy of this tree that was expanded elsewhere (a
        rollout worker), in place: callers hold this object (the step's tree list). The prompt stays this tree's
        own object (allocators and pools key prompts by identity)."""
        if grown.prompt.prompt_id != self.prompt.prompt_id or len(grown.nodes) < len(self.nodes):
            raise ValueError(
                f"tree of prompt {self.prompt.prompt_id!r} ({len(self.nodes)} nodes) cannot grow to a tree of "
                f"prompt {grown.prompt.prompt_id!r} with {len(grown.nodes)} nodes"
            )
        self.nodes, self.num_paths, self.num_bare = grown.nodes, grown.num_paths, grown.num_bare
        self._leaf_ids, self.fork_state = grown._leaf_ids, grown.fork_state
        self.prompt_token_ids = grown.prompt_token_ids

    def reorder(self, start: int, order: Sequence[int]) -> None:
        """Renumber the nodes from ``start`` on as if they had been created in ``order`` (their current ids, a
        permutation of ``start .. len(nodes) - 1``): ids, parents, children, leaves and fork states follow. A driver
        that adds a phase's nodes as its paths finish turns (engine/paths.py) restores the creation order of the
        round driver, so the trees do not depend on which path's turn ended first."""
        if sorted(order) != list(range(start, len(self.nodes))):
            raise ValueError(f"order must hold each node id from {start} to {len(self.nodes) - 1} once")
        new = {old: start + k for k, old in enumerate(order)}

        def nid(old: int) -> int:
            return new.get(old, old)

        self.nodes = self.nodes[:start] + [self.nodes[old] for old in order]
        for node in self.nodes:
            node.node_id = nid(node.node_id)
            node.parent = None if node.parent is None else nid(node.parent)
            node.children = sorted(nid(c) for c in node.children)  # creation order is id order
        self._leaf_ids = sorted(nid(i) for i in self._leaf_ids)
        self.fork_state = {nid(k): v for k, v in self.fork_state.items()}

    def stamp_version(self, version: int, start: int = 1, stop: int | None = None) -> None:
        """Record ``version`` as the weight version of the turns ``nodes[start:stop]`` (ids are in creation order:
        a step's bare rollouts come before its continuations)."""
        for n in self.nodes[max(start, 1) : stop]:
            n.weight_version = version

    def sequence(self, leaf_id: int) -> tuple[list[int], list[bool], list[int]]:
        """The token sequence of the rollout ending at ``leaf_id``: prompt then every turn's tokens.

        Returns (token ids, model mask, turn index per token: 0 for the prompt, t for the turn at depth t).
        """
        ids, mask, turn = (
            list(self.prompt_token_ids),
            [False] * len(self.prompt_token_ids),
            [0] * len(self.prompt_token_ids),
        )
        for nid in self.path(leaf_id)[1:]:
            node = self.nodes[nid]
            ids += node.token_ids
            mask += node.model_mask
            turn += [node.depth] * len(node.token_ids)
        return ids, mask, turn

    # -- structure ------------------------------------------------------------------------------
    @property
    def root(self) -> Node:
        return self.nodes[0]

    def leaves(self) -> list[Node]:
        """Leaf nodes in node-id order (a node's status is fixed when it is added)."""
        return [self.nodes[i] for i in self._leaf_ids]

    def rewards(self) -> np.ndarray:
        """Leaf rewards in node-id order, shape (num_leaves,)."""
        return np.array([self.nodes[i].reward for i in self._leaf_ids], dtype=float)

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root (inclusive) down to ``node_id`` (inclusive)."""
        out = []
        cur: int | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.nodes[cur].parent
        return out[::-1]

    def anchor(self, node_id: int) -> Anchor:
        """The anchor (prompt + turns) ending at ``node_id``."""
        return Anchor(self.prompt, tuple(self.nodes[i] for i in self.path(node_id)[1:]))

    def iter_edges(self) -> Iterator[tuple[int, int]]:
        for n in self.nodes:
            for c in n.children:
                yield n.node_id, c

    def bare_prefixes(self) -> list[int]:
        """Non-leaf prefix nodes of the bare rollouts (1 <= t <= T-1): the candidates for expansion."""
        return [n.node_id for n in self.nodes[1:] if not n.is_leaf and n.path_id < self.num_bare]

    def path_rewards(self) -> dict[int, float]:
        """Reward of each finished rollout, keyed by path id (the leaf of the path carries it)."""
        return {n.path_id: float(n.reward) for n in self.leaves() if n.reward is not None}

    # -- bottom-up statistics ------------------------------------------------------------------
    def leaf_counts(self) -> np.ndarray:
        """n_y: number of leaves below each node (a leaf counts itself), shape (num_nodes,)."""
        n = np.zeros(len(self.nodes), dtype=np.int64)
        for node in reversed(self.nodes):
            if node.is_leaf:
                n[node.node_id] = 1
            if node.parent is not None:
                n[node.parent] += n[node.node_id]
        return n

    def targets(self) -> np.ndarray:
        """Recursive targets V^ per node (section 6), shape (num_nodes,); NaN where no leaf is below."""
        total = np.zeros(len(self.nodes))
        for node in reversed(self.nodes):
            if node.is_leaf:
                if node.reward is None:
                    raise ValueError(f"leaf {node.node_id} has no reward")
                total[node.node_id] = node.reward
            if node.parent is not None:
                total[node.parent] += total[node.node_id]
        n = self.leaf_counts()
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, total / np.maximum(n, 1), np.nan)

    def continuation_counts(self) -> np.ndarray:
        """K_y: continuations started at each node (children on another path than the node's), shape (num_nodes,).

        The root's children are bare rollouts, not continuations, so K is 0 there.
        """
        k = np.zeros(len(self.nodes), dtype=np.int64)
        for node in self.nodes[1:]:
            par = self.nodes[node.parent or 0]
            if par.node_id != 0 and node.path_id != par.path_id:
                k[par.node_id] += 1
        return k

    def debiased_targets(self) -> tuple[np.ndarray, np.ndarray]:
        """Debiased targets D and their fit weights W per node (module docstring), each shape (num_nodes,).

        D(leaf) = r; D(y) = mean over y's children of the reward of each child's path; W = the number of
        children whose path has finished (1 on a leaf). NaN / 0 where no child's path has a reward.
        """
        rewards = self.path_rewards()
        d, w = np.full(len(self.nodes), np.nan), np.zeros(len(self.nodes))
        for node in self.nodes:
            if node.is_leaf:
                if node.reward is None:
                    raise ValueError(f"leaf {node.node_id} has no reward")
                d[node.node_id], w[node.node_id] = node.reward, 1.0
                continue
            samples = [rewards[p] for p in (self.nodes[c].path_id for c in node.children) if p in rewards]
            if samples:
                d[node.node_id], w[node.node_id] = float(np.mean(samples)), float(len(samples))
        return d, w

    def debiased_examples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fit's examples for debiased targets (module docstring, point 4): (node ids, values, weights).

        Per non-leaf node, in node-id order: the root gets (D, W); any other node (own path's reward, 1), then,
        if continuations started there, (their mean reward, K). Nodes with no finished path below are skipped.
        """
        rewards = self.path_rewards()
        ids: list[int] = []
        vals: list[float] = []
        wts: list[float] = []
        for node in self.nodes:
            if node.is_leaf:
                continue
            kids = [self.nodes[c].path_id for c in node.children]
            if node.parent is None:
                groups = [[rewards[p] for p in kids if p in rewards]]
            else:
                own = [rewards[node.path_id]] if node.path_id in rewards else []
                groups = [own, [rewards[p] for p in kids if p != node.path_id and p in rewards]]
            for g in groups:
                if g:
                    ids.append(node.node_id)
                    vals.append(float(np.mean(g)))
                    wts.append(float(len(g)))
        return np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=float), np.asarray(wts, dtype=float)

    def prefix_groups(self) -> list[tuple[int, bool]]:
        """(depth, mixed) of every prefix that received continuations: are the leaves below it mixed?"""
        succ = np.zeros(len(self.nodes), dtype=bool)
        fail = np.zeros(len(self.nodes), dtype=bool)
        for node in reversed(self.nodes):
            if node.is_leaf:
                succ[node.node_id] = (node.reward or 0.0) > 0.5
                fail[node.node_id] = not succ[node.node_id]
            if node.parent is not None:
                succ[node.parent] |= succ[node.node_id]
                fail[node.parent] |= fail[node.node_id]
        k = self.continuation_counts()
        return [(n.depth, bool(succ[n.node_id] and fail[n.node_id])) for n in self.nodes if k[n.node_id] > 0]

    @property
    def num_leaves(self) -> int:
        return len(self._leaf_ids)

    def is_mixed(self) -> bool:
        """True if the tree holds a success and a failure leaf (reward above / at most 0.5)."""
        r = self.rewards()
        return bool(r.size) and bool((r > 0.5).any()) and bool((r <= 0.5).any())

    def contrast_pairs(self) -> dict[int, int]:
        """Pairs of leaves with different rewards, keyed by the depth of the node where their paths split.

        Every pair of leaves splits at exactly one node (their lowest common ancestor), so the values
        sum to (#successes x #failures). Pairs split at depth > 0 are the step-level preference pairs
        that tree rollouts add over flat groups.
        """
        succ = np.zeros(len(self.nodes), dtype=np.int64)
        fail = np.zeros(len(self.nodes), dtype=np.int64)
        out: dict[int, int] = {}
        for node in reversed(self.nodes):
            if node.is_leaf:
                if (node.reward or 0.0) > 0.5:
                    succ[node.node_id] = 1
                else:
                    fail[node.node_id] = 1
                continue
            s_acc = f_acc = pairs = 0
            for c in node.children:
                pairs += s_acc * fail[c] + f_acc * succ[c]
                s_acc += succ[c]
                f_acc += fail[c]
            succ[node.node_id], fail[node.node_id] = s_acc, f_acc
            if pairs:
                out[node.depth] = out.get(node.depth, 0) + int(pairs)
        return out


def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of active prompts (trees with leaves) whose tree is mixed (docs/method.md, "Budget and metrics")."""
    active = [t for t in trees if t.num_leaves > 0]
    return sum(t.is_mixed() for t in active) / len(active) if active else 0.0


def leaf_effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of leaves that sit in a mixed tree (they get a non-zero prompt-level advantage)."""
    total = sum(t.num_leaves for t in trees)
    return sum(t.num_leaves for t in trees if t.is_mixed()) / total if total else 0.0


def total_contrast_pairs(trees: Sequence[RolloutTree]) -> int:
    return sum(sum(t.contrast_pairs().values()) for t in trees)


def prefix_group_effective_ratio(trees: Sequence[RolloutTree]) -> tuple[float, int, dict[int, float]]:
    """Of the prefixes that received continuations, the share whose leaves below are mixed.

    Returns (ratio over all depths, number of such prefixes, {depth: ratio}); the ratio is NaN when no
    prefix received a continuation (flat allocators).
    """
    groups = [g for t in trees for g in t.prefix_groups()]
    by_depth: dict[int, list[bool]] = {}
    for depth, mixed in groups:
        by_depth.setdefault(depth, []).append(mixed)
    ratio = sum(m for _, m in groups) / len(groups) if groups else float("nan")
    return ratio, len(groups), {d: sum(v) / len(v) for d, v in sorted(by_depth.items())}
