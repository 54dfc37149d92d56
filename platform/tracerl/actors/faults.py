"""Fault injection for tests and drills (``faults.kill_*_at_step``): a process exits for real during a chosen
step, so the retry and restart paths run through Ray's actual failure handling, not a simulated one.

Each fault fires once per run: the first process to reach it claims a marker file in the run's fault directory
(``<storage>/.faults``), so the actor that replaces a dead one, or the trainer restarted from a checkpoint, runs the
same step again without exiting. The chaos drill (conf/train/chaos.yaml) kills from outside instead, with signals.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tracerl.actors.config import FaultConfig


def fault_once(fault_dir: str | None, name: str) -> bool:
    """True the first time ``name`` is claimed in ``fault_dir`` (a marker file), then never again."""
    if not fault_dir:
        return False
    marker = Path(fault_dir) / name
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


@dataclass(frozen=True)
class Faults:
    """Where each fault fires (-1: never) and the directory of their markers; travels to the actors."""

    fault_dir: str | None = None
    sampler_step: int = -1
    """A sampler actor exits during its first rollout or expansion call of this step (a streaming step: its second
    call, mid-stream)."""
    env_step: int = -1
    """An environment actor exits during its first tool call of this step."""
    trainer_step: int = -1
    """Rank 0 exits after reporting this step (before the next checkpoint)."""

    @classmethod
    def from_config(cls, cfg: FaultConfig, fault_dir: str | Path) -> Faults:
        return cls(
            str(fault_dir),
            cfg.kill_rollout_worker_at_step,
            cfg.kill_env_worker_at_step,
            cfg.kill_trainer_at_step,
        )

    def sampler(self, step: int) -> None:
        """Called by a sampler actor as it starts work of ``step``."""
        _exit_once(self.fault_dir, "sampler", self.sampler_step, step)

    def env(self, step: int) -> None:
        """Called by an environment actor before a tool call of ``step``."""
        _exit_once(self.fault_dir, "env", self.env_step, step)

    def trainer(self, step: int) -> None:
        """Called by rank 0 after it reported ``step``."""
        _exit_once(self.fault_dir, "trainer", self.trainer_step, step)


NO_FAULTS = Faults()


def _exit_once(fault_dir: str | None, who: str, at: int, step: int) -> None:
    if 0 <= at == step and fault_once(fault_dir, f"{who}-step{step}"):
        out = sys.__stdout__ or sys.stdout
        out.write(f"fault injection: the {who} process exits during step {step}\n")
        out.flush()
        os._exit(1)
