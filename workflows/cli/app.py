"""The ``tracerl`` command line.

Commands that run a configured job take ``--config PATH`` (default: the command's YAML in conf/)
and ``key=value`` overrides: ``allocator=grpo`` loads conf/allocator/grpo.yaml into the allocator
group, ``budget.num_roots=64`` sets one field. Flags such as ``--roots`` are shorthands for config
keys and are applied after the positional overrides.

This module has the job commands (bootstrap, sft, rollout, train, sweep, study, eval), the parser and ``main``;
the benchmarks are in workflows/cli/bench.py, the commands on tracked runs and clusters (register, compare,
submit, ui) in workflows/cli/runs.py, and the bench commands of the families outside the command rooms (the
experiments) come through workflows/cli/families.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.config import EvalConfig, RolloutConfig, TrainConfig
from tracerl.config_loader import ConfigError, compose, conf_dir, to_yaml
from tracerl.models.hf import SetupError
from tracerl.workflows.bootstrap.config import BootstrapConfig, SFTConfig
from tracerl.workflows.cli import bench as cli_bench
from tracerl.workflows.cli import runs as cli_mlflow
from tracerl.workflows.cli.args import Command, Shorthand, add_job_args, out_flag, study_done
from tracerl.workflows.cli.args import progress as _progress
from tracerl.workflows.cli.families import load_families
from tracerl.workflows.ops.disk import EXIT_CODE, DiskFull, no_space
from tracerl.workflows.ops.ray_utils import exit_code
from tracerl.workflows.study.config import StudyConfig, SweepConfig
from tracerl.workflows.tracking.spool import PENDING_EXIT_CODE, MetricsPending
from tracerl.workflows.tracking.store import resolve_uri

# Each command's module is imported inside its handler (tagged "CLI start-up" there): `tracerl --help` and every
# other command start without loading it (several load torch, Ray or MLflow).


def _bootstrap(cfg: BootstrapConfig) -> int:
    from tracerl.workflows.bootstrap.policy import bootstrap  # CLI start-up

    m = bootstrap(cfg, progress=_progress)
    g, s = m["greedy"], m["sampled"]
    print(
        f"tiny policy in {cfg.out_dir}: {m['parameters'] / 1e6:.2f} M parameters, {m['train_steps']} steps, "
        f"final loss {m['final_loss']:.4f}, {m['total_s']:.0f} s"
    )
    print(
        f"held-out ({m['eval_tasks']} tasks): greedy accuracy {g['accuracy']:.3f}, sampled pass@1 {s['accuracy']:.3f} "
        f"(T={cfg.eval_temperature}), well-formed turns {s['well_formed_turns']:.3f}"
    )
    print("  by level (sampled): " + ", ".join(f"{k} {v:.2f}" for k, v in s["by_level"].items()))
    return 0


def _sft(cfg: SFTConfig) -> int:
    from tracerl.workflows.bootstrap.sft import run_sft  # CLI start-up

    print(run_sft(cfg, progress=_progress).format())
    return 0


def _rollout(cfg: RolloutConfig) -> int:
    from tracerl.workflows.lm.rollout import run_rollout  # CLI start-up

    result = run_rollout(cfg, progress=_progress)
    print(result.format())
    return 0


_OVERRIDES: list[str] = []  # the positional overrides of this invocation (train resume re-applies them)


def _train(cfg: TrainConfig) -> int:
    # CLI start-up
    import psutil  # CLI start-up: only a training run reads its process's start time

    from tracerl.workflows.tracking.runs import format_summary
    from tracerl.workflows.train.run import train

    # time/startup_s counts from this process's start (interpreter and imports included)
    summary = train(cfg, _OVERRIDES, progress=_progress, launched=psutil.Process().create_time())
    print(format_summary(summary))
    return 0


def _sweep(cfg: SweepConfig) -> int:
    from tracerl.workflows.study.sweep import run_sweep  # CLI start-up

    s = run_sweep(cfg, progress=_progress)
    if s.get("interrupted"):
        return 130  # like a shell's Ctrl-C
    for t in s["trials"]:
        print(
            f"{t['trial']}: {t['config']}  {cfg.metric} (last) = {t['metric_last']}"
            + (f"  stopped early by {cfg.scheduler} after {t['steps']} steps" if t["stopped_early"] else "")
            + (f"  ERROR {t['error']}" if t["error"] else "")
        )
    if "best_config" in s:
        print(f"best ({cfg.metric}, {cfg.mode}, scope {cfg.scope}): {s['best_config']}")
    print(
        f"MLflow parent run {s['parent_run_id']} ({s['tracking_uri']}); {s['wall_s']:.0f} s; "
        f"compare with: tracerl compare --tracking-uri {s['tracking_uri']}"
    )
    return 0 if "best_config" in s else 1


_CONFIG_PATH: list[str] = []  # the --config of this invocation (study --fill-tokens writes T into it)


def _study(cfg: StudyConfig) -> int:
    from tracerl.workflows.study.grid import run_study  # CLI start-up

    path = _CONFIG_PATH[0] if _CONFIG_PATH else conf_dir() / "study/main.yaml"
    return study_done(cfg, run_study(cfg, path, progress=_progress))


def _eval(cfg: EvalConfig) -> int:
    from tracerl.workflows.train.evaluate import run_eval  # CLI start-up

    result = run_eval(cfg, progress=_progress)
    print(result.format())
    return 0


ROLLOUT_FLAGS = (
    Shorthand("--steps", ("steps",), "steps to run (the predictor learns across them; the last is written)"),
    out_flag(),
    Shorthand("--roots", ("budget.num_roots",), "M, bare rollouts a step", int, ("budget.num_leaves=null",)),
    Shorthand("--continuations", ("budget.continuations",), "N, the continuation multiplier"),
)
TRAIN_FLAGS = (
    Shorthand("--steps", ("steps",), "RL steps"),
    Shorthand("--seed", ("seed",), "seed"),
    out_flag(what="checkpoint storage directory"),
)
SWEEP_FLAGS = (
    Shorthand("--samples", ("num_samples",), "trials"),
    Shorthand("--steps", ("steps",), "RL steps per trial"),
    Shorthand("--name", ("sweep_name",), "sweep name (the same name resumes an interrupted sweep)", str),
)
STUDY_FLAGS = (
    Shorthand("--json", ("json_path",), "also write study.json here", str),
    out_flag(what="report directory"),
    Shorthand("--only", ("only",), "select cells, e.g. testbed=math-habit,allocator=grpo", str),
)
STUDY_SWITCHES = {"--fresh": "fresh", "--report-only": "report_only", "--fill-tokens": "fill_tokens"}
EVAL_FLAGS = (
    Shorthand("--samples", ("samples",), "k for pass@k / avg@k (0: greedy only)"),
    out_flag(),
)

BOOTSTRAP_FLAGS = (
    out_flag(what="checkpoint directory"),
    Shorthand("--seed", ("seed",), "seed for tasks, initialisation and training"),
)

SFT_FLAGS = (
    Shorthand("--steps", ("steps",), "optimiser steps"),
    Shorthand("--seed", ("seed",), "seed of the batch order"),
)

COMMANDS: dict[str, Command] = {
    **cli_bench.BENCH_COMMANDS,
    "bootstrap": Command(BootstrapConfig, "bootstrap/math.yaml", BOOTSTRAP_FLAGS, _bootstrap),
    "sft": Command(SFTConfig, "sft/smollm2_math.yaml", SFT_FLAGS, _sft),
    "rollout": Command(RolloutConfig, "rollout/math.yaml", ROLLOUT_FLAGS, _rollout),
    "train": Command(TrainConfig, "train/default.yaml", TRAIN_FLAGS, _train),
    "sweep": Command(SweepConfig, "sweep/default.yaml", SWEEP_FLAGS, _sweep),
    "eval": Command(EvalConfig, "eval/math.yaml", EVAL_FLAGS, _eval),
    "study": Command(StudyConfig, "study/main.yaml", STUDY_FLAGS, _study),
}
FAMILIES = load_families(taken=COMMANDS)
for _family in FAMILIES:
    COMMANDS.update(_family.commands)
SWITCHES = [switch for family in FAMILIES for switch in family.switches]
VARIANTS = [variant for family in FAMILIES for variant in family.variants]
JOB_HELP = {
    "bootstrap": "build the built-in tiny policy (tokenizer + small LM, SFT warm start)",
    "sft": "warm-start a pretrained chat model on reference traces in its own template (SFT before RL)",
    "rollout": "allocation-and-rollout steps; writes trees.jsonl and trees.html",
    "train": "RL training on Ray Train workers, tracked in MLflow (resume=RUN_ID)",
    "eval": "greedy pass@1, pass@k and avg@k of a checkpoint on a task set",
    "sweep": "Ray Tune + Optuna over the budget shape; each trial a train run",
    "study": "the TRACE study: a grid of train runs under one MLflow parent run, and its report",
}


def load(name: str, args: argparse.Namespace) -> Any:
    """The resolved, validated config of command ``name`` from parsed arguments."""
    cmd = COMMANDS[name]
    overrides = list(args.overrides)
    for f in cmd.flags:
        value = getattr(args, f.flag.lstrip("-").replace("-", "_"))
        if value is not None:
            overrides += [f"{k}={value}" for k in f.keys] + list(f.extra)
    for key in STUDY_SWITCHES.values() if name == "study" else ():
        if getattr(args, key, False):
            overrides.append(f"{key}=true")
    _OVERRIDES[:] = overrides
    _CONFIG_PATH[:] = [args.config] if getattr(args, "config", None) else []
    return compose(cmd.schema, args.config or conf_dir() / cmd.config, overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracerl", description="TRACE rollout allocation for agentic RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_bench.add_parsers(sub, FAMILIES)
    jobs = {
        name: add_job_args(sub.add_parser(name, help=text), COMMANDS[name]) for name, text in JOB_HELP.items()
    }
    st = jobs["study"]
    st.add_argument("--fresh", action="store_true", help="re-run the selected cells even if they finished")
    st.add_argument("--report-only", action="store_true", help="rebuild the report from MLflow, run no cell")
    st.add_argument("--fill-tokens", action="store_true", help="write each testbed's T into the config file")
    cli_mlflow.add_parsers(sub)
    show = sub.add_parser("config", help="print a command's resolved config")
    show.add_argument(
        "job", choices=sorted(c.replace(" ", "-") for c in COMMANDS), help="which command's config"
    )
    show.add_argument("--config", help="config YAML (default: the command's)")
    show.add_argument("overrides", nargs="*", help="key=value overrides")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may come after flags (`--out DIR key=value`): argparse leaves those over; anything else is an error.
    bad = [x for x in extra if x.startswith("-") or "=" not in x]
    if bad or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(bad or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    if hasattr(args, "tracking_uri"):
        args.tracking_uri = resolve_uri(args.tracking_uri)
    try:
        if args.command == "config":
            name = args.job.replace("-", " ")
            args.__dict__.update({f.flag.lstrip("-").replace("-", "_"): None for f in COMMANDS[name].flags})
            print(to_yaml(load(name, args)), end="")
            return 0
        if args.command in cli_mlflow.HANDLERS:
            return cli_mlflow.HANDLERS[args.command](args)
        name = f"{args.command} {args.bench}" if args.command == "bench" else args.command
        for switch in SWITCHES:  # e.g. bench pipeline --sim: the switch's own job in place of the command's
            if switch.command == name and getattr(args, switch.dest, False):
                return switch.run(args)
        if name == "bench env":
            cli_bench.bench_env_overrides(args)
        cfg = load(name, args)
        for variant in VARIANTS:  # e.g. train with chaos.enabled: the chaos drill in place of the run
            if variant.command == name and variant.claims(cfg):
                path = _CONFIG_PATH[0] if _CONFIG_PATH else conf_dir() / COMMANDS[name].config
                return variant.run(cfg, list(_OVERRIDES), Path(path))
        return COMMANDS[name].run(cfg)
    except ConfigError as exc:
        print(f"tracerl: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP: every finally has run; no traceback
        print(
            f"tracerl: {str(exc) or 'interrupted'}; what ran is kept (a run is marked KILLED)",
            file=sys.stderr,
        )
        return exit_code(exc)
    except Exception as exc:  # noqa: BLE001 - user errors are one line; anything else keeps its traceback
        if os.environ.get(DEBUG_ENV):
            raise
        if isinstance(exc, MetricsPending):  # the run is done, its metrics wait for the server: exit 75
            print(f"tracerl: {exc}", file=sys.stderr)
            return PENDING_EXIT_CODE
        full = no_space(
            exc
        )  # a full disk or quota, however wrapped (Ray's, MLflow's errors): its own exit code
        if full is not None:
            print(f"tracerl: {exc if isinstance(exc, DiskFull) else DiskFull(full)}", file=sys.stderr)
            return EXIT_CODE
        if not isinstance(exc, user_errors()):
            raise
        print(f"tracerl: {one_line(exc)}", file=sys.stderr)
        return 2


DEBUG_ENV = "TRACERL_DEBUG"
"""Set (to anything) to see the traceback of a user error instead of its one line."""


def user_errors() -> tuple[type[BaseException], ...]:
    """What a user can cause or meet and fix without reading code, printed by ``main`` as one line, exit 2.

    The one place the CLI turns errors into lines (every command's handler lets them through): a missing or
    unreadable file and any other OSError (its text names the path; a full disk, however wrapped, is
    ``tracerl.workflows.ops.disk.DiskFull``'s line and exit 28 instead), an unreachable server
    (ConnectionError is an OSError), an unknown name (LookupError), a bad value, a set-up the user must fix
    (SetupError), a job API that refused a job. A bug is none of these and keeps its traceback.
    """
    # CLI start-up: ops.submit loads asyncio (tens of ms), needed here only to report an error
    from tracerl.workflows.ops.submit import JobAPIError

    return (SetupError, JobAPIError, OSError, LookupError, ValueError)


def one_line(exc: BaseException) -> str:
    """The error's message on one line; an OSError without one (errno only) says its strerror and path."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{exc.strerror or text}: {exc.filename}"
    return " ".join(text.split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
