"""Measures the speeds the tiny profile (conf/bench/pipeline_profiles/tiny_cpu.yaml) is built from, on this
machine: ``python -m tracerl.workflows.experiments.pipeline_measure [--trees DIR]``.

- decode: ``HFSampler.generate`` on the tiny policy (the sampler the rollouts use: Gumbel rows, log-probs, KV
  handles), at each batch size, for two lengths with no stop; seconds per decode iteration = the difference of the
  two times over the difference of the lengths, the rest of the shorter call is the call's fixed cost and prefill.
- prefill: one-token generate calls on contexts of two lengths; tokens per second from the difference.
- tool: the math environment's sandboxed Python tool on one cell, ``--tool-calls`` times (median, quartiles).
- engine (``--engine``): the rollout engine itself (``TreeRolloutEngine``, the embedded default's model, sampler
  and math environment, in process) on real tasks, every generate call timed with its rows, decode iterations
  and padded prefill, every tool call timed; a least-squares fit of
  seconds = overhead + prefill tokens / speed + iterations x (a + c rows) over the calls.
- pool (``--pool STEPS``): the bench's sampler actors as deployed (conf/bench/pipeline.yaml: 2 hf actors, their
  environment actors, the frozen policy, barrier steps of a seed the bench does not use), every generate call,
  tool batch and rollout or expand call timed inside the actors, each phase at the driver: the generate fit as
  deployed, the per-path-turn time an actor spends outside generate and tool calls, and the per-phase time at the
  driver outside the actors' calls (``phase_overhead_s``).
- ``--trees DIR``: turns per bare rollout, tokens per turn, observation tokens and bare rollouts per prompt from
  the ``trees.jsonl`` files under DIR (a ``tracerl train`` run's logged trees, or ``tracerl rollout``'s output).

Prints one JSON object; the profile's comments say which run gave which number.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.actors.pools import balanced_shards
from tracerl.workflows.experiments.pipeline_pool import measure_pool, summarize_pool

MODEL = "models/tiny-math-habit"


def _timed_generate(sampler: Any, contexts: list[list[int]], new_tokens: int, reps: int) -> float:
    best = float("inf")
    for r in range(reps):
        t0 = time.perf_counter()
        sampler.generate(contexts, new_tokens, [], 1.0, seeds=[1000 * r + i for i in range(len(contexts))])
        best = min(best, time.perf_counter() - t0)
    return best


def measure_speeds(batches: list[int], short: int, long: int, reps: int) -> dict[str, Any]:
    """Seconds per decode iteration per batch size, each call's fixed cost, and prefill tokens per second."""
    import torch

    from tracerl.config import ModelConfig
    from tracerl.models.hf import load_policy
    from tracerl.samplers.hf import HFSampler

    torch.set_num_threads(1)  # as a sampler actor (pools.rollout_cpus 0.5)
    tok, model = load_policy(ModelConfig(path=MODEL))

    class NoEos:  # the tokenizer without EOS, so every row runs to the length asked
        def __init__(self, inner: Any) -> None:
            self.inner, self.pad_token_id, self.eos_token_id = inner, inner.pad_token_id, None

        def decode(self, ids: list[int], **kw: Any) -> str:
            return str(self.inner.decode(ids, **kw))

    sampler = HFSampler(model, NoEos(tok), reuse_prefix=True)
    prompt = list(tok("Question: What is 36 * 54?\nThought:", add_special_tokens=False)["input_ids"])
    ctx = (prompt * 20)[:120]  # a bare rollout's first turn encodes about 120 tokens (template and question)
    decode, fixed = {}, {}
    for b in batches:
        t_short = _timed_generate(sampler, [ctx] * b, short, reps)
        t_long = _timed_generate(sampler, [ctx] * b, long, reps)
        decode[b] = (t_long - t_short) / (long - short)
        fixed[b] = t_short - short * decode[b]
    t1 = _timed_generate(sampler, [ctx[:20]] * 8, 1, reps)
    t2 = _timed_generate(sampler, [(ctx * 4)[:400]] * 8, 1, reps)
    return {
        "decode_step_s": decode,
        "call_fixed_s": fixed,
        "prefill_tokens_per_s": 8 * (400 - 20) / max(t2 - t1, 1e-9),
    }


