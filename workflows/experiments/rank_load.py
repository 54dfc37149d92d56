"""``tracerl bench update startup_ranks=N``: the host memory a training run's set-up takes on each of N FSDP ranks.

The model of ``tracerl bench update``'s shape is saved once as a checkpoint (with the tiny policy's tokenizer); then
N gloo ranks, in their own processes, do what ``tracerl train``'s set-up does with it (workflows/train/setup.py):
``load_model``, FSDP2 sharding, and, in the ``from_rank0`` case, rank 0's weights broadcast into the other ranks'
shards (``fill_from_rank0``). The ``every_rank`` case is the set-up before that change: every rank reads the whole
model, then shards it. A rank's row is the growth of its peak resident set size (``VmHWM``) from just before
loading to the end of set-up, and the growth it still holds then.
"""

from __future__ import annotations

import datetime
import gc
import json
import multiprocessing
import os
import shutil
import socket
from pathlib import Path
from typing import Any

CASES = ("every_rank", "from_rank0")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in bytes (``VmRSS``: now; ``VmHWM``: the peak since the last reset)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _reset_peak() -> None:
    """``VmHWM`` back to the current RSS (Linux ``clear_refs`` 5). ``ru_maxrss`` cannot be used: a spawned child
    keeps its parent's peak across ``execve``, and the parent holds the model it saved."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _rank(rank: int, world: int, port: int, path: str, case: str, out: Any) -> None:
    import torch

    from tracerl.config import ModelConfig, TrainConfig, TrainerConfig
    from tracerl.models.wrap import fill_from_rank0, fully_shard_model, is_meta
    from tracerl.workflows.train.setup import load_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
    )
    cfg = TrainConfig(model=ModelConfig(path=path), trainer=TrainerConfig(strategy="fsdp"))
    from_rank0 = case == "from_rank0"
    load_model(
        cfg, None, weights=False
    )  # the modelling code imported (meta device: no weights) before the peak resets
    gc.collect()
    _reset_peak()
    start = _status("VmRSS")
    _, model = load_model(cfg, None, weights=rank == 0 or not from_rank0)
    whole = model.state_dict() if from_rank0 and rank == 0 else None
    model = fully_shard_model(model)
    if is_meta(model):
        model.to_empty(device=torch.device("cpu"))
    if from_rank0:
        fill_from_rank0(model, whole, torch.device("cpu"))
        del whole
    gc.collect()
    torch.distributed.barrier()
    out.put(
        {
            "case": case,
            "rank": rank,
            "peak_growth_bytes": _status("VmHWM") - start,
            "held_growth_bytes": _status("VmRSS") - start,
        }
    )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def save_checkpoint(model: Any, out: Path) -> Path:
    """``model`` as an HF checkpoint directory under ``out`` in bfloat16 with the tiny policy's tokenizer (set-up
    reads one). A float32 file would be read by mapping it (its pages shared by every rank, not each rank's own),
    which no real run's bfloat16 checkpoint read into float32 master weights is."""
    import torch

    tiny = Path(__file__).resolve().parents[2] / "models" / "tiny-math"
    path = out / "startup-checkpoint"
    model.to(torch.bfloat16).save_pretrained(
        path
    )  # as released checkpoints are; set-up reads it into float32
    for name in TOKENIZER_FILES:
        if (tiny / name).exists():
            shutil.copy(tiny / name, path / name)
    return path


def run_startup_bench(model: Any, ranks: int, out: Path, progress: Any = lambda s: None) -> dict[str, Any]:
    """Both cases on ``ranks`` gloo ranks; one row per rank and case."""
    params = sum(p.numel() for p in model.parameters())
    path = save_checkpoint(model, out)
    del model
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for case in CASES:
        progress(f"start-up: {ranks} FSDP ranks, {case}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, ranks, port, str(path), case, q)) for r in range(ranks)]
        for p in procs:
            p.start()
        got = [q.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join()
        rows += sorted(got, key=lambda r: r["rank"])
    return {"ranks": ranks, "params": params, "model_bytes_fp32": 4 * params, "startup": rows}


def format_startup(summary: dict[str, Any]) -> str:
    lines = [
        f"start-up of {summary['ranks']} FSDP ranks, {summary['params'] / 1e6:.0f} M parameters "
        f"({summary['model_bytes_fp32'] / 1e9:.2f} GB in float32)",
        f"{'case':>10} {'rank':>4} {'peak growth GB':>14} {'held growth GB':>14}",
    ]
    for r in summary["startup"]:
        lines.append(
            f"{r['case']:>10} {r['rank']:>4} {r['peak_growth_bytes'] / 1e9:>14.2f} {r['held_growth_bytes'] / 1e9:>14.2f}"
        )
    return "\n".join(lines)


def dump(summary: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
