"""Sampling seeds keyed by what is sampled, not by who samples it or when.

Every generated turn draws its randomness from one seed, ``SeedKey(run seed, step, prompt id, path, turn)``.
Nothing else enters: not the sampler worker that runs it, not the batch it shares, not the phase or order in
which the step's work runs. So a run's trees depend on its seed alone, whether one sampler worker or eight
roll them out (the pool's sharding, the engine's batching and a retried worker's schedule change nothing).

A path's identity is where it started in the tree: the address of its fork node plus its index there.
A node's address is the sequence of slots from the root: a child of the root is the j-th bare rollout
(slot j); a child on the same path as its parent has slot 0; the k-th continuation started at a node has
slot k (1, 2, ... in the order they were started, over all expansion phases). So bare rollout j is path
``(j,)`` and its t-th turn is node ``(j, 0, ..., 0)``; the 2nd continuation from that path's turn-3 node is
path ``(j, 0, 0, 2)``. The address depends only on the tree's structure, so the same node gets the same
address whether it was produced in the root rollout or in a later expansion, on any worker.

Evaluation keys have no step (``step=None``): sample j of a prompt is path ``(j,)`` whenever it runs.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from tracerl.tree import RolloutTree

_PERSON = b"tracerl-turn"


@dataclass(frozen=True)
class SeedKey:
    """What one sampled turn's randomness depends on (module docstring)."""

    seed: int
    """The run's seed."""
    step: int | None
    """The RL step (None: evaluation, whose samples do not change from step to step)."""
    prompt_id: str
    path: tuple[int, ...]
    """The path's identity: its fork node's address plus its start index there (``path_identity``)."""
    turn: int
    """The depth of the node this turn produces (1 for a prompt's first turn)."""

    def value(self) -> int:
        """The seed as a non-negative 63-bit integer: a keyed hash of every field, the same in every process."""
        step = -1 if self.step is None else self.step
        head = struct.pack("<4q", self.seed, step, self.turn, len(self.path))
        body = struct.pack(f"<{len(self.path)}q", *self.path)
        digest = hashlib.blake2b(head + body + self.prompt_id.encode(), digest_size=8, person=_PERSON)
        return int.from_bytes(digest.digest(), "little") >> 1


def continuations_at(tree: RolloutTree, node_id: int) -> int:
    """How many continuations have started at ``node_id`` so far (children on another path than the node's).

    The root has none: its children are bare rollouts."""
    if node_id == 0:
        return 0
    node = tree.nodes[node_id]
    return sum(1 for c in node.children if tree.nodes[c].path_id != node.path_id)


def address(tree: RolloutTree, node_id: int) -> tuple[int, ...]:
    """The node's slots from the root (module docstring); ``()`` for the root."""
    out: list[int] = []
    node = tree.nodes[node_id]
    while node.parent is not None:
        parent = tree.nodes[node.parent]
        if node.parent == 0:
            out.append(node.path_id)  # bare rollouts have path ids 0..num_bare-1, in start order
        elif node.path_id == parent.path_id:
            out.append(0)
        else:  # continuations at a node start in path-id order
            started = sorted(
                tree.nodes[c].path_id for c in parent.children if tree.nodes[c].path_id != parent.path_id
            )
            out.append(1 + started.index(node.path_id))
        node = parent
    return tuple(reversed(out))


def path_identity(tree: RolloutTree, node_id: int, index: int) -> tuple[int, ...]:
    """The identity of the path started at ``node_id`` as its ``index``-th path there (the root: bare rollout
    ``index``, from 0; another node: continuation ``index``, from 1)."""
    return (*address(tree, node_id), index)


def salted(seed: int, salt: str) -> int:
    """A run seed for a separate family of samples (``salt`` names it): a keyed hash of (``seed``, ``salt``) as a
    non-negative 63-bit integer. Keys under it differ from the run's own keys in their seed field, so their samples
    are independent of the run's (trace_mc's Monte-Carlo rollouts, engine/mc_scorer.py)."""
    digest = hashlib.blake2b(struct.pack("<q", seed) + salt.encode(), digest_size=8, person=b"tracerl-salt")
    return int.from_bytes(digest.digest(), "little") >> 1


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def uniforms(values: np.ndarray, n: int) -> np.ndarray:
    """``n`` uniforms in [0, 1) per seed value, shape (len(values), n): SplitMix64 of (value + k * golden),
    a counter-based stream, so each row depends only on its own value (vectorised over rows)."""
    z = np.asarray(values, dtype=np.uint64)[:, None] + _GOLDEN * np.arange(1, n + 1, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
