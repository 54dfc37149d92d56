"""Rollout trees as JSON records (one tree per JSONL line), with the allocation decisions that shaped them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracerl.tree import RolloutTree


def tree_to_record(
    tree: RolloutTree,
    root_score: float | None = None,
    bare_rollouts: int | None = None,
    prefix_scores: Mapping[int, float] | None = None,
    continuations: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """A JSON-ready record: the prompt, every node, and why prefixes were expanded (predicted p, K)."""
    targets, counts = tree.targets(), tree.leaf_counts()
    nodes = []
    for n in tree.nodes:
        rec: dict[str, Any] = {
            "id": n.node_id,
            "parent": n.parent,
            "depth": n.depth,
            "path": n.path_id,
            "status": n.status.value,
            "reward": n.reward,
            "content": n.content,
            "tokens": len(n.token_ids),
            "model_tokens": sum(n.model_mask),
            "leaves": int(counts[n.node_id]),
            "target": None if targets[n.node_id] != targets[n.node_id] else float(targets[n.node_id]),
        }
        if n.weight_version is not None:
            rec["weight_version"] = n.weight_version
        if prefix_scores and n.node_id in prefix_scores:
            rec["predicted"] = prefix_scores[n.node_id]
        if continuations and continuations.get(n.node_id):
            rec["continuations"] = continuations[n.node_id]
        nodes.append(rec)
    return {
        "prompt_id": tree.prompt.prompt_id,
        "prompt": tree.prompt.text,
        "answer": tree.prompt.answer,
        "predicted": root_score,
        "bare_rollouts": bare_rollouts if bare_rollouts is not None else tree.num_bare,
        "paths": tree.num_paths,
        "mixed": tree.is_mixed(),
        "rewards": tree.rewards().tolist(),
        "nodes": nodes,
    }
