"""The driver's part of a training checkpoint (``state.json`` beside the policy, predictor and trainer files).

A typed record rather than a dict, so the writer and every reader (restore, resume, latest-checkpoint search,
the Model Registry) agree on its fields. Checkpoints written before a field existed still load: a missing
``spent`` is the fresh run's (0, 0), a missing ``run_id`` is None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE = "state.json"


@dataclass(frozen=True)
class CheckpointState:
    """Where a run stood when the checkpoint was written."""

    step: int
    """RL steps completed (the next step to run)."""
    run_id: str | None = None
    """The MLflow run the checkpoint belongs to."""
    rng: Mapping[str, Any] = field(default_factory=dict)
    """The driver's numpy bit generator state (candidate pool, allocation ties); empty before the first save."""
    spent: tuple[float, float] = (0.0, 0.0)
    """Token mode: generated tokens and leaves so far (the mean cost of a leaf)."""

    def write(self, ckpt_dir: Path) -> None:
        (ckpt_dir / STATE).write_text(json.dumps({**asdict(self), "spent": list(self.spent)}))

    @classmethod
    def read(cls, ckpt_dir: Path | str) -> CheckpointState:
        """The state saved in ``ckpt_dir``.

        Raises:
            ValueError: the file is not a checkpoint state (says which file and what is wrong).
        """
        path = Path(ckpt_dir) / STATE
        try:
            raw = json.loads(path.read_text())
            spent = raw.get("spent", (0.0, 0.0))
            return cls(
                step=int(raw["step"]),
                run_id=raw.get("run_id"),
                rng=dict(raw.get("rng") or {}),
                spent=(float(spent[0]), float(spent[1])),
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path} is not a checkpoint state ({type(exc).__name__}: {exc})") from exc
