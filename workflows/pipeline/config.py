"""Config schemas of ``bench pipeline`` (the schemas of a room's commands live in its ``config.py``; the
platform holds only what the engine and the training step read: ``tracerl.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tracerl.config import TrainConfig, TrainPipelineMode
from tracerl.engine.config import PipelineMode
from tracerl.schema import check, check_choices, check_flat_keys, flattened


@check_flat_keys
@dataclass(frozen=True)
class BenchPipelineConfig:
    """``tracerl bench pipeline``: barrier vs streaming steps (``pipeline.mode``) on the training setup, frozen
    policy, seeds interleaved (seed s: every mode, then seed s + 1)."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup (its keys at the top level): ``steps`` steps per (seed, mode), seeds from ``seed``."""
    modes: list[PipelineMode] = field(default_factory=lambda: ["barrier", "streaming"])
    """Pipeline modes to compare in allocation-and-rollout steps with the policy frozen ([]: none)."""
    batchings: list[Literal["rounds", "join"]] = field(default_factory=lambda: ["rounds"])
    """How the samplers batch turns in the frozen steps: 'rounds' (one turn of every path per round), 'join'
    (``sampler.join``: per-token join); each mode runs with each (``--batching rounds,join``), seeds interleaved."""
    train_modes: list[TrainPipelineMode] = field(default_factory=lambda: ["barrier", "overlap"])
    """Modes to compare in ``tracerl train`` runs, with the update (overlap needs one; workflows/pipeline/bench_train.py)."""
    train_steps: int = 0
    """Steps of each train run (steps 2 .. train_steps - 1 are measured); 0: no train runs."""
    seeds: int = 3
    """Seeds (seed, seed + 1, ...); each runs ``steps`` steps per mode, the modes' order alternating by seed."""
    warmup_steps: int = 1
    """Steps run first and not measured (actor start-up, the samplers' first forwards)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/pipeline"
    """Where results.json goes."""

    def __post_init__(self) -> None:
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(len(self.modes) + self.train_steps > 0, "modes must name a pipeline mode, or set train_steps")
        check(
            not self.modes or self.train.steps is not None,
            "bench pipeline: set steps (frozen steps per mode)",
        )
        check(len(self.batchings) > 0, "batchings must name 'rounds', 'join' or both")
        check(
            self.train_steps == 0 or (self.train_steps >= 3 and len(self.train_modes) > 0),
            f"train_steps must be 0 or >= 3 with train_modes set (got {self.train_steps}, {self.train_modes})",
        )
        check_choices(self, "")
