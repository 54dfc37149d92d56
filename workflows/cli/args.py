"""What the ``tracerl`` subcommand modules share: flag shorthands, the job-command record, progress output."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracerl.workflows.ops.progress import Progress

progress = Progress()
"""Messages and bars of long commands (workflows/ops/progress.py): a bar on a terminal, plain lines in logs."""


@dataclass(frozen=True)
class Shorthand:
    flag: str
    keys: tuple[str, ...]
    help: str
    type: Callable[[str], Any] = int
    extra: tuple[str, ...] = ()  # fixed overrides that come with the flag


@dataclass(frozen=True)
class Command:
    schema: type
    config: str  # path under conf/
    flags: tuple[Shorthand, ...]
    run: Callable[[Any], int]


def add_job_args(p: argparse.ArgumentParser, cmd: Command) -> argparse.ArgumentParser:
    """``--config``, the command's shorthand flags and the positional ``key=value`` overrides, on ``p``."""
    p.add_argument("--config", help=f"config YAML (default: conf/{cmd.config})")
    for f in cmd.flags:
        p.add_argument(f.flag, type=f.type, help=f"{f.help} (sets {', '.join(f.keys)})")
    p.add_argument(
        "overrides", nargs="*", help="key=value overrides, e.g. allocator=grpo budget.num_roots=64"
    )
    return p
