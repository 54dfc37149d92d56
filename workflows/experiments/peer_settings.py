"""The same work on both sides of ``tracerl bench peer``: its config, each side's training config, the run order,
and ``settings``, the one place where the training setup is turned into TRL's ``GRPOConfig`` arguments (its rows
are printed into the JSON, so a reader can check both sides do the same work)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.actors.config import IN_PROCESS
from tracerl.config import BudgetConfig, TrainConfig
from tracerl.workflows.experiments.config import BenchPeerConfig, split_side

RAY_SUFFIX = "-ray"
"""A tracerl side named ``<allocator>-ray`` runs ``tracerl train`` on Ray (an embedded Ray: Ray Train's worker, the
sampler and environment actors); ``grpo`` and ``trace`` run it in-process (``cluster.address=inprocess``, no Ray).
Both train the same trees (the in-process side runs the configured ``pools.rollout_workers`` as shards)."""


def side_mode(side: str) -> str:
    """How a side runs: ``trl`` (TRL's trainer), ``ray`` or ``inprocess`` (``tracerl train``'s two modes)."""
    side = split_side(side)[0]
    if side == "trl":
        return "trl"
    return "ray" if side.endswith(RAY_SUFFIX) else "inprocess"


def side_threads(cfg: BenchPeerConfig, side: str) -> int:
    """The torch threads ``side`` runs with: its own (``trl@2``) or the bench's ``torch_threads``."""
    return split_side(side)[1] or cfg.torch_threads


def side_tag(side: str) -> str:
    """``side`` as it may appear in a directory or run name (``trl@2`` -> ``trl-t2``)."""
    base, t = split_side(side)
    return base if t is None else f"{base}-t{t}"


def settings(tc: TrainConfig, trl_threads: Sequence[int] = ()) -> dict[str, Any]:
    """The training setup as both sides run it: ``rows`` (setting, tracerl's key and value, what TRL is given, and
    why, where TRL's side does what TRL's own documentation would not) and ``trl_args`` (``GRPOConfig``'s keyword
    arguments); ``trl_threads``: the torch thread counts TRL's side runs at. One place, printed into the JSON.

    Raises:
        ValueError: a setting TRL's side cannot match (naming the key and what to set).
    """
    check_matchable(tc)
    args = trl_args(tc)
    return {
        "rows": [
            {"setting": a, "tracerl": k, "value": v, "trl": t, "why": w}
            for a, k, v, t, w in setting_rows(tc, args, trl_threads)
        ],
        "trl_args": args,
    }


def check_matchable(tc: TrainConfig) -> None:
    """Raise ValueError, naming the key to set, for a setting TRL's side cannot match."""
    b, lo, s = tc.budget, tc.loss, tc.sampler
    leaves, group, micro = b.num_leaves, b.group_size, lo.micro_batch_size
    if leaves is None:
        raise ValueError("bench peer needs budget.num_leaves (rollouts per step); got null")
    if leaves % group:
        raise ValueError(f"budget.num_leaves ({leaves}) must be a multiple of budget.group_size ({group})")
    if leaves % micro:
        raise ValueError(
            f"budget.num_leaves ({leaves}) must be a multiple of loss.micro_batch_size ({micro})"
        )
    if lo.name != "ppo_clip":
        raise ValueError(
            f"bench peer maps loss.name=ppo_clip to TRL's clipped loss; got loss.name={lo.name!r}"
        )
    if lo.importance_sampling == "on" or s.backend != "hf":
        raise ValueError(
            "bench peer runs the hf sampler on both sides (TRL's rollout_func has no importance weight without vLLM): "
            f"set sampler.backend=hf and loss.importance_sampling=auto or off (got {s.backend}, {lo.importance_sampling})"
        )
    if tc.trainer.num_workers != 1 or tc.trainer.lora_rank > 0:
        raise ValueError(
            "bench peer compares one trainer process with full weights: set trainer.num_workers=1, lora_rank=0"
        )


