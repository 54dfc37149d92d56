"""``tracerl bench ...``: the benchmark subcommands of the command rooms (allocation, rollout, train, pipeline, env),
each a configured job that prints a table and writes JSON, and the parsers of those the command families add
(workflows/cli/families.py: the experiments' targets, baseline, testbeds, update, sync, peer, limit and
``pipeline --sim``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.config_loader import ConfigError, conf_dir
from tracerl.workflows.bench.config import (
    BenchAllocationConfig,
    BenchEnvConfig,
    BenchRolloutConfig,
    BenchTrainConfig,
)
from tracerl.workflows.cli.args import (
    JSON_FLAG,
    Command,
    CommandFamily,
    Shorthand,
    add_job_args,
    out_flag,
    progress,
    run_bench,
)
from tracerl.workflows.ops.results import write_json
from tracerl.workflows.pipeline.config import BenchPipelineConfig
from tracerl.workflows.tracking.store import resolve_uri, where

# Each command's module is imported inside its handler (tagged "CLI start-up" there): `tracerl --help` and every
# other command start without loading it (several load torch, Ray or MLflow).

BENCH_ALLOCATION_FLAGS = (
    JSON_FLAG,
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
    out_flag(),
)


BENCH_ROLLOUT_FLAGS = (
    JSON_FLAG,
    Shorthand("--steps", ("steps",), "steps per allocator"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    out_flag(),
)

BENCH_TRAIN_FLAGS = (
    JSON_FLAG,
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    out_flag("bench_out"),
)
BENCH_PIPELINE_FLAGS = (
    JSON_FLAG,
    Shorthand("--steps", ("steps",), "steps per seed and mode"),
    Shorthand("--seeds", ("seeds",), "seeds (interleaved: every mode per seed)"),
    Shorthand("--train-steps", ("train_steps",), "steps of each train run comparing train_modes (0: none)"),
    Shorthand(
        "--batching",
        ("batchings",),
        "sampler batching of the frozen steps, comma-separated: rounds, join (per-token join) or both",
        lambda s: f"[{s}]",
    ),
    out_flag("bench_out"),
)
BENCH_ENV_FLAGS = (
    JSON_FLAG,
    Shorthand("--tasks", ("tasks",), "held-out tasks to run"),
)


def _bench_allocation(cfg: BenchAllocationConfig) -> int:
    from tracerl.workflows.bench.allocation import format_table, run_allocation_bench  # CLI start-up

    progress(where(cfg.tracking))
    summary = run_allocation_bench(cfg, progress=progress)
    print(format_table(cfg, summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    if cfg.tracking.enabled:
        uri = resolve_uri(cfg.tracking.uri)
        print(f"MLflow: {len(summary['run_ids'])} runs in experiment '{cfg.tracking.experiment}' at {uri}")
        print(f"  open with: mlflow ui --backend-store-uri {uri}")
    return 0


def _bench_env(cfg: BenchEnvConfig) -> int:
    from tracerl.workflows.bench.env import run_env_bench  # CLI start-up

    result = run_env_bench(cfg, progress=progress)
    print(result.format())
    if cfg.json_path:
        write_json(cfg.json_path, result.as_json())
        print(f"wrote {cfg.json_path}")
    return 0


def bench_env_overrides(args: argparse.Namespace) -> None:
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


def _bench_rollout(cfg: BenchRolloutConfig) -> int:
    from tracerl.workflows.bench.rollout import format_table, run_rollout_bench  # CLI start-up

    summary = run_rollout_bench(cfg, progress=progress)
    print(format_table(cfg, summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_train(cfg: BenchTrainConfig) -> int:
    from tracerl.workflows.bench.train import format_table, run_train_bench  # CLI start-up

    return run_bench(cfg, run_train_bench, format_table)


def _bench_pipeline(cfg: BenchPipelineConfig) -> int:
    from tracerl.workflows.pipeline.bench import format_table, run_pipeline_bench  # CLI start-up

    return run_bench(cfg, run_pipeline_bench, format_table)


BENCH_COMMANDS: dict[str, Command] = {
    "bench allocation": Command(
        BenchAllocationConfig, "bench/allocation.yaml", BENCH_ALLOCATION_FLAGS, _bench_allocation
    ),
    "bench env": Command(BenchEnvConfig, "bench/env.yaml", BENCH_ENV_FLAGS, _bench_env),
    "bench rollout": Command(BenchRolloutConfig, "bench/rollout.yaml", BENCH_ROLLOUT_FLAGS, _bench_rollout),
    "bench train": Command(BenchTrainConfig, "bench/train.yaml", BENCH_TRAIN_FLAGS, _bench_train),
    "bench pipeline": Command(
        BenchPipelineConfig, "bench/pipeline.yaml", BENCH_PIPELINE_FLAGS, _bench_pipeline
    ),
}
BENCH_HELP = {
    "allocation": "every allocator at equal leaf budget on the simulator",
    "rollout": "allocators at equal leaves with the frozen tiny policy",
    "train": "training runs of TRACE and GRPO at equal leaves, several seeds",
    "pipeline": "barrier vs streaming steps (frozen policy) and, with --train-steps, barrier vs overlap in train runs",
    "env": "an environment's gold replay (--gold) or tiny policy pass@1: "
    "bench env [math|search|bfcl] [--gold] [--json PATH]",
}


def add_parsers(sub: Any, families: Sequence[CommandFamily] = ()) -> None:
    """``bench`` and its subcommands, on ``sub`` (the top-level ``add_subparsers`` result): the command rooms' and
    those of ``families``, each family's command listed after the command its ``after`` names (else at the end),
    then the families' switches (``bench pipeline --sim``)."""
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    lines = [(f"bench {name}", text, BENCH_COMMANDS[f"bench {name}"]) for name, text in BENCH_HELP.items()]
    for family in families:
        for name, text in family.help.items():
            names = [line[0] for line in lines]
            anchor = family.after.get(name)
            at = names.index(anchor) + 1 if anchor in names else len(lines)
            lines.insert(at, (name, text, family.commands[name]))
    for name, text, cmd in lines:
        add_job_args(bench_sub.add_parser(name.removeprefix("bench "), help=text), cmd)
    for family in families:
        for switch in family.switches:
            switch.add_arguments(bench_sub.choices[switch.command.removeprefix("bench ")])
    env_p = bench_sub.choices["env"]
    env_p.add_argument("--gold", action="store_true", help="replay the reference actions (sets gold=true)")
