"""What the ``tracerl`` subcommand modules share: flag shorthands, the job-command record, the record of a command
family added from outside the command rooms, progress output."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
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


JSON_FLAG = Shorthand("--json", ("json_path",), "also write the JSON summary here", str)
"""``--json``: where a bench also writes its JSON summary (``json_path``)."""


def out_flag(key: str = "out_dir", what: str = "output directory") -> Shorthand:
    """``--out``: the command's output directory, config key ``key``."""
    return Shorthand("--out", (key,), what, str)


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
class Variant:
    """A job that runs in place of a command's own for the resolved configs it claims, with that command's flags and
    config (``train`` with ``chaos.enabled``: the chaos drill; ``study`` of learning curves: the curves study)."""

    command: str  # the command it stands in for, as in COMMANDS ("train")
    claims: Callable[[Any], bool]  # whether it runs this resolved config
    run: Callable[
        [Any, list[str], Path], int
    ]  # (config, the overrides with the flags as keys, the config's path)


@dataclass(frozen=True)
class CommandFamily:
    """``tracerl bench`` subcommands that live outside the command rooms (the experiments), and the variants of other
    commands they run, found by the CLI as plug-ins are: ``tracerl.workflows.COMMAND_FAMILIES`` names the built-in
    ones, an installed package adds its own under the entry-point group ``tracerl.commands``
    (workflows/cli/families.py)."""

    commands: dict[str, Command]  # "bench peer" -> its job
    help: dict[str, str]  # "bench peer" -> its line in ``tracerl bench --help``
    switches: tuple[Switch, ...] = ()
    variants: tuple[Variant, ...] = ()  # only a built-in family's (workflows/cli/families.py)
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


def study_done(cfg: Any, s: Mapping[str, Any]) -> int:
    """``tracerl study``'s lines on a ``StudyResult`` (workflows/study/grid.py), of any kind of study: the parent
    run, the cells ran, skipped and failed, where the report is; 1 if a cell failed."""
    if "report" in s:
        print(
            f"study {cfg.name}: MLflow parent run {s['parent_run_id']}; ran {len(s['ran'])} cells, skipped "
            f"{len(s['skipped'])}, failed {len(s['failed'])}; report in {s['report_path']}"
        )
        for key, err in s["failed"].items():
            print(f"cell {key} failed: {err}", file=sys.stderr)
    return 1 if s.get("failed") else 0
