"""A study's token-mode budget T (``testbeds.<testbed>.token_budget``): the mean generated tokens per step of the
testbed's leaves-mode grpo cells, written into the config by ``tracerl study --fill-tokens``."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.workflows.study.cells import TAG, enumerate_cells
from tracerl.workflows.study.config import StudyConfig


def token_budget_error(testbed: str, config_path: str | Path) -> str:
    return (
        f"token cells of testbed {testbed} need its T (testbeds.{testbed}.token_budget, null in {config_path}): "
        "T is the mean generated tokens per step over all steps of the testbed's leaves-mode grpo cells. Run "
        f"them first (--only testbed={testbed},budget=leaves,allocator=grpo), then write T into the config with "
        f"`tracerl study --config {config_path} --fill-tokens`"
    )


def write_token_budget(config_path: str | Path, testbed: str, tokens: int) -> None:
    """Set ``testbeds.<testbed>.token_budget`` in the YAML file, keeping its comments and layout."""
    path = Path(config_path)
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(rf"^\s+{re.escape(testbed)}:\s*$", ln)), None)
    if start is None:
        raise ValueError(f"{path} has no testbeds.{testbed} block to write token_budget into")
    indent = len(lines[start]) - len(lines[start].lstrip())
    for i in range(start + 1, len(lines)):
        ln = lines[i]
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        m = re.match(r"^(\s+token_budget:)\s*[^#\n]*(#.*)?$", ln.rstrip("\n"))
        if m:
            lines[i] = f"{m.group(1)} {tokens}" + (f"   {m.group(2)}" if m.group(2) else "") + "\n"
            path.write_text("".join(lines))
            return
    raise ValueError(f"{path}: testbeds.{testbed} has no token_budget line (add `token_budget: null`)")


def fill_tokens(
    cfg: StudyConfig,
    client: Any,
    exp_id: str,
    config_path: str | Path,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, int]:
    """T per testbed: mean generated tokens per step over all steps of its leaves-mode grpo cells, written into the
    config file once every one of those cells has finished (a testbed with some unfinished is left as it is)."""
    from tracerl.workflows.study.cell_runs import collect  # slow to import: pandas (study.cell_runs)

    parents = client.search_runs(
        [exp_id], filter_string=f"tags.`tracerl.command` = 'study' and tags.`{TAG}` = '{cfg.name}'"
    )
    if not parents:
        raise ValueError(f"no study {cfg.name!r} in MLflow yet: run its leaves-mode grpo cells first")
    cells = [
        c
        for p in parents
        for c in collect(client, exp_id, p.info.run_id, cfg.tracking)
        if c.budget == "leaves" and c.allocator == "grpo"
    ]
    want = {
        tb: {
            c.seed
            for c in enumerate_cells(cfg)
            if (c.testbed, c.budget, c.allocator) == (tb, "leaves", "grpo")
        }
        for tb in cfg.testbeds
    }
    filled = {}
    for tb in cfg.testbeds:
        cs = [c for c in cells if c.testbed == tb and c.steps]
        missing = sorted(want[tb] - {c.seed for c in cs})
        if not cs or missing:  # T is the mean over all of them: a partial mean would fix another T
            if cs:
                progress(
                    f"testbed {tb}: T not written, its leaves-mode grpo seeds {missing} have not finished"
                )
            continue
        t = round(sum(c.generated_tokens for c in cs) / sum(c.steps for c in cs))
        write_token_budget(config_path, tb, t)
        filled[tb] = t
    if not filled:
        raise ValueError(f"study {cfg.name!r} has no finished leaves-mode grpo cell to compute T from")
    return filled
