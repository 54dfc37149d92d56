"""Rank 0's helpers around the step loop of ``tracerl train``: starting the sampler pool (before the trainer loads its
policy, so both load at once), the start-up clock (``time/startup_s`` and its parts), the run's thread counts, and
what a step logs beside its metrics (a sample of its trees, peak memory)."""

from __future__ import annotations

import json
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.actors.faults import Faults
from tracerl.actors.local import LocalPool
from tracerl.actors.spec import WorkerSpec
from tracerl.config import TrainConfig
from tracerl.workflows.lm.viewer import render_html
from tracerl.workflows.tracking.outage import unreachable
from tracerl.workflows.train.budget import Totals
from tracerl.workflows.train.push import adapter_pushes
from tracerl.workflows.train.setup import say

THREADS_TRAINER = "threads/trainer"
"""Param: torch intra-op threads of each trainer worker (``trainer.torch_threads``, else what Ray gave it)."""
THREADS_SAMPLER = "threads/sampler"
"""Param: torch intra-op threads of each sampler actor (``pools.sampler_threads``, else ``pools.rollout_cpus``); in
the in-process mode the trainer's own (one process runs both)."""


@dataclass
class StartupClock:
    """Wall-clock marks (seconds since the epoch: the driver and rank 0 share a machine on the embedded Ray) from the
    launch of ``tracerl train`` to its first step's begin; each mark ends one of ``M.STARTUP_PHASES``."""

    launched: float
    """When the process started (the CLI), or ``train`` was called (a library caller)."""
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.time()

    def metrics(self) -> dict[str, float]:
        """``time/startup_s`` (launch to now) and ``time/startup_<phase>_s`` for each phase marked, in order."""
        now, prev = time.time(), self.launched
        out = {M.TIME_STARTUP: now - self.launched}
        for phase in M.STARTUP_PHASES:
            if phase in self.marks:
                out[M.startup_phase(phase)] = self.marks[phase] - prev
                prev = self.marks[phase]
        return out


def start_pool(cfg: TrainConfig, storage: Path) -> Any:
    """The run's samplers. Ray mode: the sampler actors (each with its environment actors), started without waiting
    for them: every actor loads ``model.path`` in its own process while the caller goes on. In-process
    (``cluster.address=inprocess``): one sampler in this process (``tracerl.actors.local``), loaded before this
    returns, running the work of ``pools.rollout_workers`` actors one shard after another (the same trees)."""
    faults = Faults.from_config(cfg.faults, storage / ".faults")
    lora = tuple(cfg.trainer.lora_targets) if adapter_pushes(cfg.trainer, cfg.sampler.backend) else ()
    spec = WorkerSpec(
        cfg.model,
        cfg.sampler,
        cfg.env,
        cfg.pools,
        faults=faults,
        push_transport=cfg.trainer.push_transport,
        lora_targets=lora,
    )
    p = cfg.pools
    if cfg.cluster.in_process:
        return LocalPool(spec, p.rollout_workers, cfg.seed)
    # slow to import: ray (and the in-process mode never loads Ray)
    from tracerl.actors.pools import RolloutPool

    return RolloutPool(
        spec,
        p.rollout_workers,
        p.rollout_cpus,
        p.rollout_gpus,
        p.max_retries,
        cfg.seed,
        cfg.pipeline.reencode_queue,
    )


def log_threads(client: Any, run_id: str, pool: Any) -> None:
    """The run's params ``threads/trainer`` (this process's torch threads) and ``threads/sampler``, and on Ray where
    the actors run (``placement/trainer``, ``placement/samplers``, ``placement/env``: node addresses)."""
    # slow to import: torch, mlflow
    import torch
    from mlflow.entities import Param

    params = {THREADS_TRAINER: torch.get_num_threads(), THREADS_SAMPLER: pool.threads}
    if hasattr(pool, "placement"):  # the Ray pool (the in-process one runs here)
        params.update(pool.placement())
    try:
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    except Exception as exc:  # noqa: BLE001 - MLflow refuses to change a param: a resume keeps the first counts
        if unreachable(exc):  # not a refusal: the server is away (the step metrics are spooled)
            say(
                f"tracking unreachable ({type(exc).__name__}): thread counts and placement {params} not logged as params"
            )
        else:
            say(
                f"run {run_id} keeps the thread counts and placement it started with; this attempt has {params}"
            )


def log_trees(metrics: Any, out: Any, step: int, run_name: str | None) -> None:
    """A sample of the step's trees (16) as artifacts ``trees/step_<step>/trees.jsonl`` and ``trees.html``."""
    # slow to import: torch, transformers (lm.rollout)
    from tracerl.workflows.lm.rollout import outcome_records

    records = outcome_records(out)
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "trees.jsonl", "w") as f:
            for r in records[:16]:
                f.write(json.dumps(r) + "\n")
        (Path(tmp) / "trees.html").write_text(render_html(records[:16], f"{run_name}: step {step}"))
        metrics.log_artifacts(Path(tmp), f"trees/step_{step:05d}")


def totals_line(t: Totals) -> str:
    return f"{t.generated_tokens:.0f} tokens, {t.leaves:.0f} leaves, {t.cpu_s:.0f} CPU s, {t.wall_s:.0f} s"


def peak_memory_mb() -> float:
    """Peak resident memory of this process (CPU) or peak allocated GPU memory, in MiB."""
    import torch  # slow to import: torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
