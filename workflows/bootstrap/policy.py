"""``tracerl bootstrap``: build the built-in tiny policy for the math tasks (or the search family,
``family=search``: traces of the generated multi-hop world, see ``tracerl.workflows.bootstrap.search``).

1. generate training tasks (disjoint from the held-out split) and render their reference solutions
   as plain-template ReAct traces (model turns trainable; prompt and observations masked);
2. train a byte-level BPE tokenizer on them and initialise a small Llama-architecture LM (or load ``init_from``);
3. supervised fine-tuning for a fixed number of steps (``time_budget_s`` optionally caps it), then an optional
   habit phase (answers without the tool, for RL to unlearn);
4. evaluate on held-out generated tasks with the real rollout engine, sandbox and verifier:
   greedy accuracy, sampled pass@1 and the share of well-formed actions;
5. save a standard HF checkpoint directory with ``bootstrap.json`` (config and metrics).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tracerl.config import SamplerConfig
from tracerl.engine.react import PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.math.env import MathEnv
from tracerl.envs.math.tasks import MathTask, generate
from tracerl.models.tiny import (
    Segment,
    build_model,
    build_tokenizer,
    encode_trace,
    supervised_finetune,
)
from tracerl.samplers.hf import HFSampler
from tracerl.types import Prompt, Status
from tracerl.workflows.bootstrap.config import BootstrapConfig
from tracerl.workflows.bootstrap.habit import (
    premature_segments,
    question_answers_directly,
    question_answers_late,
)
from tracerl.workflows.bootstrap.search import search_family
from tracerl.workflows.ops.progress import bar


def trace_segments(task: MathTask) -> list[Segment]:
    """The reference solution as plain-template segments (the prompt and tool outputs are not trainable)."""
    t = PlainTemplate()
    segs = [Segment(t.prompt(task.question, []), False)]
    for step in task.steps:
        # The marker that ends a tool turn is trained (the sampler stops on it); the tool's output is not.
        obs = t.observation(step.output)
        marker = t.stop[0]
        segs.append(Segment(t.tool_turn(step.thought, "python", {"code": step.code}) + marker, True))
        segs.append(Segment(obs[len(marker) :], False))
    segs.append(Segment(t.answer_turn(task.final_thought, task.answer), True))
    return segs


DIRECT_THOUGHT = "I can answer this without Python."


def answers_directly(task: MathTask, fraction: float) -> bool:
    """Whether ``task``'s habit-phase trace answers without the tool (a fixed hash of the question)."""
    return question_answers_directly(task.question, fraction)


LATE_THOUGHT = "The output is the answer."


def answers_late(task: MathTask, fraction: float) -> bool:
    """Whether ``task``'s habit-phase trace answers prematurely: a task of two or more tool calls, chosen for
    ``fraction`` of them by a fixed hash of the question."""
    return len(task.steps) >= 2 and question_answers_late(task.question, fraction)


def habit_segments(task: MathTask, fraction: float, late_fraction: float = 0.0) -> list[Segment]:
    """The habit phase's trace: the reference solution; or (for ``fraction`` of the tasks) a final answer given at
    once, without calling the tool; or (for ``late_fraction`` of the tasks that need two or more calls) the first
    tool call, then its output as the final answer (a premature answer: the -late testbed)."""
    t = PlainTemplate()
    if answers_directly(task, fraction):
        return [
            Segment(t.prompt(task.question, []), False),
            Segment(t.answer_turn(DIRECT_THOUGHT, task.answer), True),
        ]
    if answers_late(task, late_fraction):
        return premature_segments(trace_segments(task), 1, t.answer_turn(LATE_THOUGHT, task.steps[0].output))
    return trace_segments(task)