def measure_tool(calls: int) -> dict[str, float]:
    """The math environment's Python tool, one sandboxed process per call."""
    from tracerl.engine.react import Action, ActionKind
    from tracerl.envs.math.env import MathEnv
    from tracerl.types import Prompt

    env = MathEnv()  # the default sandbox, as env=math configures it
    prompt = Prompt("p0", "What is 36 * 54?", "1944")
    action = Action(ActionKind.TOOL, "", tool="python", arguments={"code": "print(36 * 54)"})
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        env.execute(prompt, env.initial_state(prompt), action)
        lat.append(time.perf_counter() - t0)
    q = statistics.quantiles(lat, n=4)
    return {"median_s": statistics.median(lat), "q1_s": q[0], "q3_s": q[2], "calls": calls}


def measure_engine(prompts: list[int], per_prompt: int, seed: int = 0) -> dict[str, Any]:
    """Bare rollouts of ``n`` tasks (each of ``prompts``) with the real engine; per-call timings and the fit."""
    import numpy as np

    from tracerl.config import RolloutConfig
    from tracerl.config_loader import compose, conf_dir
    from tracerl.workflows.lm.stack import build_stack, task_prompts

    cfg = compose(RolloutConfig, conf_dir() / "rollout" / "math.yaml", ["model=tiny_habit", f"seed={seed}"])
    stack = build_stack(cfg.model, cfg.sampler, cfg.env, cfg.seed)
    model, env = stack.model, stack.env  # the sampler generates with this module (HFSampler keeps it)
    calls: list[tuple[int, int, int, float]] = []  # rows, decode iterations, padded input tokens, seconds
    tools: list[float] = []
    generate, execute = model.generate, env.execute

    def timed_generate(**kw: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(**kw)
        width = kw["input_ids"].shape[1]
        calls.append(
            (
                out.sequences.shape[0],
                out.sequences.shape[1] - width,
                out.sequences.shape[0] * width,
                time.perf_counter() - t0,
            )
        )
        return out

    def timed_execute(*a: Any) -> Any:
        t0 = time.perf_counter()
        res = execute(*a)
        tools.append(time.perf_counter() - t0)
        return res

    model.generate, env.execute = timed_generate, timed_execute
    tasks = task_prompts(cfg.env)
    start = 0
    for n in prompts:
        stack.engine.step = start
        stack.engine.rollout(tasks[start : start + n], [per_prompt] * n)
        start += n
    x = np.array([[1.0, tok, it, it * b] for b, it, tok, _ in calls])
    y = np.array([c[3] for c in calls])
    overhead, per_prefill, a, c = np.linalg.lstsq(x, y, rcond=None)[0]
    q = statistics.quantiles(tools, n=4) if len(tools) > 1 else tools * 3
    return {
        "calls": [list(map(float, c)) for c in calls],
        "fit": {
            "call_overhead_s": overhead,
            "prefill_tokens_per_s": 1 / per_prefill if per_prefill > 0 else None,
            "decode_s_fixed": a,
            "decode_s_per_row": c,
        },
        "tool": {
            "median_s": statistics.median(tools) if tools else None,
            "q1_s": q[0],
            "q3_s": q[2],
            "calls": len(tools),
        },
    }


def summarize_trees(root: Path) -> dict[str, Any]:
    """Turns of each bare rollout, model tokens of each turn (all, those that end in a tool call or another
    observation, and each path's last), observation tokens and bare rollouts per prompt from the ``trees.jsonl``
    files under ``root``; token distributions as their 2.5th, 7.5th, ..., 97.5th percentiles."""
    turns: collections.Counter[int] = collections.Counter()
    tokens, tool_turns, final_turns, obs, bare = [], [], [], [], []
    for f in sorted(root.rglob("trees.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            bare.append(r["bare_rollouts"])
            per_path: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
            for n in r["nodes"][1:]:
                per_path[n["path"]].append(n)
                tokens.append(n["model_tokens"])
                if n["tokens"] > n["model_tokens"]:
                    obs.append(n["tokens"] - n["model_tokens"])
            for pid, nodes in per_path.items():
                tool_turns += [n["model_tokens"] for n in nodes[:-1]]
                final_turns.append(nodes[-1]["model_tokens"])
                if pid < r["bare_rollouts"] and nodes[0]["depth"] == 1:
                    turns[len(nodes)] += 1

    def twentieths(xs: list[int]) -> list[int]:
        return [int(round(q)) for q in np.percentile(xs, np.arange(2.5, 100, 5))] if xs else []

    return {
        "bare_turns": dict(sorted(turns.items())),
        "turn_tokens": twentieths(tokens),
        "tool_turn_tokens": twentieths(tool_turns),
        "final_turn_tokens": twentieths(final_turns),
        "turn_tokens_mean": statistics.mean(tokens) if tokens else None,
        "obs_tokens_mean": statistics.mean(obs) if obs else None,
        "bare_per_prompt": dict(sorted(collections.Counter(bare).items())),
    }


def record_steps(root: Path, samplers: int) -> dict[str, Any]:
    """The work each sampler actor did in each step whose ``trees.jsonl`` is under ``root`` (one file a step), for
    a profile's ``recorded_steps``: the step's trees split over ``samplers`` actors as the pool splits them
    (``balanced_shards`` of their bare rollouts), and per share its bare-like episodes (from the root: the bare
    rollouts and the expansion's extra ones; the extra ones run with the continuations) and continuations, each
    as [tree index in the share, context tokens before its first turn less the prompt, model tokens per turn]."""
    steps = []
    for f in sorted(root.rglob("trees.jsonl")):
        trees = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        shares = []
        for shard in balanced_shards([t["bare_rollouts"] for t in trees], samplers):
            share: dict[str, list[Any]] = {"bare": [], "cont": []}
            for k, i in enumerate(shard):
                t = trees[i]
                nodes = {n["id"]: n for n in t["nodes"]}
                per_path: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
                for n in t["nodes"][1:]:
                    per_path[n["path"]].append(n)
                for pid, path in sorted(per_path.items()):
                    start, up = 0, nodes[path[0]["parent"]]
                    while up["depth"] > 0:  # the prefix this path continues
                        start += up["tokens"]
                        up = nodes[up["parent"]]
                    bare = pid < t["bare_rollouts"] and path[0]["depth"] == 1
                    share["bare" if bare else "cont"].append([k, start, [n["model_tokens"] for n in path]])
            shares.append(share)
        steps.append(shares)
    return {"source": str(root), "samplers": samplers, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tracerl.workflows.experiments.pipeline_measure", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per point (the fastest is kept)")
    ap.add_argument("--tool-calls", type=int, default=10)
    ap.add_argument("--trees", help="a directory holding trees.jsonl files to summarize (alone: only that)")
    ap.add_argument("--engine", default="", help="tasks per engine rollout, comma-separated (e.g. 1,2,4,8)")
    ap.add_argument(
        "--pool", type=int, default=0, help="measured barrier steps of the bench's sampler actors"
    )
    ap.add_argument("--seed", type=int, default=10, help="--pool: the steps' seed (not the bench's 0, 1, 2)")
    ap.add_argument("--out", help="--pool: write the run's records here (JSON), for --summarize")
    ap.add_argument("--summarize", nargs="*", default=[], help="--out files of earlier --pool runs to pool")
    ap.add_argument(
        "--record-steps", help="a directory of trees.jsonl files (one a step): write --out for a profile"
    )
    ap.add_argument("--samplers", type=int, default=2, help="--record-steps: sampler actors of those steps")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    if args.record_steps:
        if not args.out:
            ap.error("--record-steps needs --out PATH")
        rec = record_steps(Path(args.record_steps), args.samplers)
        Path(args.out).write_text(json.dumps(rec, separators=(",", ":")) + "\n")
        print(f"{len(rec['steps'])} steps of {args.samplers} samplers -> {args.out}")
        return 0
    if args.pool or args.summarize:
        runs = [json.loads(Path(f).read_text()) for f in args.summarize]
        if args.pool:
            runs.append(measure_pool(args.pool, args.seed))
            if args.out:  # every record, before anything is summarized
                Path(args.out).write_text(json.dumps(runs[-1], indent=2))
        out["pool"] = summarize_pool(runs)
    elif args.engine:
        out["engine"] = measure_engine([int(n) for n in args.engine.split(",")], per_prompt=3)
    elif not args.trees:
        out.update(measure_speeds([int(b) for b in args.batches.split(",")], 8, 40, args.reps))
        out["tool"] = measure_tool(args.tool_calls)
    if args.trees:
        out["trees"] = summarize_trees(Path(args.trees))
    print(json.dumps(out, indent=2))  # the command's own output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
