"""The embedded default's sampler actors as deployed, timed from inside (``python -m tracerl.workflows.experiments.pipeline_measure
--pool STEPS``): the speeds and overheads of the tiny pipeline profile (conf/bench/pipeline_profiles/tiny_cpu.yaml).

The bench's own pool (conf/bench/pipeline.yaml: 2 hf sampler actors, their environment actors, the frozen policy)
runs barrier steps; every generate call, tool batch and rollout or expand call is timed inside the actors, and each
phase at the driver. ``summarize_pool`` turns one or more such runs into the profile's inputs.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

from tracerl.actors.pools import RolloutPool, RolloutWorker


class TimedWorker(RolloutWorker):
    """A sampler actor that times, inside itself, every generate call (rows, decode iterations, padded input
    tokens, seconds), every round's tool batch (calls, seconds), its grading, and each whole rollout or expand
    call; ``take`` hands the records over and clears them."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.records: dict[str, list[Any]] = {"generate": [], "tools": [], "calls": []}
        generate, batch = self.model.generate, self.env.execute_batch

        def timed_generate(**kw: Any) -> Any:
            t0 = time.perf_counter()
            out = generate(**kw)
            width = kw["input_ids"].shape[1]
            rows, length = out.sequences.shape
            self.records["generate"].append([rows, length - width, rows * width, time.perf_counter() - t0])
            return out

        def timed_batch(calls: Any) -> Any:
            t0 = time.perf_counter()
            res = batch(calls)
            self.records["tools"].append([len(calls), time.perf_counter() - t0])
            return res

        setattr(self.model, "generate", timed_generate)  # noqa: B010 (mypy: no assigning to a method)
        setattr(self.env, "execute_batch", timed_batch)  # noqa: B010

    def _timed(self, what: str, run: Any) -> Any:
        t0 = time.perf_counter()
        trees, led = run()
        self.records["calls"].append(
            {
                "what": what,
                "seconds": time.perf_counter() - t0,
                "generate_s": led.phase_s.get("generate", 0.0),
                "tools_s": led.phase_s.get("tools", 0.0),
                "grade_s": led.phase_s.get("grade", 0.0),
                "path_turns": led.llm_calls,
            }
        )
        return trees, led

    def rollout(self, *a: Any) -> Any:
        return self._timed("rollout", lambda: super(TimedWorker, self).rollout(*a))

    def expand(self, *a: Any) -> Any:
        return self._timed("expand", lambda: super(TimedWorker, self).expand(*a))

    def take(self) -> dict[str, list[Any]]:
        out, self.records = self.records, {"generate": [], "tools": [], "calls": []}
        return out


class TimedPool(RolloutPool):
    """The bench's pool of ``TimedWorker`` actors; each rollout or expand phase timed at the driver, with the
    actors' records of that phase."""

    phases: list[dict[str, Any]]
    worker_class = TimedWorker

    def _phase_timed(self, what: str, run: Any) -> Any:
        import ray

        t0 = time.perf_counter()
        out = run()
        wall = time.perf_counter() - t0
        workers = ray.get([w.take.remote() for w in self.workers])
        self.phases.append({"what": what, "step": self.step, "wall_s": wall, "workers": workers})
        return out

    def rollout(self, prompts: Any, counts: Any) -> Any:
        return self._phase_timed("rollout", lambda: super(TimedPool, self).rollout(prompts, counts))

    def expand(self, trees: Any, expansions: Any) -> None:
        self._phase_timed("expand", lambda: super(TimedPool, self).expand(trees, expansions))


def fit_generate(calls: list[list[float]]) -> dict[str, float | None]:
    """Least squares seconds = prefill tokens / speed + iterations x (a + c rows) over generate calls (the
    profile's decode_step_s is a + c b at b rows)."""
    import numpy as np

    x = np.array([[tok, it, it * b] for b, it, tok, _ in calls])
    y = np.array([c[3] for c in calls])
    per_prefill, a, c = np.linalg.lstsq(x, y, rcond=None)[0]
    pred = x @ np.array([per_prefill, a, c])
    return {
        "prefill_tokens_per_s": float(1 / per_prefill) if per_prefill > 0 else None,
        "decode_s_fixed": float(a),
        "decode_s_per_row": float(c),
        "decode_step_s_1": float(a + c),
        "decode_step_s_32": float(a + 32 * c),
        "r2": float(1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)),
        "calls": len(calls),
    }