def trl_args(tc: TrainConfig) -> dict[str, Any]:
    """``GRPOConfig``'s keyword arguments for ``tc`` (checked by ``check_matchable`` first)."""
    b, o, lo, s = tc.budget, tc.optim, tc.loss, tc.sampler
    leaves, group, micro = b.num_leaves, b.group_size, lo.micro_batch_size
    assert leaves is not None
    loss_type = {"token_mean": "dapo", "seq_mean_token_mean": "grpo"}[lo.aggregation]
    args: dict[str, Any] = {
        "max_steps": tc.steps,
        "seed": tc.seed,
        "shuffle_dataset": False,  # the dataset is grpo's draws in order (grpo_draws)
        "num_generations": group,
        "generation_batch_size": leaves,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": leaves // micro,
        "learning_rate": o.lr,
        "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1],
        "weight_decay": o.weight_decay,
        "max_grad_norm": o.grad_clip,
        "beta": lo.kl_coef,
        "epsilon": lo.eps_low,
        "epsilon_high": lo.eps_high,
        "loss_type": loss_type,
        "scale_rewards": "group" if lo.normalize_std else "none",
        "num_iterations": lo.epochs,
        "temperature": s.temperature if s.temperature > 0 else 1.0,
        "max_completion_length": s.max_context_tokens,
        "mask_truncated_completions": False,
        "bf16": tc.model.dtype == "bfloat16",
        "use_cpu": not tc.trainer.use_gpu,
        "save_strategy": "steps",
        "save_steps": tc.checkpoint_every,
        "save_total_limit": tc.keep_checkpoints,
        "logging_steps": 1,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        # Always set: TRL's GRPOConfig defaults gradient_checkpointing to True (transformers' deprecated alias of
        # activation_checkpointing), so leaving it out recomputes every micro-batch's forward in its backward.
        "activation_checkpointing": tc.trainer.gradient_checkpointing,
    }
    return args


