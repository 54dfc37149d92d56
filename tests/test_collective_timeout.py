"""The trainer ranks' process-group timeout (trainer.collective_timeout_s): ranks 1..n wait in a broadcast while
rank 0 rolls out, so a rollout phase longer than the timeout would end the run. Two gloo ranks, rank 0 sleeping
before it broadcasts, as it does through a step's rollouts (workflows/train/setup.py, Worker.broadcast)."""

from __future__ import annotations

import datetime
import os
import socket
import time
from pathlib import Path

import torch

from tracerl.config import TrainerConfig

SLEEP_S = 4.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, timeout_s: float, out: str) -> None:
    """Rank 0 sleeps ``SLEEP_S`` (its rollouts), then broadcasts; rank 1 waits in the broadcast. Each writes what
    happened to ``out/rankN``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout_s)
    )
    if rank == 0:
        time.sleep(SLEEP_S)
    box: list[object] = [{"batch": 42} if rank == 0 else None]
    try:
        torch.distributed.broadcast_object_list(box, src=0)
        result = f"got {box[0]}"
    except RuntimeError as exc:
        result = f"failed: {str(exc).splitlines()[0]}"
    Path(out, f"rank{rank}").write_text(result)
    # Out at once, past every destructor: with the short timeout rank 0's send may complete after rank 1 gave up,
    # and tearing down its gloo group then aborted the process now and then ("terminate called without an active
    # exception"), which failed the spawn though both ranks had written what happened.
    os._exit(0)


def _run(tmp: Path, timeout_s: float) -> str:
    torch.multiprocessing.spawn(_rank, args=(_port(), timeout_s, str(tmp)), nprocs=2)
    return (tmp / "rank1").read_text()


def test_the_default_timeout_outlasts_rank_0s_rollouts_and_a_short_one_does_not(tmp_path: Path) -> None:
    default = TrainerConfig().collective_timeout_s
    assert default == 86400  # Ray Train's own default, 1800 s, is less than a long agentic rollout phase
    (tmp_path / "short").mkdir()
    (tmp_path / "default").mkdir()
    assert _run(tmp_path / "short", SLEEP_S / 4).startswith("failed:")  # what the 1800 s default does, scaled
    assert _run(tmp_path / "default", default) == "got {'batch': 42}"
