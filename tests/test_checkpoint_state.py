"""The checkpoint's driver state: a typed record that round-trips, loads the old dict format, and names a damaged
file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracerl.workflows.tracking.checkpoint_state import STATE, CheckpointState
from tracerl.workflows.tracking.runs import latest_checkpoint


def test_round_trip_restores_the_generator(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rng.random(3)
    CheckpointState(4, "abc", rng.bit_generator.state, (120.0, 8.0)).write(tmp_path)
    back = CheckpointState.read(tmp_path)
    assert (back.step, back.run_id, back.spent) == (4, "abc", (120.0, 8.0))
    again = np.random.default_rng(0)
    again.bit_generator.state = back.rng
    assert again.random() == rng.random()


def test_a_checkpoint_saved_before_spent_existed_still_loads(tmp_path: Path) -> None:
    (tmp_path / STATE).write_text(json.dumps({"step": 2, "rng": {"bit_generator": "PCG64"}}))
    old = CheckpointState.read(tmp_path)
    assert (old.step, old.run_id, old.spent, dict(old.rng)) == (
        2,
        None,
        (0.0, 0.0),
        {"bit_generator": "PCG64"},
    )


def test_a_damaged_state_names_its_file(tmp_path: Path) -> None:
    (tmp_path / STATE).write_text('{"run_id": "x"}')
    with pytest.raises(ValueError, match=r"state\.json is not a checkpoint state \(KeyError"):
        CheckpointState.read(tmp_path)


def test_latest_checkpoint_skips_a_state_cut_short(tmp_path: Path) -> None:
    for step, text in ((1, None), (2, '{"step": 2, "rn')):
        d = tmp_path / f"checkpoint_{step:06d}"
        (d / "policy").mkdir(parents=True)
        for name in ("policy/config.json", "predictor.pt", "trainer_rank0.pt"):
            (d / name).write_text("{}")
        if text is None:
            CheckpointState(step).write(d)
        else:
            (d / STATE).write_text(text)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint_000001"
