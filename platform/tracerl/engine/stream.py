"""Streaming tree rollouts (``pipeline.mode=streaming``): no step-wide barrier between bare rollouts and Stage 2.

In barrier mode every bare rollout of every prompt ends before any prefix is scored. Here an engine runs its
prompts' paths round by round (one turn per running path, ``TreeRolloutEngine``'s rounds) and reports each tree
whose bare rollouts have all ended; the step driver scores that tree's prefixes, solves its expansion and hands
it back, and the continuations join the next round while other prompts still roll out.

A tree's paths start together and advance one turn per round in both modes (the per-path async driver,
engine/paths.py, restores that creation order of a tree's nodes), and every turn's seed is keyed by
(seed, step, prompt, path, turn), so with a sampler whose output depends on the seed alone the trees are those of
barrier mode (tests/test_stream.py). ``StreamRun`` is one engine's share (a sampler actor's, or the whole step's
in process), driven in rounds; ``stream_in_process`` drives one run in this process; ``tracerl.actors.stream_pool``
drives one run per sampler actor. A sampler with ``agenerate`` (vLLM) is driven per path instead (engine/paths.py:
``AsyncStreamRun``, the same interface).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from tracerl.algos.allocators import Expansion
from tracerl.tree import RolloutTree
from tracerl.types import Prompt

OnBare = Callable[[list[int], list[RolloutTree]], list[tuple[int, Expansion]]]
"""The step driver's Stage 2: called with the trees (by index in the step) whose bare rollouts just ended; returns
the expansions to launch now, ``(index, expansion)``, for these trees or for trees reported earlier."""


class Served(NamedTuple):
    """What a run's ``serve`` call returns: the trees whose bare rollouts ended and those that finished (by index
    in the step), the paths still running, whether work is left, and the engine's counts so far."""

    bare: list[int]
    done: list[int]
    running: int
    active: bool
    ledger: Any


def expansion_tree(
    engine: Any, trees: dict[int, RolloutTree], i: int, tree: RolloutTree, expansion: Expansion
) -> RolloutTree:
    """The tree to expand as tree ``i``: our copy in ``trees`` when it is the sent ``tree`` (it holds the KV caches),
    else the sent one, kept in ``trees`` (its prefixes are re-encoded); the continuations are counted either way."""
    own = trees.get(i)
    local = own is not None and len(own.nodes) == len(tree.nodes)
    if own is None or not local:
        own = trees[i] = tree
    depths = [own.nodes[int(n)].depth for n, k in zip(expansion.node_ids, expansion.counts) for _ in range(k)]
    engine.ledger.count_continuations(depths, local)
    return own


class EngineShare:
    """One engine's share of a streaming step, what both of its drivers keep: its trees (with their KV caches) and
    where each tree stands: 'bare' (bare rollouts running), 'wait' (reported, expansion not decided yet), 'expand'
    (continuations running), 'done'. A driver runs the paths that ``run_paths`` hands it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        """A ``TreeRolloutEngine`` (its ``_start``, ``expansion_paths`` and ``ledger``, and what the driver uses)."""
        self.trees: dict[int, RolloutTree] = {}
        self.stage: dict[int, str] = {}

    def add_bare(self, ids: Sequence[int], prompts: Sequence[Prompt], counts: Sequence[int]) -> None:
        """Start ``counts[k]`` bare rollouts of ``prompts[k]``, tree ``ids[k]`` of the step."""
        for i, p, m in zip(ids, prompts, counts):
            self.trees[i] = RolloutTree(p)
            self.stage[i] = "bare"
            self.run_paths(i, [self.engine._start(self.trees[i], True) for _ in range(int(m))])

    def add_expansion(self, i: int, tree: RolloutTree, expansion: Expansion) -> None:
        """Start tree ``i``'s expansion from our own copy (it holds the KV caches) or, without one (the owner was
        busy or died), from the sent ``tree``, whose prefixes the sampler re-encodes. Both are counted."""
        own = expansion_tree(self.engine, self.trees, i, tree, expansion)
        self.stage[i] = "expand"
        self.run_paths(i, self.engine.expansion_paths([own], [expansion]))

    def run_paths(self, i: int, paths: list[Any]) -> None:
        """Run ``paths``, new paths of tree ``i``."""
        raise NotImplementedError


class StreamRun(EngineShare):
    """One engine's share of a streaming step, driven in rounds: every running path advances one turn a round
    (``TreeRolloutEngine.advance``)."""

    def __init__(
        self, engine: Any, ids: Sequence[int], prompts: Sequence[Prompt], counts: Sequence[int]
    ) -> None:
        super().__init__(engine)
        self.paths: list[Any] = []
        self.add_bare(ids, prompts, counts)

    def run_paths(self, i: int, paths: list[Any]) -> None:
        """Add ``paths`` to the next round."""
        self.paths += paths

    @property
    def active(self) -> bool:
        """Paths still run, or a tree waits to be reported."""
        return bool(self.paths) or any(s in ("bare", "expand") for s in self.stage.values())

    def serve(self, adds: Sequence[tuple[int, RolloutTree, Expansion]]) -> Served:
        """Start the expansions ``adds`` (tree index, tree, expansion), then run one round."""
        for i, tree, ex in adds:
            self.add_expansion(i, tree, ex)
        bare, done = self.advance()
        return Served(bare, done, len(self.paths), self.active, self.engine.ledger)

    def advance(self) -> tuple[list[int], list[int]]:
        """One round of every running path; returns the trees whose bare rollouts ended and those that finished."""
        if self.paths:
            self.paths = self.engine.advance(self.paths)
        running = Counter(id(p.tree) for p in self.paths)
        bare, done = [], []
        for i, s in self.stage.items():
            if running[id(self.trees[i])]:
                continue
            if s == "bare":
                self.stage[i] = "wait"
                bare.append(i)
            elif s == "expand":
                self.stage[i] = "done"
                done.append(i)
        return bare, done


def stream_in_process(
    engine: Any, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare
) -> list[RolloutTree]:
    """A streaming step on one in-process engine; the trees in ``prompts`` order."""
    run = StreamRun(engine, range(len(prompts)), prompts, counts)
    while run.active:
        bare, _ = run.advance()
        launch = on_bare(bare, [run.trees[i] for i in bare]) if bare else []
        for i, ex in launch:
            run.add_expansion(i, run.trees[i], ex)
        stages = set(run.stage.values())
        if not run.paths and not launch and "wait" in stages and stages <= {"wait", "done"}:
            waiting = sorted(i for i, s in run.stage.items() if s == "wait")
            raise RuntimeError(f"streaming step: no expansion was decided for trees {waiting}")
    return [run.trees[i] for i in range(len(prompts))]
