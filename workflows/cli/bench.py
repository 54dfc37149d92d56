"""``tracerl bench ...``: the benchmark subcommands (allocation, targets, baseline, rollout, train, env, testbeds, peer, limit,
update, sync), each a configured
job that prints a table and writes JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tracerl.config_loader import ConfigError, conf_dir
from tracerl.experiment_config import (
    BenchAllocationConfig,
    BenchEnvConfig,
    BenchPipelineConfig,
    BenchRolloutConfig,
    BenchTrainConfig,
)
from tracerl.workflows.bench.limit import BenchLimitConfig
from tracerl.workflows.bench.peer import BenchPeerConfig
from tracerl.workflows.bench.sync import BenchSyncConfig
from tracerl.workflows.bench.testbeds import BenchTestbedsConfig
from tracerl.workflows.bench.update import BenchUpdateConfig
from tracerl.workflows.cli.args import Command, Shorthand, add_job_args, progress
from tracerl.workflows.tracking.store import resolve_uri, where

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


BENCH_ROLLOUT_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "steps per allocator"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)

BENCH_TRAIN_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_PIPELINE_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "steps per seed and mode"),
    Shorthand("--seeds", ("seeds",), "seeds (interleaved: every mode per seed)"),
    Shorthand("--train-steps", ("train_steps",), "steps of each train run comparing train_modes (0: none)"),
    Shorthand(
        "--batching",
        ("batchings",),
        "sampler batching of the frozen steps, comma-separated: rounds, join (per-token join) or both",
        lambda s: f"[{s}]",
    ),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_TESTBEDS_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--only", ("only",), "measure these testbeds (comma-separated names)", str),
    Shorthand("--tasks", ("eval_tasks",), "held-out tasks per testbed"),
    Shorthand("--out", ("out_dir",), "output directory", str),
)
BENCH_PEER_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--seeds", ("seeds",), "seeds per side (the sides' order rotates each seed)"),
    Shorthand("--threads", ("threads",), "CPUs of every side (the first N of the affinity)"),
    Shorthand("--torch-threads", ("torch_threads",), "torch threads of TRL's process and tracerl's trainer"),
    Shorthand(
        "--sides",
        ("sides",),
        "sides to run, comma-separated: trl, grpo, trace (in-process), grpo-ray, trace-ray (on Ray)",
        lambda s: f"[{s}]",
    ),
    Shorthand("--model", ("model.path",), "the policy checkpoint every side starts from", str),
    Shorthand("--eval-every", ("eval_every",), "held-out accuracy every N steps (0: none; curves need it)"),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_LIMIT_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--steps", ("steps",), "steps of the real run (the first and the last are not measured)"),
    Shorthand("--repeats", ("repeats",), "timed repeats of each microbenchmark"),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_UPDATE_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--vocab", ("vocab",), "vocabulary size"),
    Shorthand("--hidden", ("hidden",), "hidden size (a multiple of 32)"),
    Shorthand("--layers", ("layers",), "decoder layers"),
    Shorthand("--tokens", ("tokens",), "tokens of the update's batch"),
    Shorthand("--micro-tokens", ("micro_tokens",), "token budget of a micro-batch (0: the whole batch)"),
    Shorthand("--dtype", ("dtype",), "compute dtype: float32 or bfloat16 (autocast)", str),
    Shorthand(
        "--chunks",
        ("logit_chunks",),
        "loss.logit_chunk of each case, comma-separated (0: unchunked)",
        lambda s: f"[{s}]",
    ),
    Shorthand("--max-gb", ("max_gb",), "address-space cap of each case's subprocess, GB (0: none)", float),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_SYNC_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--vocab", ("vocab",), "vocabulary size"),
    Shorthand("--hidden", ("hidden",), "hidden size (a multiple of 64)"),
    Shorthand("--layers", ("layers",), "decoder layers"),
    Shorthand("--samplers", ("samplers",), "hf sampler actors to push to"),
    Shorthand("--bucket-mb", ("bucket_mb",), "trainer.push_bucket_mb of the push"),
    Shorthand("--pushes", ("pushes",), "pushes (the first is a warm-up)"),
    Shorthand("--out", ("bench_out",), "output directory", str),
)
BENCH_ENV_FLAGS = (
    Shorthand("--json", ("json_path",), "also write the JSON summary here", str),
    Shorthand("--tasks", ("tasks",), "held-out tasks to run"),
)


def _bench_allocation(cfg: BenchAllocationConfig) -> int:
    from tracerl.workflows.bench.allocation import run_allocation_bench

    progress(where(cfg.tracking))
    summary = run_allocation_bench(cfg, progress=progress)
    from tracerl.workflows.bench.allocation import format_table

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
    from tracerl.workflows.bench.targets import format_targets_table, run_targets

    summary = run_targets(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_targets_table(summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_baseline(cfg: BenchAllocationConfig) -> int:
    from tracerl.workflows.bench.baseline import format_baseline_table, run_baseline

    summary = run_baseline(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_baseline_table(summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_env(cfg: BenchEnvConfig) -> int:
    import json

    from tracerl.workflows.bench.env import run_env_bench

    result = run_env_bench(cfg, progress=progress)
    print(result.format())
    if cfg.json_path:
        Path(cfg.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_path).write_text(json.dumps(result.as_json(), indent=2))
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
    from tracerl.workflows.bench.rollout import format_table, run_rollout_bench

    summary = run_rollout_bench(cfg, progress=progress)
    print(format_table(cfg, summary))
    print(
        f"\nwrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _lm_bench(
    cfg: BenchTrainConfig | BenchPipelineConfig | BenchLimitConfig | BenchUpdateConfig | BenchSyncConfig,
    run: Any,
    format_table: Any,
) -> int:
    """A benchmark of training steps on the LM stack: run, print its table, say where its JSON went."""

    summary = run(cfg, progress=progress)
    print(format_table(summary))
    print(
        f"wrote {Path(cfg.bench_out) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_train(cfg: BenchTrainConfig) -> int:
    from tracerl.workflows.bench.train import format_table, run_train_bench

    return _lm_bench(cfg, run_train_bench, format_table)


def _bench_pipeline(cfg: BenchPipelineConfig) -> int:
    from tracerl.workflows.pipeline.bench import format_table, run_pipeline_bench

    return _lm_bench(cfg, run_pipeline_bench, format_table)


def _bench_peer(cfg: BenchPeerConfig) -> int:
    from tracerl.workflows.bench.peer import run_peer_bench
    from tracerl.workflows.bench.peer_report import format_table

    try:
        summary = run_peer_bench(cfg, progress=progress)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print(
        f"wrote {Path(cfg.bench_out) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else "")
    )
    return 0


def _bench_limit(cfg: BenchLimitConfig) -> int:
    from tracerl.workflows.bench.limit import run_limit_bench
    from tracerl.workflows.bench.limit_report import format_table

    return _lm_bench(cfg, run_limit_bench, format_table)


def _bench_update(cfg: BenchUpdateConfig) -> int:
    from tracerl.workflows.bench.update import format_table, run_update_bench

    return _lm_bench(cfg, run_update_bench, format_table)


def _bench_sync(cfg: BenchSyncConfig) -> int:
    from tracerl.workflows.bench.sync import format_table, run_sync_bench

    return _lm_bench(cfg, run_sync_bench, format_table)


def _bench_testbeds(cfg: BenchTestbedsConfig) -> int:
    from tracerl.workflows.bench.probes import run_testbeds_bench
    from tracerl.workflows.bench.testbeds import format_table

    summary = run_testbeds_bench(cfg, progress=progress)
    print(format_table(summary))
    print(f"wrote {Path(cfg.out_dir) / 'results.json'}" + (f" and {cfg.json_path}" if cfg.json_path else ""))
    return 0


BENCH_COMMANDS: dict[str, Command] = {
    "bench allocation": Command(
        BenchAllocationConfig, "bench/allocation.yaml", BENCH_ALLOCATION_FLAGS, _bench_allocation
    ),
    "bench env": Command(BenchEnvConfig, "bench/env.yaml", BENCH_ENV_FLAGS, _bench_env),
    "bench targets": Command(
        BenchAllocationConfig, "bench/targets.yaml", BENCH_TARGETS_FLAGS, _bench_targets
    ),
    "bench baseline": Command(
        BenchAllocationConfig, "bench/baseline.yaml", BENCH_TARGETS_FLAGS, _bench_baseline
    ),
    "bench rollout": Command(BenchRolloutConfig, "bench/rollout.yaml", BENCH_ROLLOUT_FLAGS, _bench_rollout),
    "bench train": Command(BenchTrainConfig, "bench/train.yaml", BENCH_TRAIN_FLAGS, _bench_train),
    "bench pipeline": Command(
        BenchPipelineConfig, "bench/pipeline.yaml", BENCH_PIPELINE_FLAGS, _bench_pipeline
    ),
    "bench testbeds": Command(
        BenchTestbedsConfig, "bench/testbeds.yaml", BENCH_TESTBEDS_FLAGS, _bench_testbeds
    ),
    "bench peer": Command(BenchPeerConfig, "bench/peer.yaml", BENCH_PEER_FLAGS, _bench_peer),
    "bench limit": Command(BenchLimitConfig, "bench/limit.yaml", BENCH_LIMIT_FLAGS, _bench_limit),
    "bench update": Command(BenchUpdateConfig, "bench/update.yaml", BENCH_UPDATE_FLAGS, _bench_update),
    "bench sync": Command(BenchSyncConfig, "bench/sync.yaml", BENCH_SYNC_FLAGS, _bench_sync),
}
BENCH_HELP = {
    "allocation": "every allocator at equal leaf budget on the simulator",
    "targets": "bias of the predictor's fit targets vs the true V (simulator)",
    "baseline": "bias of the advantage baseline (leaf mean vs debiased node values) vs the true V (simulator)",
    "rollout": "allocators at equal leaves with the frozen tiny policy",
    "train": "training runs of TRACE and GRPO at equal leaves, several seeds",
    "pipeline": "barrier vs streaming steps (frozen policy) and, with --train-steps, barrier vs overlap in train runs",
    "testbeds": "acceptance of the study's testbeds: accuracy, depth profile, habit choices",
    "peer": "TRL's GRPOTrainer vs tracerl grpo and trace on the same work (needs `make bench-peer`'s venv)",
    "limit": "the embedded default's step at the limit this machine allows, next to a real step (per phase)",
    "update": "one learner update of a chosen shape: seconds, tokens/s, peak memory and the estimate",
    "sync": "a weight push of a chosen model size to N sampler actors: seconds, peak host memory per side",
    "env": "an environment's gold replay (--gold) or tiny policy pass@1: "
    "bench env [math|search|bfcl] [--gold] [--json PATH]",
}


def add_pipeline_sim(bench_sub: Any) -> None:
    """``bench pipeline --sim``: the scale model's flags, added to the CPU bench's ``pipeline`` parser when there
    is one, else on a ``pipeline`` parser of its own (the sim needs no config, Ray or model)."""
    p = bench_sub.choices.get("pipeline") or bench_sub.add_parser(
        "pipeline", help="the rollout pipeline: barrier vs streaming vs overlap (--sim: the scale model)"
    )
    p.add_argument("--sim", action="store_true", help="run the scale model (docs/pipeline_model.md)")
    p.add_argument(
        "--profile",
        action="append",
        help="a profile YAML (repeatable; default: every file in conf/bench/pipeline_profiles/)",
    )
    p.add_argument("--samplers", default="2,8,16,32,64", help="sampler counts S, comma-separated")
    p.add_argument("--validate", metavar="PATH", help="the CPU bench's JSON: error of the S = 2 prediction")
    if "--json" not in p._option_string_actions:
        p.add_argument("--json", help="also write the JSON summary here")


def bench_pipeline_sim(args: argparse.Namespace) -> int:
    """The scale model on every profile: a table, and the issue's "sim" JSON part (merged into ``--json``)."""
    import json

    from tracerl.workflows.pipeline.profile import load_profile, shipped_profiles
    from tracerl.workflows.pipeline.report import format_table, read_cpu, sim_entry

    if not getattr(args, "sim", False):
        print(
            "tracerl: the CPU part of bench pipeline is not on this branch; run bench pipeline --sim",
            file=sys.stderr,
        )
        return 2
    if getattr(args, "overrides", None):
        print(
            f"tracerl: bench pipeline --sim takes no key=value overrides (got {args.overrides})",
            file=sys.stderr,
        )
        return 2
    samplers = tuple(int(x) for x in args.samplers.split(","))
    if not samplers or min(samplers) < 1:
        raise ValueError(f"--samplers must be positive integers, got {args.samplers!r}")
    profiles = [load_profile(Path(x)) for x in (args.profile or shipped_profiles())]
    cpu = read_cpu(Path(args.validate)) if args.validate else None
    entries = [sim_entry(p, samplers, cpu if p.cpu_bench else None) for p in profiles]
    print(format_table(entries))
    path = getattr(args, "json", None)
    if path:
        out = Path(path)
        data = json.loads(out.read_text()) if out.is_file() else {}  # keep the CPU bench's part
        data["sim"] = entries
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2))
        print(f"wrote {out}")
    return 0


def add_parsers(sub: Any) -> None:
    """``bench`` and its subcommands, on ``sub`` (the top-level ``add_subparsers`` result)."""
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, text in BENCH_HELP.items():
        add_job_args(bench_sub.add_parser(name, help=text), BENCH_COMMANDS[f"bench {name}"])
    add_pipeline_sim(bench_sub)
    env_p = bench_sub.choices["env"]
    env_p.add_argument("--gold", action="store_true", help="replay the reference actions (sets gold=true)")
