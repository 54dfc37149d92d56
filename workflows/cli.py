"""The ``tracerl`` command line.

Commands that run a configured job take ``--config PATH`` (default: the command's YAML in conf/)
and ``key=value`` overrides: ``allocator=grpo`` loads conf/allocator/grpo.yaml into the allocator
group, ``budget.num_roots=64`` sets one field. Flags such as ``--roots`` are shorthands for config
keys and are applied after the positional overrides.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.config import (
    BenchAllocationConfig,
    BenchEnvConfig,
    BenchRolloutConfig,
    BenchTrainConfig,
    BootstrapConfig,
    EvalConfig,
    RolloutConfig,
    StudyConfig,
    SweepConfig,
    TrainConfig,
)
from tracerl.config_loader import ConfigError, compose, conf_dir, to_yaml
from workflows.progress import Progress
from workflows.tracking import DEFAULT_URI, ENV_VAR, resolve_uri, where

# Messages and bars of long commands (workflows/progress.py): a bar on a terminal, plain lines in logs.
_progress = Progress()


@dataclass(frozen=True)
class Shorthand:
    flag: str
    keys: tuple[str, ...]
    help: str
    type: Callable[[str], Any] = int
    extra: tuple[str, ...] = ()  # fixed overrides that come with the flag


BENCH_ALLOCATION_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand(
        "--roots",
        ("budget.num_roots",),
        "M, bare rollouts a step (L = M (1 + N))",
        int,
        ("budget.num_leaves=null",),
    ),
    Shorthand("--continuations", ("budget.continuations",), "N, the continuation multiplier"),
    Shorthand("--workers", ("workers",), "parallel runs (Ray tasks); 1 = no Ray"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)


BENCH_TARGETS_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)


@dataclass(frozen=True)
class Command:
    schema: type
    config: str  # path under conf/
    flags: tuple[Shorthand, ...]
    run: Callable[[Any], int]


def _bench_allocation(cfg: BenchAllocationConfig) -> int:
    from workflows.bench_allocation import run_bench

    _progress(where(cfg.tracking))
    summary = run_bench(cfg, progress=_progress)
    from workflows.bench_allocation import format_table

    print(format_table(cfg, summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    if cfg.tracking.enabled:
        uri = resolve_uri(cfg.tracking.uri)
        print(f"MLflow: {len(summary['run_ids'])} runs in experiment '{cfg.tracking.experiment}' at {uri}")
        print(f"  open with: mlflow ui --backend-store-uri {uri}")
    return 0


def _bench_targets(cfg: BenchAllocationConfig) -> int:
    from workflows.bench_targets import format_targets_table, run_targets

    summary = run_targets(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_targets_table(summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_env(cfg: BenchEnvConfig) -> int:
    import json

    from workflows.bench_env import run_bench_env
    from workflows.lm_stack import SetupError

    try:
        result = run_bench_env(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    if cfg.json_path:
        Path(cfg.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_path).write_text(json.dumps(result.as_json(), indent=2))
        print(f"wrote {cfg.json_path}")
    return 0


def _bench_env_overrides(args: argparse.Namespace) -> None:
    """``bench env NAME [--gold]``: the positional environment name selects conf/env/NAME.yaml and the family's
    tiny policy (conf/model/tiny_NAME.yaml where it exists); ``--gold`` sets gold=true."""
    names = [x for x in args.overrides if "=" not in x]
    if len(names) > 1:
        raise ConfigError(f"bench env takes one environment name (got {', '.join(names)})")
    rest = [x for x in args.overrides if "=" in x]
    pre = []
    if names:
        pre.append(f"env={names[0]}")
        if (conf_dir() / "model" / f"tiny_{names[0]}.yaml").is_file():
            pre.append(f"model=tiny_{names[0]}")
    if getattr(args, "gold", False):
        pre.append("gold=true")
    args.overrides = pre + rest


def _bootstrap(cfg: BootstrapConfig) -> int:
    from workflows.bootstrap import bootstrap

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


def _rollout(cfg: RolloutConfig) -> int:
    from workflows.lm_stack import SetupError
    from workflows.rollout import run_rollout

    try:
        result = run_rollout(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    return 0


def _bench_rollout(cfg: BenchRolloutConfig) -> int:
    from workflows.bench_rollout import format_table, run_bench
    from workflows.lm_stack import SetupError

    try:
        summary = run_bench(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(format_table(cfg, summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


_OVERRIDES: list[str] = []  # the positional overrides of this invocation (train resume re-applies them)


def _train(cfg: TrainConfig) -> int:
    from tracerl.models.hf import SetupError  # not workflows.lm_stack: a bad input fails before torch loads
    from workflows.runs import format_summary
    from workflows.train import train

    try:
        if cfg.chaos.enabled and not cfg.resume:
            from workflows.chaos import drill_ok, run_drill

            summary = run_drill(cfg, _OVERRIDES, progress=_progress)
        else:
            summary = train(cfg, _OVERRIDES, progress=_progress)
    except (SetupError, FileNotFoundError, LookupError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0 if "chaos" not in summary or drill_ok(summary["chaos"]) else 1


def _sweep(cfg: SweepConfig) -> int:
    from workflows.lm_stack import SetupError
    from workflows.sweep import run_sweep

    try:
        s = run_sweep(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
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
    from workflows.lm_stack import SetupError
    from workflows.study import run_study

    try:
        s = run_study(
            cfg, _CONFIG_PATH[0] if _CONFIG_PATH else conf_dir() / "study/main.yaml", progress=_progress
        )
    except (SetupError, FileNotFoundError, LookupError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    if "report" in s:
        print(
            f"study {cfg.name}: MLflow parent run {s['parent_run_id']}; ran {len(s['ran'])} cells, skipped "
            f"{len(s['skipped'])}, failed {len(s['failed'])}; report in {Path(cfg.out_dir) / 'study.md'}"
        )
        for key, err in s["failed"].items():
            print(f"cell {key} failed: {err}", file=sys.stderr)
    return 1 if s.get("failed") else 0


def _bench_train(cfg: BenchTrainConfig) -> int:
    from workflows.bench_train import format_table, run_bench
    from workflows.lm_stack import SetupError

    try:
        summary = run_bench(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print(
        f"wrote {Path(cfg.bench_out) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _eval(cfg: EvalConfig) -> int:
    from tracerl.models.hf import SetupError  # not workflows.lm_stack: a bad input fails before torch loads
    from workflows.evaluate import run_eval

    try:
        result = run_eval(cfg, progress=_progress)
    except (SetupError, FileNotFoundError, LookupError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    return 0


def _register(args: argparse.Namespace) -> int:
    from workflows.registry import register

    try:
        v = register(args.run_id, args.name, args.alias, args.tracking_uri, progress=_progress)
    except (LookupError, FileNotFoundError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    alias = f" (alias {args.alias})" if args.alias else ""
    print(f"registered {args.name} version {v['version']}{alias} from run {args.run_id}: {v['source']}")
    print(
        f"  load with: mlflow.artifacts.download_artifacts('models:/{args.name}/{v['version']}') -> "
        "AutoModelForCausalLM.from_pretrained(<dir>/artifacts/policy)"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tracerl.config import TrackingConfig
    from workflows.compare import compare

    tracking = TrackingConfig(uri=args.tracking_uri, experiment=args.experiment or "tracerl")
    try:
        res = compare(tracking, args.experiment, args.run_ids, args.out, log_to_mlflow=not args.no_log)
    except LookupError as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(res.format(args.tracking_uri))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from workflows import submit as sub

    try:
        if args.status:
            print(sub.status(args.address, args.status))
            return 0
        if args.logs:
            print(sub.logs(args.address, args.logs), end="")
            return 0
        if args.stop:
            print("stopped" if sub.stop(args.address, args.stop) else "not running")
            return 0
        if not args.job:
            print(
                "tracerl: submit needs COMMAND (train, sweep, eval or study), or --status/--logs/--stop JOB_ID",
                file=sys.stderr,
            )
            return 2
        job_id, state = sub.submit(
            args.address, args.job[0], args.job[1:], args.working_dir, args.python, follow=not args.no_follow
        )
    except (ValueError, ConnectionError, RuntimeError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(f"job {job_id}: {state}")
    return 0 if state in ("SUCCEEDED", "PENDING") else 1


def _ui(args: argparse.Namespace) -> int:
    from workflows.mlflow_ui import serve

    return serve(args.tracking_uri, args.host, args.port, args.experiment, check=args.check)


ROLLOUT_FLAGS = (
    Shorthand("--steps", ("steps",), "steps to run (the predictor learns across them; the last is written)"),
    Shorthand("--out", ("out_dir",), "output directory", str),
    Shorthand("--roots", ("budget.num_roots",), "M, bare rollouts a step", int, ("budget.num_leaves=null",)),
    Shorthand("--continuations", ("budget.continuations",), "N, the continuation multiplier"),
)
BENCH_ROLLOUT_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "steps per allocator"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)

TRAIN_FLAGS = (
    Shorthand("--steps", ("steps",), "RL steps"),
    Shorthand("--seed", ("seed",), "seed"),
    Shorthand("--out", ("out_dir",), "checkpoint storage directory", str),
)
SWEEP_FLAGS = (
    Shorthand("--samples", ("num_samples",), "trials"),
    Shorthand("--steps", ("steps",), "RL steps per trial"),
    Shorthand("--name", ("sweep_name",), "sweep name (the same name resumes an interrupted sweep)", str),
)
BENCH_TRAIN_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
STUDY_FLAGS = (
    Shorthand("--json", ("json_path",), "also write study.json here", str),
    Shorthand("--out", ("out_dir",), "report directory", str),
    Shorthand("--only", ("only",), "select cells, e.g. testbed=math-habit,allocator=grpo", str),
)
STUDY_SWITCHES = {"--fresh": "fresh", "--report-only": "report_only", "--fill-tokens": "fill_tokens"}
EVAL_FLAGS = (
    Shorthand("--samples", ("samples",), "k for pass@k / avg@k (0: greedy only)"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)

BENCH_ENV_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--tasks", ("tasks",), "held-out tasks to run"),
)

BOOTSTRAP_FLAGS = (
    Shorthand("--out", ("out_dir",), "checkpoint directory", str),
    Shorthand("--seed", ("seed",), "seed for tasks, initialisation and training"),
)

COMMANDS: dict[str, Command] = {
    "bench allocation": Command(
        BenchAllocationConfig, "bench/allocation.yaml", BENCH_ALLOCATION_FLAGS, _bench_allocation
    ),
    "bench env": Command(BenchEnvConfig, "bench/env.yaml", BENCH_ENV_FLAGS, _bench_env),
    "bench targets": Command(
        BenchAllocationConfig, "bench/targets.yaml", BENCH_TARGETS_FLAGS, _bench_targets
    ),
    "bootstrap": Command(BootstrapConfig, "bootstrap/math.yaml", BOOTSTRAP_FLAGS, _bootstrap),
    "rollout": Command(RolloutConfig, "rollout/math.yaml", ROLLOUT_FLAGS, _rollout),
    "bench rollout": Command(BenchRolloutConfig, "bench/rollout.yaml", BENCH_ROLLOUT_FLAGS, _bench_rollout),
    "train": Command(TrainConfig, "train/default.yaml", TRAIN_FLAGS, _train),
    "sweep": Command(SweepConfig, "sweep/default.yaml", SWEEP_FLAGS, _sweep),
    "bench train": Command(BenchTrainConfig, "bench/train.yaml", BENCH_TRAIN_FLAGS, _bench_train),
    "eval": Command(EvalConfig, "eval/math.yaml", EVAL_FLAGS, _eval),
    "study": Command(StudyConfig, "study/main.yaml", STUDY_FLAGS, _study),
}


def _add_job_args(p: argparse.ArgumentParser, cmd: Command) -> None:
    p.add_argument("--config", help=f"config YAML (default: conf/{cmd.config})")
    for f in cmd.flags:
        p.add_argument(f.flag, type=f.type, help=f"{f.help} (sets {', '.join(f.keys)})")
    p.add_argument(
        "overrides", nargs="*", help="key=value overrides, e.g. allocator=grpo budget.num_roots=64"
    )


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


URI_HELP = f"MLflow tracking URI (default: ${ENV_VAR} when set, else {DEFAULT_URI})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracerl", description="TRACE rollout allocation for agentic RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    _add_job_args(
        bench_sub.add_parser("allocation", help="every allocator at equal leaf budget on the simulator"),
        COMMANDS["bench allocation"],
    )
    _add_job_args(
        bench_sub.add_parser("targets", help="bias of the predictor's fit targets vs the true V (simulator)"),
        COMMANDS["bench targets"],
    )
    _add_job_args(
        bench_sub.add_parser("rollout", help="allocators at equal leaves with the frozen tiny policy"),
        COMMANDS["bench rollout"],
    )
    _add_job_args(
        bench_sub.add_parser("train", help="training runs of TRACE and GRPO at equal leaves, several seeds"),
        COMMANDS["bench train"],
    )
    env_p = bench_sub.add_parser(
        "env",
        help="an environment's gold replay (--gold) or tiny policy pass@1: "
        "bench env [math|search|bfcl] [--gold] [--json PATH]",
    )
    _add_job_args(env_p, COMMANDS["bench env"])
    env_p.add_argument("--gold", action="store_true", help="replay the reference actions (sets gold=true)")
    _add_job_args(
        sub.add_parser(
            "bootstrap", help="build the built-in tiny policy (tokenizer + small LM, SFT warm start)"
        ),
        COMMANDS["bootstrap"],
    )
    _add_job_args(
        sub.add_parser("rollout", help="allocation-and-rollout steps; writes trees.jsonl and trees.html"),
        COMMANDS["rollout"],
    )
    _add_job_args(
        sub.add_parser("train", help="RL training on Ray Train workers, tracked in MLflow (resume=RUN_ID)"),
        COMMANDS["train"],
    )
    _add_job_args(
        sub.add_parser("eval", help="greedy pass@1, pass@k and avg@k of a checkpoint on a task set"),
        COMMANDS["eval"],
    )
    reg = sub.add_parser("register", help="register a training run's checkpoint in the MLflow Model Registry")
    reg.add_argument("run_id", help="MLflow run id of a `tracerl train` run")
    reg.add_argument("--name", required=True, help="registered model name")
    reg.add_argument("--alias", help="alias to point at the new version (e.g. champion)")
    reg.add_argument("--tracking-uri", help=URI_HELP)
    _add_job_args(
        sub.add_parser("sweep", help="Ray Tune + Optuna over the budget shape; each trial a train run"),
        COMMANDS["sweep"],
    )
    st = sub.add_parser(
        "study", help="the TRACE study: a grid of train runs under one MLflow parent run, and its report"
    )
    _add_job_args(st, COMMANDS["study"])
    st.add_argument("--fresh", action="store_true", help="re-run the selected cells even if they finished")
    st.add_argument("--report-only", action="store_true", help="rebuild the report from MLflow, run no cell")
    st.add_argument("--fill-tokens", action="store_true", help="write each testbed's T into the config file")
    sm = sub.add_parser(
        "submit",
        help="send train, sweep, eval or study to a Ray cluster (Ray Jobs); or --status/--logs/--stop",
    )
    sm.add_argument("--address", required=True, help="the cluster's job API, e.g. http://127.0.0.1:8265")
    sm.add_argument("--status", metavar="JOB_ID", help="print a job's status")
    sm.add_argument("--logs", metavar="JOB_ID", help="print a job's logs")
    sm.add_argument("--stop", metavar="JOB_ID", help="stop a job")
    sm.add_argument(
        "--no-follow", action="store_true", help="return after submitting instead of streaming logs"
    )
    sm.add_argument("--working-dir", default=".", help="uploaded as the job's working directory (default: .)")
    sm.add_argument("--python", help="run `PYTHON -m workflows.cli` instead of `tracerl` on the cluster")
    sm.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        help="COMMAND (train, sweep, eval, study) and its flags and overrides",
    )
    cmp = sub.add_parser("compare", help="training runs side by side: table and plots, also logged to MLflow")
    cmp.add_argument(
        "run_ids", nargs="*", help="MLflow run ids (default: every training run of the experiment)"
    )
    cmp.add_argument("--experiment", help="MLflow experiment (default: tracerl)")
    cmp.add_argument("--tracking-uri", help=URI_HELP)
    cmp.add_argument("--out", default="bench_out/compare", help="output directory (default: %(default)s)")
    cmp.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    ui = sub.add_parser("ui", help="start the MLflow UI on the tracking store and print its URL")
    ui.add_argument("--tracking-uri", help=URI_HELP)
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument(
        "--experiment", default="tracerl", help="experiment whose runs page to print (default: %(default)s)"
    )
    ui.add_argument(
        "--check", action="store_true", help="start, wait until it answers, print the URL and stop"
    )
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
        if args.command == "register":
            return _register(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "submit":
            return _submit(args)
        if args.command == "ui":
            return _ui(args)
        name = f"{args.command} {args.bench}" if args.command == "bench" else args.command
        if name == "bench env":
            _bench_env_overrides(args)
        return COMMANDS[name].run(load(name, args))
    except ConfigError as exc:
        print(f"tracerl: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