def measure_pool(steps: int, seed: int, warmup: int = 1) -> dict[str, Any]:
    """``steps`` barrier steps of the bench's frozen-policy pool (2 hf sampler actors, the embedded default),
    after ``warmup`` unmeasured ones. Per phase: the driver's wall time of the pool call, each actor's time inside
    the call, its generate calls and tool batches. Out of it: the generate-call fit as deployed (two actors
    sharing the cores with the tool sandboxes), the tool batches' latency, the per-path-turn time inside an actor
    that is neither generating nor waiting for tools (parse, encode, grade, tree building: ``turn_overhead_s``),
    and the per-phase time at the driver that no actor spends inside its call (Ray calls, shipping the trees:
    ``phase_overhead_s``)."""
    from tracerl.config_loader import compose, conf_dir
    from tracerl.models.hf import load_policy
    from tracerl.workflows.ops.ray_utils import init_ray
    from tracerl.workflows.pipeline.bench import bench_pool, run_one
    from tracerl.workflows.pipeline.config import BenchPipelineConfig

    cfg = compose(BenchPipelineConfig, conf_dir() / "bench" / "pipeline.yaml", [f"seed={seed}"])
    init_ray(cfg.train.cluster)
    pool = bench_pool(cfg, TimedPool)
    pool.phases = []
    policy = load_policy(cfg.train.model)
    try:
        run_one(cfg, pool, policy, "barrier", seed + 1000, lambda s: None, warmup)
        pool.phases = []
        measured = run_one(cfg, pool, policy, "barrier", seed, lambda s: print(s, file=sys.stderr), steps)
    finally:
        pool.shutdown()
    return {
        "seed": seed,
        "env_workers": cfg.train.pools.env_workers,
        "steps": measured,
        "phases": pool.phases,
    }


def summarize_pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile's inputs from one or more ``measure_pool`` runs (their records pooled)."""
    phases = [ph for r in runs for ph in r["phases"]]
    gens = [g for ph in phases for w in ph["workers"] for g in w["generate"]]
    # A round's tool calls run over the actor's env_workers environment actors: a batch of n calls takes about
    # ceil(n / env_workers) calls' time.
    per_call = [
        s / math.ceil(n / r["env_workers"])
        for r in runs
        for ph in r["phases"]
        for w in ph["workers"]
        for n, s in w["tools"]
    ]
    residual_turn, turns, residual_phase = 0.0, 0, []
    for ph in phases:
        calls = [c for w in ph["workers"] for c in w["calls"]]
        for c in calls:
            residual_turn += c["seconds"] - c["generate_s"] - c["tools_s"]
            turns += c["path_turns"]
        residual_phase.append(ph["wall_s"] - max((c["seconds"] for c in calls), default=0.0))
    q = statistics.quantiles(per_call, n=4) if len(per_call) > 1 else per_call * 3
    return {
        "seeds": [r["seed"] for r in runs],
        "generate_fit": fit_generate(gens),
        "tool_call_s": {
            "median": statistics.median(per_call),
            "q1": q[0],
            "q3": q[2],
            "batches": len(per_call),
        },
        "turn_overhead_s": residual_turn / max(turns, 1),
        "path_turns": turns,
        "grade_s_per_phase": statistics.fmean(
            max((c["grade_s"] for w in ph["workers"] for c in w["calls"]), default=0.0) for ph in phases
        ),
        "phase_overhead_s": {
            "median": statistics.median(residual_phase),
            "mean": statistics.fmean(residual_phase),
            "phases": len(residual_phase),
        },
        "rollout_s_mean": statistics.fmean(s["rollout_s"] for r in runs for s in r["steps"]),
    }
