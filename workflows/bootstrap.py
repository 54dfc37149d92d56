"""``tracerl bootstrap``: build the built-in tiny policy for the math tasks.

1. generate training tasks (disjoint from the held-out split) and render their reference solutions
   as plain-template ReAct traces (model turns trainable; prompt and observations masked);
2. train a byte-level BPE tokenizer on them and initialise a small Llama-architecture LM;
3. supervised fine-tuning within a time budget;
4. evaluate on held-out generated tasks with the real rollout engine, sandbox and verifier:
   greedy accuracy, sampled pass@1 and the share of well-formed actions;
5. save a standard HF checkpoint directory with ``bootstrap.json`` (config and metrics).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.math.env import MathEnv
from envs.math.tasks import MathTask, generate
from tracerl.config import BootstrapConfig, SamplerConfig
from tracerl.engine.react import PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.models.tiny import (
    Segment,
    build_model,
    build_tokenizer,
    encode_trace,
    supervised_finetune,
)
from tracerl.samplers.hf import HFSampler
from tracerl.types import Prompt, Status


def trace_segments(task: MathTask) -> list[Segment]:
    """The reference solution as plain-template segments (the prompt and tool outputs are not trainable)."""
    t = PlainTemplate()
    segs = [Segment(t.prompt(task.question, []), False)]
    for step in task.steps:
        # The marker that ends a tool turn is trained (the sampler stops on it); the tool's output is not.
        obs = t.observation(step.output)
        marker = t.stop[0]
        segs.append(Segment(t.tool_turn(step.thought, "python", step.code) + marker, True))
        segs.append(Segment(obs[len(marker):], False))
    segs.append(Segment(t.answer_turn(task.final_thought, task.answer), True))
    return segs


def task_prompt(task: MathTask) -> Prompt:
    return Prompt(prompt_id=task.task_id, text=task.question, answer=task.answer, source=f"generated-L{task.level}")


def evaluate(model: Any, tokenizer: Any, tasks: list[MathTask], temperature: float, seed: int) -> dict[str, Any]:
    """One rollout per task through the real engine: accuracy overall and per level, action well-formedness."""
    engine = TreeRolloutEngine(HFSampler(model, tokenizer), MathEnv(), PlainTemplate(), tokenizer, SamplerConfig(temperature=temperature), seed)
    prompts = [task_prompt(t) for t in tasks]
    trees = []
    for i in range(0, len(prompts), 50):
        trees += engine.rollout(prompts[i:i + 50], [1] * len(prompts[i:i + 50]))
    rewards = [t.rewards()[0] for t in trees]
    turns = engine.ledger.llm_calls
    by_level: dict[str, list[float]] = {}
    for task, r in zip(tasks, rewards):
        by_level.setdefault(f"L{task.level}", []).append(r)
    statuses: dict[str, int] = {}
    for t in trees:
        s = t.leaves()[0].status.value
        statuses[s] = statuses.get(s, 0) + 1
    return {
        "accuracy": sum(rewards) / len(rewards),
        "by_level": {k: sum(v) / len(v) for k, v in sorted(by_level.items())},
        "well_formed_turns": 1 - engine.ledger.invalid_actions / max(turns, 1),
        "turns": turns,
        "tool_calls": engine.ledger.tool_calls,
        "statuses": statuses,
        "answered": statuses.get(Status.ANSWERED.value, 0) / len(trees),
    }


def bootstrap(cfg: BootstrapConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Build, train, evaluate and save the tiny policy; returns the metrics written to bootstrap.json."""
    import torch

    out = Path(cfg.out_dir)
    if (out / "bootstrap.json").is_file() and not cfg.force:
        progress(f"{out} already holds a tiny policy (force=true rebuilds it)")
        return dict(json.loads((out / "bootstrap.json").read_text()))
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    train = generate(cfg.train_tasks, seed=cfg.seed, held_out=False)
    held = generate(cfg.eval_tasks, seed=cfg.seed + 1, held_out=True)
    assert not {t.question for t in train} & {t.question for t in held}
    segments = [trace_segments(t) for t in train]
    tokenizer = build_tokenizer(["".join(s.text for s in segs) for segs in segments], cfg.vocab_size)
    model = build_model(tokenizer, cfg)
    examples = [encode_trace(tokenizer, segs, cfg.max_positions) for segs in segments]
    n_params = sum(p.numel() for p in model.parameters())
    progress(f"tiny policy: {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}, {len(examples)} traces")

    def on_step(step: int, loss: float) -> None:
        if step % 100 == 0:
            progress(f"  sft step {step:5d}  loss {loss:.4f}  ({time.perf_counter() - t0:.0f} s)")

    losses = supervised_finetune(model, examples, tokenizer.pad_token_id, cfg.steps, cfg.batch_size, cfg.lr, cfg.seed,
                                 cfg.time_budget_s, on_step)
    train_s = time.perf_counter() - t0
    progress(f"trained {len(losses)} steps in {train_s:.0f} s, final loss {losses[-1]:.4f}; evaluating on {len(held)} held-out tasks")
    if len(losses) < cfg.steps:
        progress(f"warning: time_budget_s={cfg.time_budget_s:g} ran out after {len(losses)} of {cfg.steps} steps; "
                 "the checkpoint depends on this machine's speed (raise time_budget_s for a reproducible one)")
    greedy = evaluate(model, tokenizer, held, 0.0, cfg.seed)
    sampled = evaluate(model, tokenizer, held, cfg.eval_temperature, cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics = {
        "config": dataclasses.asdict(cfg), "parameters": n_params, "train_steps": len(losses), "final_loss": losses[-1],
        "stopped_by_time_budget": len(losses) < cfg.steps,
        "train_s": train_s, "total_s": time.perf_counter() - t0, "eval_tasks": len(held),
        "greedy": greedy, "sampled": sampled,
    }
    (out / "bootstrap.json").write_text(json.dumps(metrics, indent=2))
    return metrics
