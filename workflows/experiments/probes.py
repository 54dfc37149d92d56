"""``tracerl bench testbeds`` (definitions in workflows/experiments/testbeds.py): the measurements that need a model: the
held-out probes of each family with their reference solutions and habit branches, greedy rollouts through the real
engine, and the teacher-forced branch probabilities."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.engine.react import PlainTemplate
from tracerl.workflows.experiments.config import BenchTestbedsConfig
from tracerl.workflows.experiments.testbeds import (
    Probe,
    branch_probability,
    first_wrong_turn,
    is_premature,
    path_contents,
    summarize,
)


def math_probes(n: int, seed: int) -> list[Probe]:
    """The study's held-out math tasks: the reference trace, the direct answer and (two or more calls) the first
    output as a premature answer."""
    from tracerl.envs.math.tasks import generate
    from tracerl.workflows.bootstrap.policy import DIRECT_THOUGHT, LATE_THOUGHT, task_prompt, trace_segments

    t = PlainTemplate()
    out = []
    for task in generate(n, seed=seed, held_out=True):
        late = len(task.steps) >= 2
        out.append(
            Probe(
                task_prompt(task),
                trace_segments(task),
                t.answer_turn(DIRECT_THOUGHT, task.answer),
                1 if late else None,
                t.answer_turn(LATE_THOUGHT, task.steps[0].output) if late else None,
            )
        )
    return out


def search_probes(n: int, seed: int, top_k: int) -> tuple[list[Probe], Any]:
    """The study's held-out questions of the generated world: the reference trace (observations from the real
    retriever), the direct answer and (3 and 4 hops) the penultimate hop's entity as a premature answer."""
    from tracerl.envs.search.env import SearchEnv
    from tracerl.envs.search.index import BM25Retriever
    from tracerl.envs.search.world import build_world, generate
    from tracerl.types import Prompt
    from tracerl.workflows.bootstrap.search import DIRECT_SEARCH_THOUGHT, late_answer, search_trace_segments

    world = build_world(seed)
    env = SearchEnv(BM25Retriever(world.passages), top_k=top_k, reward="em", world_seed=seed)
    t = PlainTemplate()
    out = []
    for q in generate(world, n, held_out=True):
        late = q.level >= 3
        out.append(
            Probe(
                Prompt(q.task_id, q.question, q.answer, source=f"generated-H{q.level}"),
                search_trace_segments(q, env, query_space=True),
                t.answer_turn(DIRECT_SEARCH_THOUGHT, q.answer),
                q.level - 1 if late else None,
                t.answer_turn(*late_answer(q)) if late else None,
            )
        )
    return out, env


def measure(family: str, model_path: str, cfg: BenchTestbedsConfig) -> dict[str, Any]:
    """Per-task greedy rewards, first-wrong turns of the failures, and branch probabilities of one testbed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracerl.config import SamplerConfig
    from tracerl.engine.rollout import TreeRolloutEngine
    from tracerl.samplers.hf import HFSampler

    t0 = time.perf_counter()
    if not (Path(model_path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_path}: no checkpoint there; build it with `tracerl bootstrap --config ...`"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    env: Any
    if family == "math":
        from tracerl.envs.math.env import MathEnv

        probes, env, limits = math_probes(cfg.eval_tasks, cfg.task_seed), MathEnv(), SamplerConfig()
    else:
        from tracerl.workflows.bootstrap.search import SEARCH_LIMITS

        probes, env = search_probes(cfg.eval_tasks, cfg.task_seed, cfg.top_k)
        limits = SEARCH_LIMITS
    engine = TreeRolloutEngine(
        HFSampler(model, tokenizer),
        env,
        PlainTemplate(),
        tokenizer,
        dataclasses.replace(limits, temperature=0.0),
        cfg.task_seed,
    )
    trees = []
    for i in range(0, len(probes), 50):
        chunk = probes[i : i + 50]
        trees += engine.rollout([p.prompt for p in chunk], [1] * len(chunk))

    def score(ids: list[int]) -> list[list[float]]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).tolist()

    rewards, first_wrong, p_direct, p_late, premature = [], [], [], [], 0
    by_level: dict[str, list[float]] = {}
    for probe, tree in zip(probes, trees):
        r = float(tree.rewards()[0])
        rewards.append(r)
        by_level.setdefault(probe.prompt.source.removeprefix("generated-"), []).append(r)
        if r < 1.0:
            turns = path_contents(tree)
            first_wrong.append(first_wrong_turn(turns, probe.observations()))
            premature += is_premature(turns, first_wrong[-1], probe.late_steps)
        ref = [s.text for s in probe.reference]
        p_direct.append(branch_probability(score, tokenizer, ref[:1], probe.direct_turn, ref[1]))
        if probe.late_steps is not None and probe.late_turn is not None:
            k = 1 + 2 * probe.late_steps
            p_late.append(branch_probability(score, tokenizer, ref[:k], probe.late_turn, ref[k]))
    return {
        "rewards": rewards,
        "first_wrong": first_wrong,
        "p_direct": p_direct,
        "p_late": p_late,
        "premature": premature,
        "by_level": {k: sum(v) / len(v) for k, v in sorted(by_level.items())},
        "wall_s": time.perf_counter() - t0,
    }


def run_testbeds_bench(
    cfg: BenchTestbedsConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Measure every selected testbed; writes results.json (and ``json_path``)."""
    results: dict[str, Any] = {}
    for name in cfg.names():
        tb = cfg.testbeds[name]
        progress(f"testbed {name}: {tb['model_path']} ({tb['family']}), {cfg.eval_tasks} held-out tasks")
        per_task = measure(tb["family"], tb["model_path"], cfg)
        results[name] = {
            "family": tb["family"],
            "model_path": tb["model_path"],
            "late": bool(tb.get("late", False)),
            **summarize(
                per_task["rewards"],
                per_task["first_wrong"],
                per_task["p_direct"],
                per_task["p_late"],
                bool(tb.get("late", False)),
                cfg,
                per_task["premature"],
            ),
            "by_level": per_task["by_level"],
            "wall_s": per_task["wall_s"],
        }
    summary = {"eval_tasks": cfg.eval_tasks, "task_seed": cfg.task_seed, "testbeds": results}
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=2)
    (out / "results.json").write_text(text)
    if cfg.json_path:
        Path(cfg.json_path).write_text(text)
    return summary
