"""What the ``tracerl`` subcommand modules share: flag shorthands, the job-command record, the record of a command
family added from outside the command rooms, progress output."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


@dataclass(frozen=True)
class Switch:
    """A flag on another command that hands the parsed arguments to ``run`` in place of that command's job
    (``bench pipeline --sim``: the scale model needs no config)."""

    command: str  # the command it switches, as in COMMANDS ("bench pipeline")
    dest: str  # the flag's argparse dest ("sim"); the switch runs when it is set
    add_arguments: Callable[[argparse.ArgumentParser], None]  # its flags, on the command's parser
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class CommandFamily:
    """``tracerl bench`` subcommands that live outside the command rooms (the experiments), found by the CLI as
    plug-ins are: ``tracerl.workflows.COMMAND_FAMILIES`` names the built-in ones, an installed package adds its own
    under the entry-point group ``tracerl.commands`` (workflows/cli/families.py)."""

    commands: dict[str, Command]  # "bench peer" -> its job
    help: dict[str, str]  # "bench peer" -> its line in ``tracerl bench --help``
    switches: tuple[Switch, ...] = ()
    after: dict[str, str] = field(default_factory=dict)  # "bench sync" -> the command its help line follows


def add_job_args(p: argparse.ArgumentParser, cmd: Command) -> argparse.ArgumentParser:
    """``--config``, the command's shorthand flags and the positional ``key=value`` overrides, on ``p``."""
    p.add_argument("--config", help=f"config YAML (default: conf/{cmd.config})")
    for f in cmd.flags:
        p.add_argument(f.flag, type=f.type, help=f"{f.help} (sets {', '.join(f.keys)})")
    p.add_argument(
        "overrides", nargs="*", help="key=value overrides, e.g. allocator=grpo budget.num_roots=64"
    )
    return p


def run_bench(cfg: Any, run: Callable[..., Any], format_table: Callable[[Any], str]) -> int:
    """A benchmark of training steps on the LM stack (``cfg`` has ``bench_out`` and ``json_path``): run, print its
    table, say where its JSON went."""
    summary = run(cfg, progress=progress)
    print(format_table(summary))
    print(
        f"wrote {Path(cfg.bench_out) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0
