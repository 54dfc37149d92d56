"""The JSON summary of the simulator experiments (``bench targets``, ``bench baseline``; their runs are
``tracerl.workflows.bench.sim_runs.run_allocator``): its head, its table's, and where it is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.workflows.bench.config import BenchAllocationConfig


def sim_summary(cfg: BenchAllocationConfig, warm: int) -> dict[str, Any]:
    """The head of a simulator bench's JSON summary (steps, seeds, warm-up, the step's budget), with an empty
    ``allocators`` map for the bench to fill."""
    budget = {
        "leaves": cfg.budget.leaves,
        "roots": cfg.budget.roots,
        "continuations": cfg.budget.continuations,
    }
    return {"steps": cfg.steps, "seeds": cfg.seeds, "warmup_steps": warm, "budget": budget, "allocators": {}}


def sim_shape(summary: dict[str, Any]) -> str:
    """A simulator bench's run shape for its table's head: the step's budget, steps, seeds and warm-up."""
    b = summary["budget"]
    return (
        f"L={b['leaves']}, M={b['roots']}, N={b['continuations']}; {summary['steps']} steps x {summary['seeds']} "
        f"seeds, first {summary['warmup_steps']} left out"
    )


def write_summary(out_dir: Path, json_path: str | None, summary: dict[str, Any], table: str) -> None:
    """A simulator bench's table (``table.txt``) and JSON (``results.json``, and ``json_path`` where given)."""
    (out_dir / "table.txt").write_text(table + "\n")
    for p in [out_dir / "results.json"] + ([Path(json_path)] if json_path else []):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(summary, indent=2))
