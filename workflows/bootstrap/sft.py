"""``tracerl sft``: warm-start a pretrained chat model on an environment's reference traces (SFT before RL).

A pretrained instruct model rarely writes the tool calls an environment parses (SmolLM2-135M-Instruct writes
markdown code blocks, not ``<tool_call>``), so RL on it starts with almost no reward to learn from. Practitioners
warm-start such a model with a short supervised pass on traces in its own format; this command does that:

1. the environment's training tasks (``env``: for math, ``env.math.num_tasks`` tasks of ``env.math.levels``) and
   their reference solutions (``gold_turns``) are replayed through the real ``TreeRolloutEngine`` with the model's
   tokenizer and ``model.template`` / ``model.system_prompt``: each turn ends on the tokenizer's EOS, the real
   environment runs each call and writes its observation, and the engine builds the token sequence exactly as it
   does for the policy's own rollouts (the learner's sequence: prompt, turns, observations). A replay that is not
   solved (reward below 1) or leaves the script stops the command;
2. supervised fine-tuning of ``init_from`` on those sequences, loss on the model's tokens only (turns and their
   end tokens; prompt and observations masked), seeded batches, AdamW with warm-up-stable-decay;
3. the checkpoint (weights, tokenizer, generation config) goes to ``model.path`` with ``sft.json`` (config, loss
   curve, trace statistics, time). Then ``tracerl eval model=... split=train --samples 8`` gives the pass rates.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tracerl.engine.react import make_template
from tracerl.models.config import ModelConfig
from tracerl.models.hf import SetupError, load_policy
from tracerl.models.tiny import supervised_finetune
from tracerl.tree import RolloutTree
from tracerl.workflows.bootstrap.config import SFTConfig
from tracerl.workflows.ops.progress import bar

Example = tuple[list[int], list[int]]


@dataclass(frozen=True)
class SFTResult:
    """What ``tracerl sft`` did (also written as ``sft.json`` beside the checkpoint)."""

    out_dir: str
    init_from: str
    traces: int
    trace_tokens_mean: float
    loss_tokens_mean: float
    steps: int
    losses: list[float]
    train_s: float
    total_s: float

    def format(self) -> str:
        first = sum(self.losses[:5]) / max(len(self.losses[:5]), 1)
        last = sum(self.losses[-5:]) / max(len(self.losses[-5:]), 1)
        return (
            f"warm-started {self.init_from} -> {self.out_dir}: {self.steps} steps on {self.traces} reference traces "
            f"({self.trace_tokens_mean:.0f} tokens, {self.loss_tokens_mean:.0f} with loss, mean), loss "
            f"{first:.3f} -> {last:.3f} (mean of the first and last 5 steps), {self.train_s:.0f} s training, "
            f"{self.total_s:.0f} s in all"
        )


def examples_from_trees(trees: Sequence[RolloutTree], max_tokens: int) -> list[Example]:
    """Each leaf's token sequence with labels on the model's tokens only (-100 elsewhere), cut at ``max_tokens``."""
    out = []
    for tree in trees:
        for leaf in tree.leaves():
            ids, model_mask, _ = tree.sequence(leaf.node_id)
            labels = [t if m else -100 for t, m in zip(ids, model_mask)]
            out.append((ids[:max_tokens], labels[:max_tokens]))
    return out


def reference_trees(cfg: SFTConfig, tokenizer: Any, progress: Callable[[str], None]) -> list[RolloutTree]:
    """The environment's reference solutions of its training tasks, replayed through the real engine in the model's
    template (``replay_engine``), each turn ending on the tokenizer's EOS.

    Raises:
        SetupError: a replay left its script or did not solve its task (the traces would teach a wrong format).
    """
    # slow to import: transformers (samplers.scripted, lm.stack)
    from tracerl.samplers.scripted import ScriptedSampler, replay_engine
    from tracerl.workflows.lm.stack import make_env, task_prompts

    prompts = task_prompts(cfg.env, held_out=False)
    env = make_env(cfg.env)
    template = make_template(cfg.model.template, tokenizer, cfg.model.system_prompt)
    eos = str(tokenizer.decode([tokenizer.eos_token_id]))
    engine = replay_engine(env, prompts, template, tokenizer, cfg.sampler, turn_end=eos)
    trees: list[RolloutTree] = []
    with bar(progress, len(prompts), "reference traces", "task") as done:
        for i in range(0, len(prompts), 32):
            batch = prompts[i : i + 32]
            trees += engine.rollout(batch, [1] * len(batch))
            done.update(len(batch))
    assert isinstance(engine.sampler, ScriptedSampler)
    unsolved = [t.prompt.prompt_id for t in trees if float(t.rewards().min()) < 1.0]
    if engine.sampler.misses or unsolved:
        raise SetupError(
            f"the reference replay in template {cfg.model.template!r} did not solve {len(unsolved)} of "
            f"{len(trees)} tasks (first: {unsolved[:3]}) and left its script {engine.sampler.misses} times: the "
            "template cannot parse its own turns for this tokenizer; check model.template and model.system_prompt"
        )
    return trees


def _save(model: Any, tokenizer: Any, out: Path, cfg: SFTConfig, result: SFTResult) -> None:
    """Write the checkpoint to a temporary sibling, then move it in place (no half-written ``model.path``)."""
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "sft.json").write_text(json.dumps({"config": asdict(cfg), "result": asdict(result)}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def run_sft(cfg: SFTConfig, progress: Callable[[str], None] = lambda s: None) -> SFTResult:
    """``tracerl sft``: reference traces, supervised fine-tuning, the checkpoint in ``cfg.model.path``."""
    t0 = time.perf_counter()
    out = Path(cfg.model.path)
    if out.exists() and any(out.iterdir()) and not cfg.force:
        raise SetupError(
            f"{out} already holds a checkpoint: pass force=true to overwrite it, or set model.path"
        )
    if not Path(cfg.init_from).is_dir():
        raise SetupError(
            f"init_from={cfg.init_from!r} is not a checkpoint directory: `make smollm2` writes SmolLM2-135M-Instruct "
            "to models/smollm2-135m-instruct, or point init_from at an HF checkpoint"
        )
    base: ModelConfig = replace(cfg.model, path=cfg.init_from, dtype="float32")
    tokenizer, model = load_policy(base)
    trees = reference_trees(cfg, tokenizer, progress)
    examples = examples_from_trees(trees, cfg.max_tokens)
    n_tokens = [len(ids) for ids, _ in examples]
    n_loss = [sum(y != -100 for y in labels) for _, labels in examples]
    progress(
        f"{len(examples)} reference traces: {sum(n_tokens) / len(examples):.0f} tokens each "
        f"({sum(n_loss) / len(examples):.0f} with loss), {cfg.steps} steps of {cfg.batch_size}"
    )
    torch.manual_seed(cfg.seed)
    if cfg.gradient_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.config.use_cache = False
    t_train = time.perf_counter()
    with bar(progress, cfg.steps, "sft", "step") as steps:

        def on_step(step: int, loss: float) -> None:
            steps.update()
            if (step + 1) % 10 == 0 or step == 0:
                progress(f"sft step {step + 1}/{cfg.steps}: loss {loss:.3f}")

        pad = tokenizer.pad_token_id
        losses = supervised_finetune(
            model, examples, pad, cfg.steps, cfg.batch_size, cfg.lr, cfg.seed, on_step=on_step
        )
    train_s = time.perf_counter() - t_train
    if cfg.gradient_checkpointing:
        getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
        model.config.use_cache = True
    result = SFTResult(
        out_dir=str(out),
        init_from=cfg.init_from,
        traces=len(examples),
        trace_tokens_mean=sum(n_tokens) / len(examples),
        loss_tokens_mean=sum(n_loss) / len(examples),
        steps=len(losses),
        losses=losses,
        train_s=train_s,
        total_s=time.perf_counter() - t0,
    )
    _save(model, tokenizer, out, cfg, result)
    return result
