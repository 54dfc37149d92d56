"""A streaming step on the sampler actors (``pipeline.mode=streaming``; engine/stream.py has the engine's side).

Every sampler actor runs its shard of the step's prompts round by round; each call (``RolloutWorker.stream``)
hands it new work, runs one round and returns the trees whose bare rollouts or expansions ended. The driver
handles each actor's answer as it comes (``ray.wait``), so actors never wait for each other: a finished tree is
scored and expanded at once (the step's ``on_bare``) and its continuations join that actor's next round.

Placement: a continuation goes to the actor that holds its prefix's KV cache (the one that rolled the tree out)
unless that actor has more than ``reencode_queue`` paths running or queued; then the least-loaded actor takes the
whole tree's expansion and re-encodes the prefixes (the engines count both, per prefix depth).

Failures: an actor that dies is replaced (``RolloutPool._replace``: the current weights) and its share is rebuilt
on the fresh actor: the bare rollouts of its trees that had not ended start again (per-turn seeds: the same trees),
and the expansions it held run again from the driver's copies of their trees; the ledger counts the retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray

from tracerl.actors.retry import DEAD
from tracerl.algos.allocators import Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.stream import OnBare
from tracerl.tree import RolloutTree
from tracerl.types import Prompt


class PoolStream:
    """One streaming step over ``pool``'s sampler actors (a ``RolloutPool``); ``run`` returns the trees."""

    def __init__(
        self,
        pool: Any,
        shards: list[list[int]],
        prompts: Sequence[Prompt],
        counts: Sequence[int],
        on_bare: OnBare,
    ) -> None:
        self.pool, self.prompts, self.counts, self.on_bare = pool, list(prompts), list(counts), on_bare
        n = len(shards)
        self.home = {i: w for w, s in enumerate(shards) for i in s}
        """The actor each tree's paths run on (its KV caches live there)."""
        self.bare: dict[int, RolloutTree] = {}
        """Trees whose bare rollouts ended: the driver's copies, without caches."""
        self.launched: dict[int, Expansion] = {}
        self.final: dict[int, RolloutTree] = {}
        self.queue = [sum(int(counts[i]) for i in s) for s in shards]
        """Paths running or queued per actor (as last reported, plus what was sent since)."""
        self.inbox: list[list[int]] = [[] for _ in range(n)]
        """Trees whose expansion goes with the actor's next call."""
        self.begin: list[tuple[list[int], list[Prompt], list[int]] | None] = [
            (s, [self.prompts[i] for i in s], [int(counts[i]) for i in s]) for s in shards
        ]
        self.more = [bool(s) for s in shards]
        """The actor reported work left (paths running, trees to report)."""
        self.ledgers: dict[int, BudgetLedger] = {}
        self.tries = [0] * n
        self.pending: dict[Any, int] = {}

    def run(self) -> list[RolloutTree]:
        while True:
            for w in range(len(self.inbox)):
                if w not in self.pending.values() and (self.more[w] or self.inbox[w]):
                    self._submit(w)
            if not self.pending:
                break
            done, _ = ray.wait(list(self.pending), num_returns=1)
            w = self.pending.pop(done[0])
            try:
                bare, finished, running, more, ledger = ray.get(done[0])
            except DEAD:
                self._recover(w)
                continue
            self.ledgers[w], self.more[w] = ledger, more
            self.queue[w] = running + sum(self.launched[i].leaves for i in self.inbox[w])
            for i, t in finished:
                t.prompt = self.prompts[
                    i
                ]  # the caller's prompt objects (identity matters to the step driver)
                self.final[i] = t
            for i, t in bare:
                t.prompt = self.prompts[i]
                self.bare[i] = t
            if bare:
                for i, ex in self.on_bare([i for i, _ in bare], [t for _, t in bare]):
                    self._place(i, ex)
        missing = [i for i in range(len(self.prompts)) if i not in self.final]
        if missing:
            raise RuntimeError(f"streaming step: trees {missing} were never expanded")
        for led in self.ledgers.values():
            self.pool.ledger.add_engine(led)
            for k, v in led.phase_s.items():  # actors run in parallel: the slowest one's time
                self.pool.ledger.phase_s[k] = max(self.pool.ledger.phase_s.get(k, 0.0), v)
        return [self.final[i] for i in range(len(self.prompts))]

    def _place(self, i: int, ex: Expansion) -> None:
        """Send tree ``i``'s expansion to its KV owner, or to the least-loaded actor when the owner is busy."""
        own = target = self.home[i]
        limit = self.pool.reencode_queue
        if limit >= 0 and self.queue[own] > limit:
            least = min(range(len(self.queue)), key=lambda v: (self.queue[v], v))
            if self.queue[least] < self.queue[own]:
                target = least
        self.home[i] = target
        self.launched[i] = ex
        self.inbox[target].append(i)
        self.queue[target] += ex.leaves

    def _submit(self, w: int) -> None:
        adds = [(i, self.bare[i], self.launched[i]) for i in self.inbox[w]]
        begin, self.begin[w], self.inbox[w] = self.begin[w], None, []
        ref = self.pool.workers[w].stream.remote(self.pool.step, self.pool.seed, begin, adds)
        self.pending[ref] = w

    def _recover(self, w: int) -> None:
        """Actor ``w`` died: a fresh one restarts its unfinished bare rollouts and re-runs its expansions."""
        if self.tries[w] >= self.pool.max_retries:
            raise RuntimeError(
                f"sampler actor {w} died {self.tries[w] + 1} times in one streaming step "
                f"(pools.max_retries={self.pool.max_retries})"
            )
        self.tries[w] += 1
        self.pool.ledger.retried += 1
        self.pool._replace(w)
        redo = sorted(i for i, h in self.home.items() if h == w and i not in self.bare)
        self.begin[w] = (redo, [self.prompts[i] for i in redo], [int(self.counts[i]) for i in redo])
        self.inbox[w] = sorted(i for i in self.launched if self.home[i] == w and i not in self.final)
        self.queue[w] = sum(int(self.counts[i]) for i in redo) + sum(
            self.launched[i].leaves for i in self.inbox[w]
        )
        self.ledgers.pop(w, None)  # the dead actor's counts are lost with it
        self.more[w] = True
