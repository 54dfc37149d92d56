"""Per-token join (``sampler.join``): paths enter and leave one running decode batch between forwards.

In rounds (the default, ``TreeRolloutEngine._round``) every running path generates one turn per round: the round
waits for its longest turn, then for all its tool calls. With ``sampler.join`` the sampler keeps one decode batch
running (the sampler's ``join_batch``; the hf backend's is samplers/hf_join.py): a turn that ends leaves the batch at
once, its tool call runs on a background thread while the other rows decode, and the path's next turn joins the
batch at the next forward; new paths (a tree's expansion, added between ``advance`` calls) join the same way.
Tool calls run as they come, over as many threads as the environment has actors (``EnvPool``), else one.
Turns are applied to the tree by the engine's own ``_turn``, with the same seed keys, limits and ledger counts.

What changes against rounds: nothing in the trees. A path's tokens are the same (its seed key decides them;
batch-mates move its logits by float rounding only); turns end in an order that depends on tool latency, so when a
tree's phase ends (its bare rollouts, or one expansion: no path of it left running) the nodes the phase added are
renumbered in the round driver's creation order (``RolloutTree.reorder``: the path's turn within the phase, then a
path closed for lack of room before one that generated, then path id), as engine/paths.py does.
``budget/decode_steps`` counts forwards (each also prefills the turns that join there) and ``decode_rows`` the
tokens they sampled; the ``tools`` phase sums the calls' seconds (they overlap each other and the decoding).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Any

from tracerl.engine.react import ActionKind
from tracerl.types import Status


class _Tools:
    """Tool calls on background threads while the decode loop goes on, each call as it comes: one thread per
    environment actor of a pooled environment (``EnvPool.actors``: a round's calls run over them in parallel too),
    one for an in-process environment (a round runs its calls one by one there)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.width = max(1, len(getattr(env, "actors", ())))
        self.todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.pending = 0
        self.threads: list[threading.Thread] = []

    def submit(self, item: Any, call: tuple[Any, Any, Any]) -> None:
        if not self.threads:
            self.threads = [
                threading.Thread(target=self._work, name=f"tracerl-join-tools-{k}", daemon=True)
                for k in range(self.width)
            ]
            for t in self.threads:
                t.start()
        self.pending += 1
        self.todo.put((item, call))

    def _work(self) -> None:
        while (job := self.todo.get()) is not None:
            item, call = job
            t0 = time.perf_counter()
            try:
                results: Any = self.env.execute_batch([call])
            except Exception as exc:  # raised again on the decode thread
                results = exc
            self.done.put(([item], results, time.perf_counter() - t0))

    def ready(self, block: bool) -> tuple[list[tuple[Any, Any]], float]:
        """Finished calls ``(item, result)`` and the seconds they took (summed); waits for one if ``block``."""
        out: list[tuple[Any, Any]] = []
        seconds = 0.0
        while self.pending:
            try:
                items, results, s = self.done.get(block=block and not out)
            except queue.Empty:
                break
            if isinstance(results, BaseException):
                raise results
            self.pending -= len(items)
            out += list(zip(items, results))
            seconds += s
        return out, seconds

    def close(self) -> None:
        for _ in self.threads:
            self.todo.put(None)


class JoinRun:
    """One engine's running join: the sampler's batch, the paths in it and those waiting for a tool."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        """A ``TreeRolloutEngine`` (its limits, template, env, ledger, ``seed_key``, ``_turn`` and ``_leaf``)."""
        self.batch = engine.sampler.join_batch(engine.template.stop, engine.limits.temperature)
        self.tools = _Tools(engine.env)
        self.rows: dict[int, Any] = {}
        """Paths whose turn is in the batch, by id."""
        self.queue: list[tuple[Any, int]] = []
        """Paths waiting for room in the batch (``sampler.batch_size``), with their turn's token cap."""
        self.known: set[int] = set()
        """Ids of the paths this run holds (in the batch, queued or at a tool)."""
        self.phases: dict[int, tuple[int, dict[int, tuple[int, int, int]], list[int]]] = {}
        """By tree id, its running phase: the first node id it added, node id -> creation key in rounds, and the
        number of its paths still running (a one-element list)."""
        self.turns: dict[int, int] = {}
        """By path id, the turns it has taken in its phase (its round in the round driver)."""

    def close(self) -> None:
        self.tools.close()

    def advance(self, paths: list[Any]) -> list[Any]:
        """Run ``paths`` (new ones join) until a tree among them has no path left running, or none is left; returns
        the paths that go on."""
        if not (self.batch or self.queue or self.tools.pending):
            e = self.engine  # idle: a fresh batch at the current temperature (evaluation changes it)
            self.batch = e.sampler.join_batch(e.template.stop, e.limits.temperature)
        running = Counter(id(p.tree) for p in paths)
        ended: list[Any] = []
        for p in paths:
            if id(p) not in self.known:
                self.known.add(id(p))
                phase = self.phases.setdefault(id(p.tree), (len(p.tree.nodes), {}, [0]))
                phase[2][0] += 1
                self.turns[id(p)] = 0
                self._next_turn(p, ended)
        while self.batch or self.queue or self.tools.pending:
            per_tree = Counter(id(p.tree) for p in ended)
            if any(running[t] == n for t, n in per_tree.items()):
                break
            self._tick(ended)
        gone = {id(p) for p in ended}
        self.known -= gone
        return [p for p in paths if id(p) not in gone]

    def _next_turn(self, p: Any, ended: list[Any]) -> None:
        """Queue path ``p``'s next turn, or close it when no room is left for one (as a round does)."""
        e = self.engine
        lim = e.limits
        room = min(
            lim.max_turn_tokens, lim.max_episode_tokens - p.generated, lim.max_context_tokens - len(p.context)
        )
        if room <= 0:
            full = lim.max_context_tokens - len(p.context) <= 0
            e._leaf(p, [], [], "", Status.CONTEXT_OVERFLOW if full else Status.MAX_TOKENS, 0.0)
            self._created(p, 0)
            self._end(p, ended)
            return
        self.queue.append((p, room))

    def _fill(self) -> None:
        while self.queue and len(self.batch) < self.engine.batch_size:
            p, room = self.queue.pop(0)
            self.rows[id(p)] = p
            self.batch.add(id(p), p.context, room, self.engine.seed_key(p).value(), p.cache)
            self.engine.ledger.llm_calls += 1

    def _tick(self, ended: list[Any]) -> None:
        """One step of the batch; the turns that ended are parsed, their tool calls sent, the others applied; then
        the finished tool calls' turns are applied."""
        e, led = self.engine, self.engine.ledger
        self._fill()
        if self.batch:
            t0 = time.perf_counter()
            done, sampled = self.batch.step()
            dt = time.perf_counter() - t0
            led.sampler_busy_s += dt
            led.phase_s["generate"] = led.phase_s.get("generate", 0.0) + dt
            led.decode_steps += 1
            led.decode_rows += sampled
        else:
            done = []
        for key, g in done:
            p = self.rows.pop(key)
            led.prefill_tokens_computed += g.prefill_tokens
            led.prefill_tokens_reused += g.reused_tokens
            action = e.template.parse(
                g.text, e.env.tools_for(p.tree.prompt, p.state), truncated=g.finish == "length"
            )
            if action.kind is ActionKind.TOOL:
                self.tools.submit((p, g, action), (p.tree.prompt, p.state, action))
            else:
                self._apply(p, g, action, None, ended)
        results, seconds = self.tools.ready(block=not self.batch and not self.queue and not done)
        led.phase_s["tools"] = led.phase_s.get("tools", 0.0) + seconds
        for (p, g, action), res in results:
            self._apply(p, g, action, res, ended)

    def _apply(self, p: Any, g: Any, action: Any, res: Any, ended: list[Any]) -> None:
        goes = self.engine._turn(p, g, action, res)
        self._created(p, 1)
        self.turns[id(p)] += 1
        if goes:
            self._next_turn(p, ended)
        else:
            self._end(p, ended)

    def _created(self, p: Any, generated: int) -> None:
        """Path ``p`` just added its node ``p.parent``: record where rounds would have created it."""
        self.phases[id(p.tree)][1][p.parent] = (self.turns[id(p)], generated, p.path_id)

    def _end(self, p: Any, ended: list[Any]) -> None:
        """Path ``p`` ended; the last of its tree's phase renumbers the phase's nodes into rounds' order."""
        ended.append(p)
        del self.turns[id(p)]
        start, order, running = self.phases[id(p.tree)]
        running[0] -= 1
        if running[0] == 0:
            del self.phases[id(p.tree)]
            p.tree.reorder(start, sorted(order, key=order.__getitem__))
