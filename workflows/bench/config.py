"""Config schemas of ``bench allocation``, ``bench rollout``, ``bench env`` and ``bench train`` (the schemas of a room's commands live in its ``config.py``; the
platform holds only what the engine and the training step read: ``tracerl.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tracerl.actors.config import ClusterConfig, TrackingConfig
from tracerl.algos.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.config import LMRolloutFields, PipelineConfig, TrainConfig, lm_env
from tracerl.engine.config import SamplerConfig
from tracerl.env_config import EnvConfig
from tracerl.models.config import ModelConfig
from tracerl.schema import check, check_flat_keys, flattened


@dataclass(frozen=True)
class BenchEnvConfig:
    """``tracerl bench env``: gold replay, or the policy's pass@1, on an environment's held-out tasks."""

    tool_env_only: ClassVar[bool] = True
    """Runs a language model: ``env`` must be a ReAct tool environment (``Env.tool_env``)."""

    env: EnvConfig = field(default_factory=lm_env)
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy for the policy mode; its ``template`` is the format gold turns are written in."""
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(temperature=0.0))
    """Episode limits; ``temperature`` for the policy mode (0: greedy pass@1)."""
    gold: bool = False
    """Replay the environment's reference actions instead of running the policy."""
    tasks: int = 200
    """Held-out tasks to run (the first N of the environment's held-out prompts)."""
    workers: int = 8
    """Threads running each round's tool calls concurrently (1: one after another)."""
    seed: int = 0
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""

    def __post_init__(self) -> None:
        check(self.tasks >= 1, f"tasks must be >= 1 (got {self.tasks})")
        check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")


@dataclass(frozen=True)
class BenchRolloutConfig(LMRolloutFields):
    """``tracerl bench rollout``: allocators at equal leaves with the frozen tiny policy, predictor learning online."""

    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    allocators: list[str] = field(default_factory=lambda: ["grpo", "pcl", "treepo", "trace"])
    """Allocators to compare."""
    steps: int = 10
    """Steps per allocator."""
    seeds: int = 1
    """Seeds per allocator."""
    seed: int = 0
    warmup_fraction: float = 0.2
    """Leading share of steps left out of the averages."""
    out_dir: str = "bench_out/rollout"
    json_path: str | None = None

    def __post_init__(self) -> None:
        check(self.steps >= 1 and self.seeds >= 1, "steps and seeds must be >= 1")
        check(0.0 <= self.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)")


@dataclass(frozen=True)
class BenchAllocationConfig:
    """``tracerl bench allocation``: every allocator at equal leaf budget on the simulator."""

    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    """Allocator settings shared by every compared allocator (its name is replaced by each in turn)."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The predictor learning online (oracle_trace always uses the oracle)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment; must be the simulator."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """Per-step budget."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray, used to run seeds in parallel when workers > 1."""
    workers: int = 2
    """Parallel runs (Ray tasks); 1 runs everything in this process without Ray."""
    allocators: list[str] = field(
        default_factory=lambda: [
            "grpo",
            "pcl",
            "dapo",
            "treepo",
            "trace_root_only",
            "trace_prefix_only",
            "trace",
            "oracle_trace",
        ]
    )
    """Allocators to compare."""
    steps: int = 150
    """RL steps per run."""
    seeds: int = 5
    """Independent seeds per allocator (CIs are over seeds)."""
    seed: int = 0
    """First seed; runs use seed, seed+1, ..."""
    warmup_fraction: float = 0.2
    """Leading share of steps left out of the averages (the predictor's warm-up)."""
    noise_scales: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    """Feature-noise multipliers for the informativeness sweep (empty: skip the sweep)."""
    noise_allocators: list[str] = field(
        default_factory=lambda: ["grpo", "pcl", "treepo", "trace", "oracle_trace"]
    )
    """Allocators in the informativeness sweep."""
    noise_seeds: int = 2
    """Seeds per point of the informativeness sweep."""
    out_dir: str = "bench_out/allocation"
    """Where the table, PNGs and JSON go."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
        check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(
            0.0 <= self.warmup_fraction < 1.0,
            f"warmup_fraction must be in [0, 1) (got {self.warmup_fraction})",
        )
        check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        check(all(s > 0 for s in self.noise_scales), "noise_scales must be > 0")
        check(self.noise_seeds >= 1, "noise_seeds must be >= 1")
        check(
            self.env.name == "simulator",
            f"bench allocation runs on the simulator; got env.name={self.env.name!r}",
        )


@check_flat_keys
@dataclass(frozen=True)
class BenchTrainConfig:
    """``tracerl bench train``: full training runs of several allocators at equal leaf budget, several seeds."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup every run shares (its keys at the top level); each run sets its allocator and seed."""
    allocators: list[str] = field(default_factory=lambda: ["trace", "grpo"])
    """Allocators to train with (each with the same budget, steps and optimiser)."""
    seeds: int = 3
    """Seeds per allocator (seed, seed + 1, ...)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/train"
    """Where results.json goes."""

    def __post_init__(self) -> None:
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        check(self.train.resume is None, "bench train starts fresh runs; resume is not allowed")