def setting_rows(
    tc: TrainConfig, args: dict[str, Any], trl_threads: Sequence[int] = ()
) -> list[tuple[str, str, Any, str, str]]:
    """(setting, tracerl's key, its value, what TRL is given, why) for every setting both sides share. ``why`` is
    empty where TRL is simply given the same setting, and says why where TRL's side does what TRL's own
    documentation would not (a default overridden, an argument its docs would not pass)."""
    b, o, lo, s, tr = tc.budget, tc.optim, tc.loss, tc.sampler, tc.trainer
    leaves, group, micro = b.num_leaves, b.group_size, lo.micro_batch_size
    assert leaves is not None
    loss_type = args["loss_type"]
    threads = "/".join(str(t) for t in trl_threads) or "the side's torch_threads"
    return [
        (
            "checkpoint",
            "model.path",
            tc.model.path,
            "model (the same directory, loaded by tracerl's load_policy)",
            "an instance, not a path: the rollout function samples from the object TRL trains; the same float32 "
            "weights TRL would load",
        ),
        (
            "dtype",
            "model.dtype",
            tc.model.dtype,
            f"bf16={args['bf16']}",
            "TRL defaults bf16=True: tracerl trains the checkpoint's dtype; on this CPU (AVX2, no bf16 units) "
            "bf16 autocast made TRL's backward ~10x slower",
        ),
        (
            "template and stop strings",
            "model.template",
            tc.model.template,
            "the project's template in rollout_func",
            "",
        ),
        (
            "tasks",
            "env",
            f"{tc.env.name}, {len(_train_prompts(tc))} training prompts",
            "train_dataset: grpo's draws, step by step (grpo_draws), shuffle_dataset=False",
            "TRL would draw its own prompts with its own seed: the same prompts and seeds each step give both sides "
            "the same first-step trees and the same work",
        ),
        (
            "predictor",
            "predictor.name",
            f"{tc.predictor.name} (trace); constant (grpo)",
            "none: TRL fits no predictor",
            "grpo's allocation ignores the predictor's scores, so its side runs predictor=constant and fits nothing "
            "(the same draws and trees as with the learned one, which would only log its calibration)",
        ),
        (
            "tool and reward",
            "env.name",
            tc.env.name,
            "the project's environment in rollout_func; its reward",
            "",
        ),
        (
            "episode limits",
            "sampler.max_turns/max_turn_tokens/max_episode_tokens/max_context_tokens",
            f"{s.max_turns}/{s.max_turn_tokens}/{s.max_episode_tokens}/{s.max_context_tokens}",
            "the project's engine in rollout_func, the same SamplerConfig",
            "",
        ),
        ("temperature", "sampler.temperature", s.temperature, f"temperature={args['temperature']}", ""),
        ("rollouts per step", "budget.num_leaves", leaves, f"generation_batch_size={leaves}", ""),
        ("group size", "budget.group_size (grpo)", group, f"num_generations={group}", ""),
        (
            "micro-batch",
            "loss.micro_batch_size/micro_tokens",
            f"{micro}/{lo.micro_tokens}",
            f"per_device_train_batch_size={micro}, gradient_accumulation_steps={leaves // micro}",
            ""
            if lo.micro_tokens <= 0
            else f"tracerl packs its micro-batches longest first to {lo.micro_tokens} padded tokens, which TRL's "
            "GRPO trainer has no setting for; the loss sums over the same tokens with the same denominator",
        ),
        (
            "old log-probs",
            "loss.epochs",
            lo.epochs,
            f"num_iterations={lo.epochs}, steps_per_generation={leaves // micro} (= gradient_accumulation_steps): "
            "TRL runs no extra forward for them"
            if lo.epochs == 1
            else f"num_iterations={lo.epochs}: TRL computes them with an extra forward, as tracerl does",
            "",
        ),
        (
            "optimizer",
            "optim.lr/betas/weight_decay",
            f"AdamW {o.lr}, {list(o.betas)}, {o.weight_decay}",
            "optimizers=(torch AdamW, the same arguments)",
            "passed with the schedule below (TRL's docs set optim=; its default here, adamw_torch_fused, is the same update; either step takes ~10 ms)",
        ),
        (
            "schedule",
            "optim.warmup_steps/schedule/min_lr_ratio",
            f"{o.warmup_steps}/{o.schedule}/{o.min_lr_ratio}",
            "optimizers=(..., LambdaLR(tracerl.learner.lr_lambda))",
            "TRL's scheduler types start warm-up at lr 0, tracerl's at lr / (warmup + 1)",
        ),
        ("grad clip", "optim.grad_clip", o.grad_clip, f"max_grad_norm={o.grad_clip}", ""),
        (
            "activation checkpointing",
            "trainer.gradient_checkpointing",
            tr.gradient_checkpointing,
            f"activation_checkpointing={args['activation_checkpointing']}",
            "TRL defaults gradient_checkpointing=True (the deprecated alias): left unset, TRL's backward recomputes "
            "every micro-batch's forward, which tracerl's trainer does not",
        ),
        ("KL", "loss.kl_coef", lo.kl_coef, f"beta={lo.kl_coef}", ""),
        (
            "clip",
            "loss.eps_low/eps_high",
            f"{lo.eps_low}/{lo.eps_high}",
            f"epsilon={lo.eps_low}, epsilon_high={lo.eps_high}",
            "",
        ),
        ("loss aggregation", "loss.aggregation", lo.aggregation, f"loss_type={loss_type}", ""),
        (
            "advantage",
            "loss.normalize_std",
            lo.normalize_std,
            f"group mean-centred, scale_rewards={args['scale_rewards']} (grpo side: loss.advantage=grpo)",
            "",
        ),
        ("epochs", "loss.epochs", lo.epochs, f"num_iterations={lo.epochs}", ""),
        (
            "tool tokens",
            "collate: loss mask on model tokens only",
            "masked",
            "env_mask=0 on observation tokens",
            "",
        ),
        ("steps", "steps", tc.steps, f"max_steps={tc.steps}", ""),
        (
            "checkpoints",
            "checkpoint_every",
            tc.checkpoint_every,
            f"save_steps={tc.checkpoint_every}, save_total_limit={tc.keep_checkpoints}",
            "TRL's default is every 500 steps: tracerl's sides save every checkpoint_every, so TRL does the same "
            "(model, optimizer and scheduler; one save in a 10-step run's measured steps)",
        ),
        (
            "logging",
            "metrics every step",
            1,
            "logging_steps=1",
            "TRL's default is 10: every step's metrics, as tracerl logs them (milliseconds a step)",
        ),
        (
            "torch threads",
            "trainer.torch_threads (per side: torch_threads or side@T)",
            threads,
            "torch.set_num_threads(T), OMP_NUM_THREADS=T",
            "TRL's docs leave torch's default (a thread per core: 2 here); the bench runs each side at the counts "
            "it is given (trl@1, trl@2) and its headline compares each side's fastest",
        ),
    ]


