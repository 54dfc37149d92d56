"""The per-path async driver of a streaming step: every running path is its own task (samplers with ``agenerate``).

The round driver (engine/stream.py's ``StreamRun``) advances all running paths one turn per round, so a path whose
turn ended early waits for the round's slowest turn. Here each path runs on the sampler's event loop
(``tracerl.engine.aio``): its next turn is submitted as soon as its own previous turn and tool call are done, and
a tree's continuations as soon as the step driver hands its expansion back; with vLLM's async engine they join the
running batch per token. Tool calls and grading run off the loop, on a thread pool.

The trees are the round driver's: every turn is seeded by (seed, step, prompt, path, turn) as there, and the nodes
a path adds in a tree's phase (its bare rollouts, or one expansion) are renumbered in the round driver's creation
order when the phase ends (``RolloutTree.reorder``: round, then a path closed for lack of room before one that
generated, then path id), before the tree is reported. ``AsyncStreamRun`` has ``StreamRun``'s interface
(``serve``); ``stream_in_process_async`` is ``stream_in_process`` on it.

Counts (docs/metrics.md): ``sampler_busy_s`` and the ``generate``, ``tools`` and ``grade`` phases are the wall time
during which at least one request (tool call, grade) of the run was in flight, not a sum over paths. A sampler
whose engine reports its iterations (``decode_counts``: vLLM) gives ``decode_steps`` and ``decode_rows``; otherwise
every request counts as decoding alone (one row per step).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tracerl.algos.allocators import Expansion
from tracerl.engine import aio
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.react import ActionKind
from tracerl.engine.stream import EngineShare, OnBare, Served, StreamRun
from tracerl.tree import RolloutTree
from tracerl.types import Prompt

TOOL_THREADS = 16
"""Worker threads for tool calls and grading (calls beyond this wait for a free thread)."""


class _Busy:
    """Wall time during which at least one of something was running (the union of their intervals)."""

    def __init__(self) -> None:
        self.n, self.since, self.total = 0, 0.0, 0.0

    def __enter__(self) -> None:
        if self.n == 0:
            self.since = time.perf_counter()
        self.n += 1

    def __exit__(self, *exc: object) -> None:
        self.n -= 1
        if self.n == 0:
            self.total += time.perf_counter() - self.since

    def take(self) -> float:
        """Seconds since the last ``take`` (up to now, if something is running)."""
        if self.n:
            now = time.perf_counter()
            self.total += now - self.since
            self.since = now
        out, self.total = self.total, 0.0
        return out


class AsyncStreamRun(EngineShare):
    """One engine's share of a streaming step, one task per path; the interface of ``StreamRun``. Runs on the
    background loop: ``serve`` is called from another thread (the sampler actor's), ``aserve`` on the loop. The
    engine's sampler has ``agenerate`` (``tracerl.engine.aio.AsyncSampler``)."""

    def __init__(
        self, engine: Any, ids: Sequence[int], prompts: Sequence[Prompt], counts: Sequence[int]
    ) -> None:
        super().__init__(engine)
        self.running: dict[int, int] = {}
        """Paths running per tree (in its current phase)."""
        self._order: dict[int, dict[int, tuple[int, int, int]]] = {}
        """Per tree: each node of the current phase -> its round driver creation key."""
        self._start: dict[int, int] = {}
        self._reports: list[tuple[str, int]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._live = 0
        """Path tasks that have not ended (``_tasks`` loses a task only in a callback after it ended)."""
        self._wake: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._pool = ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="tracerl-tools")
        self._busy = {k: _Busy() for k in ("generate", "tools", "grade")}
        self._decode = _decode_counts(engine.sampler)
        self._begin: tuple[Sequence[int], Sequence[Prompt], Sequence[int]] | None = (ids, prompts, counts)

    def serve(self, adds: Sequence[tuple[int, RolloutTree, Expansion]]) -> Served:
        """Start ``adds`` and wait until a tree is reported or nothing runs (``StreamRun.serve``)."""
        return aio.run(self.aserve(adds))

    async def aserve(self, adds: Sequence[tuple[int, RolloutTree, Expansion]]) -> Served:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._begin is not None:
            (ids, prompts, counts), self._begin = self._begin, None
            self.add_bare(ids, prompts, counts)
        for i, tree, ex in adds:
            self.add_expansion(i, tree, ex)
        while not self._reports and self._error is None and self._live:
            self._wake.clear()
            await self._wake.wait()
        if self._error is not None:
            raise self._error
        reports, self._reports = self._reports, []
        return Served(
            [i for k, i in reports if k == "bare"],
            [i for k, i in reports if k == "done"],
            sum(self.running.values()),
            self.active,
            self._ledger(),
        )

    @property
    def active(self) -> bool:
        """Paths still run, or a tree waits to be reported."""
        return self._live > 0 or bool(self._reports)

    def run_paths(self, i: int, paths: list[Any]) -> None:
        """A task for each of ``paths`` (on the running loop: ``add_bare`` and ``add_expansion`` are called there)."""
        self._start[i], self._order[i], self.running[i] = len(self.trees[i].nodes), {}, len(paths)
        if not paths:
            self._settle(i)
        self._live += len(paths)
        for p in paths:
            task = asyncio.get_running_loop().create_task(self._path(i, p))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _path(self, i: int, p: Any) -> None:
        """Path ``p`` of tree ``i``, turn after turn, until it ends (the round driver's ``_round`` for one path)."""
        eng, order, loop = self.engine, self._order[i], asyncio.get_running_loop()
        r = 0
        try:
            while True:
                cap = eng.turn_budget(p)
                if cap <= 0:
                    eng.close(p)
                    order[p.parent] = (r, 0, p.path_id)
                    break
                g = await self._generate(p, cap)
                action = eng.parse(p, g)
                res = answered = None
                if action.kind is ActionKind.TOOL:
                    call = [(p.tree.prompt, p.state, action)]
                    with self._busy["tools"]:
                        (res,) = await loop.run_in_executor(self._pool, eng.env.execute_batch, call)
                elif action.kind is ActionKind.ANSWER:
                    with self._busy["grade"]:
                        answered = await loop.run_in_executor(self._pool, eng.grade, p, action)
                    eng.ledger.grade_timeouts += int(answered[1] is not None and answered[1].timed_out)
                goes = eng._turn(p, g, action, res, answered)
                order[p.parent] = (r, 1, p.path_id)
                r += 1
                if not goes:
                    break
        except Exception as e:  # noqa: BLE001 - raised in the caller's thread by aserve
            self._error = self._error or e
        else:
            self.running[i] -= 1
            if self.running[i] == 0:
                self._settle(i)
        finally:
            self._live -= 1
            assert self._wake is not None
            self._wake.set()

    async def _generate(self, p: Any, cap: int) -> Any:
        eng, led = self.engine, self.engine.ledger
        with self._busy["generate"]:
            g = await eng.sampler.agenerate(
                p.context, cap, eng.template.stop, eng.limits.temperature, eng.seed_key(p).value(), p.cache
            )
        led.llm_calls += 1
        led.prefill_tokens_computed += g.prefill_tokens
        led.prefill_tokens_reused += g.reused_tokens
        if self._decode is None:  # the engine does not report its iterations: the request decoded alone
            led.decode_steps += len(g.token_ids)
            led.decode_rows += len(g.token_ids)
        return g

    def _settle(self, i: int) -> None:
        """Tree ``i``'s phase ended: its nodes in the round driver's order, then reported."""
        order = self._order.pop(i)
        self.trees[i].reorder(self._start[i], sorted(order, key=order.__getitem__))
        self._reports.append(("bare" if self.stage[i] == "bare" else "done", i))
        self.stage[i] = "wait" if self.stage[i] == "bare" else "done"

    def _ledger(self) -> BudgetLedger:
        """A copy of the engine's counts so far (the loop goes on changing the engine's own)."""
        led = self.engine.ledger
        for k, b in self._busy.items():
            s = b.take()
            led.phase_s[k] = led.phase_s.get(k, 0.0) + s
            led.sampler_busy_s += s if k == "generate" else 0.0
        if self._decode is not None:
            steps, rows = _decode_counts(self.engine.sampler) or (0, 0)
            led.decode_steps += steps - self._decode[0]
            led.decode_rows += rows - self._decode[1]
            self._decode = (steps, rows)
        return copy.deepcopy(led)

    def close(self) -> None:
        """Stop the run's tasks (a new step or new weights replace it) and its tool threads."""
        for t in list(self._tasks):
            aio.loop().call_soon_threadsafe(t.cancel)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _decode_counts(sampler: Any) -> tuple[int, int] | None:
    counts = getattr(sampler, "decode_counts", None)
    return None if counts is None else counts()


async def _stream(
    engine: Any, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare
) -> list[RolloutTree]:
    run = AsyncStreamRun(engine, range(len(prompts)), prompts, counts)
    loop = asyncio.get_running_loop()
    adds: list[tuple[int, RolloutTree, Expansion]] = []
    try:
        while True:
            served = await run.aserve(adds)
            adds = []
            if served.bare:  # Stage 2 off the loop: the paths of other trees go on meanwhile
                trees = [run.trees[i] for i in served.bare]
                launch = await loop.run_in_executor(None, on_bare, served.bare, trees)
                adds = [(i, run.trees[i], ex) for i, ex in launch]
            if not served.active and not adds:
                break
    finally:
        run.close()
    waiting = sorted(i for i, s in run.stage.items() if s != "done")
    if waiting:
        raise RuntimeError(f"streaming step: no expansion was decided for trees {waiting}")
    run._ledger()  # the last busy time into the engine's counts
    return [run.trees[i] for i in range(len(prompts))]


def stream_in_process_async(
    engine: Any, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare
) -> list[RolloutTree]:
    """A streaming step on one in-process engine whose sampler has ``agenerate``; the trees in ``prompts`` order."""
    return aio.run(_stream(engine, prompts, counts, on_bare))


def drives_per_path(engine: Any) -> bool:
    """Whether ``engine`` streams per path: its sampler offers ``agenerate`` and ``sampler.per_path`` is on; else
    the round driver runs."""
    return bool(engine.limits.per_path) and isinstance(engine.sampler, aio.AsyncSampler)


def stream_run(
    engine: Any, ids: Sequence[int], prompts: Sequence[Prompt], counts: Sequence[int]
) -> StreamRun | AsyncStreamRun:
    """An engine's share of a streaming step: per path where its sampler has ``agenerate``, else in rounds."""
    cls = AsyncStreamRun if drives_per_path(engine) else StreamRun
    return cls(engine, ids, prompts, counts)