def habit_finetune(
    model: Any,
    tokenizer: Any,
    traces: list[list[Segment]],
    cfg: BootstrapConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """The habit phase: ``cfg.habit_steps`` supervised steps (peak lr ``cfg.habit_lr``, no time cap) on traces where
    ``cfg.direct_answer_fraction`` of the answers come without the tool. A pretrained LLM often answers from memory
    instead of using its tool; this gives the tiny policy that habit (math: right for small sums, mostly wrong for
    multi-digit products; search: a guessed name, almost always wrong), so RL has a behaviour to unlearn across every
    task, as it does on real models."""
    examples = [encode_trace(tokenizer, segs, cfg.max_positions) for segs in traces]
    return supervised_finetune(
        model,
        examples,
        tokenizer.pad_token_id,
        cfg.habit_steps,
        cfg.batch_size,
        cfg.habit_lr,
        cfg.seed,
        None,
        on_step,
    )


def task_prompt(task: MathTask) -> Prompt:
    return Prompt(
        prompt_id=task.task_id, text=task.question, answer=task.answer, source=f"generated-L{task.level}"
    )


def evaluate(
    model: Any, tokenizer: Any, tasks: list[MathTask], temperature: float, seed: int
) -> dict[str, Any]:
    """One rollout per math task through the real engine (see :func:`evaluate_prompts`)."""
    return evaluate_prompts(model, tokenizer, [task_prompt(t) for t in tasks], MathEnv(), temperature, seed)


def evaluate_prompts(
    model: Any,
    tokenizer: Any,
    prompts: list[Prompt],
    env: Any,
    temperature: float,
    seed: int,
    limits: SamplerConfig | None = None,
) -> dict[str, Any]:
    """One rollout per prompt through the real engine: accuracy overall and per category (``Prompt.source``,
    the level), action well-formedness, and the mean of each answer score the environment reports (em, f1)."""
    limits = replace(limits or SamplerConfig(), temperature=temperature)
    engine = TreeRolloutEngine(
        HFSampler(model, tokenizer), env, PlainTemplate(), tokenizer, limits, seed, step=None
    )  # evaluation keys: no step
    trees = []
    for i in range(0, len(prompts), 50):
        trees += engine.rollout(prompts[i : i + 50], [1] * len(prompts[i : i + 50]))
    rewards = [t.rewards()[0] for t in trees]
    turns = engine.ledger.llm_calls
    by_level: dict[str, list[float]] = {}
    for p, r in zip(prompts, rewards):
        by_level.setdefault(p.source.removeprefix("generated-"), []).append(r)
    statuses: dict[str, int] = {}
    scores: dict[str, list[float]] = {}
    for t in trees:
        leaf = t.leaves()[0]
        statuses[leaf.status.value] = statuses.get(leaf.status.value, 0) + 1
        for k, v in leaf.scores.items():
            scores.setdefault(k, []).append(v)
    out = {
        "accuracy": sum(rewards) / len(rewards),
        "by_level": {k: sum(v) / len(v) for k, v in sorted(by_level.items())},
        "well_formed_turns": 1 - engine.ledger.invalid_actions / max(turns, 1),
        "turns": turns,
        "tool_calls": engine.ledger.tool_calls,
        "statuses": statuses,
        "answered": statuses.get(Status.ANSWERED.value, 0) / len(trees),
    }
    out.update({k: sum(v) / len(trees) for k, v in scores.items()})  # unanswered episodes score 0
    return out


def _family_data(cfg: BootstrapConfig, progress: Callable[[str], None]) -> tuple[Any, Any, Any, Any, Any]:
    """The family's supervised traces, habit traces, held-out prompts, environment and episode limits."""
    if cfg.family == "search":
        segments, habit_traces, eval_prompts, env, limits = search_family(cfg)
        progress(f"search family: {len(segments)} traces of the generated world (seed {cfg.seed})")
        return segments, habit_traces, eval_prompts, env, limits
    train = generate(cfg.train_tasks, seed=cfg.seed, held_out=False)
    held = generate(cfg.eval_tasks, seed=cfg.seed + 1, held_out=True)
    assert not {t.question for t in train} & {t.question for t in held}
    segments = [trace_segments(t) for t in train]
    habit_traces = (
        [habit_segments(t, cfg.direct_answer_fraction, cfg.late_answer_fraction) for t in train]
        if cfg.habit_steps > 0
        else []
    )
    return segments, habit_traces, [task_prompt(t) for t in held], MathEnv(), SamplerConfig()


def _start_model(
    cfg: BootstrapConfig,
    segments: Any,
    progress: Callable[[str], None],
    on_step: Callable[[int, float], None],
) -> tuple[Any, Any, int, list[float]]:
    """The model to start from: ``init_from`` as it is, or a new tiny one after its supervised phase; with its
    tokenizer, parameter count and the supervised losses."""
    if cfg.init_from:
        # slow to import: transformers' auto classes (loaded only to start from init_from)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.init_from)
        model = AutoModelForCausalLM.from_pretrained(cfg.init_from)
        n_params = sum(p.numel() for p in model.parameters())
        progress(f"starting from {cfg.init_from} ({n_params / 1e6:.2f} M parameters); no supervised phase")
        return model, tokenizer, n_params, []
    tokenizer = build_tokenizer(["".join(s.text for s in segs) for segs in segments], cfg.vocab_size)
    model = build_model(tokenizer, cfg)
    examples = [encode_trace(tokenizer, segs, cfg.max_positions) for segs in segments]
    n_params = sum(p.numel() for p in model.parameters())
    progress(
        f"tiny policy: {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}, {len(examples)} traces"
    )
    losses = supervised_finetune(
        model,
        examples,
        tokenizer.pad_token_id,
        cfg.steps,
        cfg.batch_size,
        cfg.lr,
        cfg.seed,
        cfg.time_budget_s,
        on_step,
    )
    return model, tokenizer, n_params, losses


def bootstrap(cfg: BootstrapConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Build, train, evaluate and save the tiny policy; returns the metrics written to bootstrap.json."""
    out = Path(cfg.out_dir)
    if (out / "bootstrap.json").is_file() and not cfg.force:
        progress(f"{out} already holds a tiny policy (force=true rebuilds it)")
        return dict(json.loads((out / "bootstrap.json").read_text()))
    t0, c0 = time.perf_counter(), time.process_time()
    torch.manual_seed(cfg.seed)
    segments, habit_traces, eval_prompts, env, limits = _family_data(cfg, progress)
    steps_bar = bar(progress, (0 if cfg.init_from else cfg.steps) + cfg.habit_steps, "bootstrap", "step")

    def on_step(step: int, loss: float) -> None:
        steps_bar.update()
        if step % 100 == 0:
            progress(
                f"  sft step {step:5d}  loss {loss:.4f}  ({time.perf_counter() - t0:.0f} s, "
                f"{time.process_time() - c0:.0f} CPU s)"
            )

    model, tokenizer, n_params, losses = _start_model(cfg, segments, progress, on_step)
    habit: list[float] = []
    if cfg.habit_steps > 0:
        progress(
            f"habit phase: {cfg.habit_steps} steps on traces where {cfg.direct_answer_fraction:.0%} of the "
            f"answers come without the tool and {cfg.late_answer_fraction:.0%} of the multi-step ones prematurely"
        )
        habit = habit_finetune(model, tokenizer, habit_traces, cfg, on_step)
        losses = losses + habit
    steps_bar.close()
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    progress(
        f"trained {len(losses)} steps in {train_s:.0f} s, final loss {losses[-1]:.4f}; "
        f"evaluating on {len(eval_prompts)} held-out tasks"
    )
    cut = not cfg.init_from and len(losses) - len(habit) < cfg.steps
    if cut:
        progress(
            f"warning: time_budget_s={cfg.time_budget_s:g} ran out after {len(losses)} of {cfg.steps} steps; "
            "the checkpoint depends on this machine's speed (raise time_budget_s for a reproducible one)"
        )
    greedy = evaluate_prompts(model, tokenizer, eval_prompts, env, 0.0, cfg.seed, limits)
    sampled = evaluate_prompts(model, tokenizer, eval_prompts, env, cfg.eval_temperature, cfg.seed, limits)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics = {
        "config": dataclasses.asdict(cfg),
        "parameters": n_params,
        "train_steps": len(losses),
        "final_loss": losses[-1],
        "stopped_by_time_budget": cut,
        "habit_steps": len(habit),
        "train_s": train_s,
        "total_s": time.perf_counter() - t0,
        "eval_tasks": len(eval_prompts),
        "train_cpu_s": train_cpu_s,
        "total_cpu_s": time.process_time() - c0,
        "greedy": greedy,
        "sampled": sampled,
    }
    (out / "bootstrap.json").write_text(json.dumps(metrics, indent=2))
    return metrics