def grpo_draws(tc: TrainConfig) -> list[list[str]]:
    """The prompts (texts) tracerl's grpo side rolls out at each of its ``num_steps`` steps, in its order
    (``replay_draws`` over the training tasks with ``tc.seed``). TRL's side takes them as its dataset, in this order
    and unshuffled, so both sides roll out the same prompts with the same seeds at every step: their first step's
    trees are the same.

    Raises:
        ValueError: a token budget (its steps' sizes depend on the rollouts, so there is nothing to replay).
    """
    if tc.budget.token_budget is not None:
        raise ValueError(
            "bench peer replays grpo's prompt draws, which a token budget makes depend on the rollouts: "
            "set budget.token_budget=null and budget.num_leaves"
        )
    draws = replay_draws(_train_prompts(tc), tc.budget, tc.seed, tc.num_steps)
    return [[p.text for p in step] for step in draws]


def replay_draws(prompts: Sequence[Any], budget: BudgetConfig, seed: int, steps: int) -> list[list[Any]]:
    """The prompts a grpo run over ``prompts`` rolls out at each of ``steps`` steps: its ``Stepper``'s draws from
    ``default_rng(seed)`` (a candidate pool, then the groups' prompts; grpo draws nothing else and ignores the
    predictor's scores), replayed without rolling anything out."""
    import numpy as np

    from tracerl.algos.config import AllocatorConfig
    from tracerl.engine.allocation import allocator_of  # slow to import: torch (the predictors)
    from tracerl.engine.stepper import sample_pool
    from tracerl.types import Anchor

    grpo = allocator_of(AllocatorConfig(name="grpo"))
    rng = np.random.default_rng(seed)
    out: list[list[Any]] = []
    for _ in range(steps):
        pool = sample_pool(prompts, budget.num_candidates, rng)
        plan = grpo.plan_step(None, [Anchor(p) for p in pool], budget, rng)
        out.append([pool[int(i)] for batch in plan.batches for i in batch])
    return out


def _train_prompts(tc: TrainConfig) -> list[Any]:
    from tracerl.workflows.lm.stack import task_prompts

    return task_prompts(tc.env)


def side_config(cfg: BenchPeerConfig, side: str, seed: int, run_name: str) -> TrainConfig:
    """The training config ``side`` runs with ``seed``: grpo with grpo advantages, trace as configured, in-process or
    (``-ray``) on Ray, with the side's torch threads (``side_threads``); no held-out evaluation at the start (the
    bench evaluates the checkpoint once), outputs under ``bench_out``."""
    tc = cfg.train
    mode = side_mode(side)
    threads = side_threads(cfg, side)
    side = split_side(side)[0].removesuffix(RAY_SUFFIX)
    if mode == "inprocess":
        tc = dataclasses.replace(tc, cluster=dataclasses.replace(tc.cluster, address=IN_PROCESS))
    elif tc.cluster.in_process:  # a -ray side of a bench configured in-process
        tc = dataclasses.replace(tc, cluster=dataclasses.replace(tc.cluster, address="local"))
    # grpo ignores the predictor's scores: nothing to fit (the same draws and trees), as TRL fits nothing
    if side == "grpo":
        tc = dataclasses.replace(
            tc,
            allocator=dataclasses.replace(tc.allocator, name="grpo"),
            loss=dataclasses.replace(tc.loss, advantage="grpo"),
            predictor=dataclasses.replace(tc.predictor, name="constant", warmup_steps=0),
        )
    elif side == "trace":
        tc = dataclasses.replace(tc, allocator=dataclasses.replace(tc.allocator, name="trace"))
    out = Path(cfg.bench_out).resolve()
    return dataclasses.replace(
        tc,
        seed=seed,
        eval_at_start=False,
        run_name=run_name,
        out_dir=str(out / "runs"),
        log_trees_every=0,
        trainer=dataclasses.replace(tc.trainer, torch_threads=threads),
        pools=dataclasses.replace(tc.pools, sampler_threads=1),
    )


def run_order(sides: Sequence[str], k: int) -> list[str]:
    """The sides' order for the k-th seed: rotated by k, so each side goes first in turn."""
    j = k % len(sides)
    return list(sides[j:]) + list(sides[:j])
