"""The experiments' ``tracerl bench`` subcommands: ``bench targets``, ``bench baseline``, ``bench testbeds``,
``bench update``, ``bench sync``, ``bench peer``, ``bench limit`` and the ``--sim`` switch of ``bench pipeline``, and
the variants of ``tracerl train`` that runs the chaos drill (``chaos.enabled``) and of ``tracerl study`` that runs
the learning-curve study (testbeds with ``stop_tokens``), as one command family (``FAMILY``)
that the CLI finds through ``tracerl.workflows.COMMAND_FAMILIES`` (workflows/cli/families.py) without importing this
room by name."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.config import TrainConfig
from tracerl.workflows.bench.config import BenchAllocationConfig
from tracerl.workflows.cli.args import (
    JSON_FLAG,
    Command,
    CommandFamily,
    Shorthand,
    Switch,
    Variant,
    out_flag,
    progress,
    run_bench,
    study_done,
)
from tracerl.workflows.experiments.config import (
    BenchLimitConfig,
    BenchPeerConfig,
    BenchSyncConfig,
    BenchTestbedsConfig,
    BenchUpdateConfig,
)
from tracerl.workflows.experiments.curve_cells import is_curve_study
from tracerl.workflows.experiments.limit import run_limit_bench
from tracerl.workflows.experiments.limit_report import format_table as format_limit_table
from tracerl.workflows.experiments.peer import run_peer_bench
from tracerl.workflows.experiments.peer_report import format_table as format_peer_table
from tracerl.workflows.experiments.pipeline_profile import load_profile, shipped_profiles
from tracerl.workflows.experiments.pipeline_report import format_table as format_sim_table
from tracerl.workflows.experiments.pipeline_report import read_cpu, sim_entry
from tracerl.workflows.experiments.sync import format_table as format_sync_table
from tracerl.workflows.experiments.sync import run_sync_bench
from tracerl.workflows.experiments.testbeds import format_table as format_testbeds_table
from tracerl.workflows.experiments.update import format_table as format_update_table
from tracerl.workflows.experiments.update import run_update_bench
from tracerl.workflows.study.config import StudyConfig

BENCH_TARGETS_FLAGS = (
    JSON_FLAG,
    Shorthand("--seeds", ("seeds",), "seeds per allocator"),
    Shorthand("--steps", ("steps",), "RL steps per run"),
    out_flag(),
)
BENCH_TESTBEDS_FLAGS = (
    JSON_FLAG,
    Shorthand("--only", ("only",), "measure these testbeds (comma-separated names)", str),
    Shorthand("--tasks", ("eval_tasks",), "held-out tasks per testbed"),
    out_flag(),
)
BENCH_UPDATE_FLAGS = (
    JSON_FLAG,
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
    out_flag("bench_out"),
)
BENCH_SYNC_FLAGS = (
    JSON_FLAG,
    Shorthand("--vocab", ("vocab",), "vocabulary size"),
    Shorthand("--hidden", ("hidden",), "hidden size (a multiple of 64)"),
    Shorthand("--layers", ("layers",), "decoder layers"),
    Shorthand("--samplers", ("samplers",), "hf sampler actors to push to"),
    Shorthand("--bucket-mb", ("bucket_mb",), "trainer.push_bucket_mb of the push"),
    Shorthand("--pushes", ("pushes",), "pushes (the first is a warm-up)"),
    out_flag("bench_out"),
)

BENCH_PEER_FLAGS = (
    JSON_FLAG,
    Shorthand("--steps", ("steps",), "RL steps per run"),
    Shorthand("--seeds", ("seeds",), "seeds per side (the sides' order rotates each seed)"),
    Shorthand(
        "--interleave",
        ("interleave",),
        "seed: the sides' whole runs one after another; step: the sides take turns, a step each",
        str,
    ),
    Shorthand("--threads", ("threads",), "CPUs of every side (the first N of the affinity)"),
    Shorthand("--torch-threads", ("torch_threads",), "torch threads of TRL's process and tracerl's trainer"),
    Shorthand(
        "--sides",
        ("sides",),
        "sides to run, comma-separated: trl, grpo, trace (in-process), grpo-ray, trace-ray (on Ray); side@T runs "
        "a side with T torch threads (trl@1,trl@2)",
        lambda s: f"[{s}]",
    ),
    Shorthand("--model", ("model.path",), "the policy checkpoint every side starts from", str),
    Shorthand("--eval-every", ("eval_every",), "held-out accuracy every N steps (0: none; curves need it)"),
    out_flag("bench_out"),
)
BENCH_LIMIT_FLAGS = (
    JSON_FLAG,
    Shorthand("--steps", ("steps",), "steps of the real run (the first and the last are not measured)"),
    Shorthand("--repeats", ("repeats",), "timed repeats of each microbenchmark"),
    out_flag("bench_out"),
)


def _wrote(out_dir: str, json_path: str | None, lead: str = "") -> None:
    print(f"{lead}wrote {Path(out_dir) / 'results.json'}" + (f" and {json_path}" if json_path else ""))


def _bench_targets(cfg: BenchAllocationConfig) -> int:
    # targets and baseline load the engine, torch and scipy: imported when run, so the CLI starts fast
    from tracerl.workflows.experiments.targets import format_targets_table, run_targets

    summary = run_targets(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_targets_table(summary))
    _wrote(cfg.out_dir, cfg.json_path, "\n")
    return 0


def _bench_baseline(cfg: BenchAllocationConfig) -> int:
    from tracerl.workflows.experiments.baseline import format_baseline_table, run_baseline

    summary = run_baseline(cfg, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_baseline_table(summary))
    _wrote(cfg.out_dir, cfg.json_path, "\n")
    return 0


def _bench_testbeds(cfg: BenchTestbedsConfig) -> int:
    # the engine and the samplers: slow to import
    from tracerl.workflows.experiments.probes import run_testbeds_bench

    summary = run_testbeds_bench(cfg, progress=progress)
    print(format_testbeds_table(summary))
    _wrote(cfg.out_dir, cfg.json_path)
    return 0


def _bench_update(cfg: BenchUpdateConfig) -> int:
    return run_bench(cfg, run_update_bench, format_update_table)


def _bench_sync(cfg: BenchSyncConfig) -> int:
    return run_bench(cfg, run_sync_bench, format_sync_table)


def _bench_peer(cfg: BenchPeerConfig) -> int:
    try:
        return run_bench(cfg, run_peer_bench, format_peer_table)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:  # no peer venv, a side that failed: one line
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2


def _bench_limit(cfg: BenchLimitConfig) -> int:
    return run_bench(cfg, run_limit_bench, format_limit_table)


def _chaos_drill(cfg: TrainConfig, overrides: list[str], config_path: Path) -> int:
    # the drill and the run summary load Ray and MLflow: imported when run, so the CLI starts fast
    from tracerl.workflows.experiments.chaos import drill_ok, run_drill
    from tracerl.workflows.tracking.runs import format_summary

    summary = run_drill(cfg, overrides, progress=progress)
    print(format_summary(summary))
    return 0 if drill_ok(summary["chaos"]) else 1


def _curves_study(cfg: StudyConfig, overrides: list[str], config_path: Path) -> int:
    # the grid and the curves report load MLflow, pandas and scipy: imported when run, so the CLI starts fast
    from tracerl.workflows.experiments.curve_study import CURVES
    from tracerl.workflows.study.grid import run_study

    return study_done(cfg, run_study(cfg, config_path, progress=progress, kind=CURVES))


def add_pipeline_sim(p: argparse.ArgumentParser) -> None:
    """``bench pipeline --sim``: the scale model's flags, on the CPU bench's ``pipeline`` parser (the sim needs no
    config, Ray or model)."""
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
    print(format_sim_table(entries))
    path = getattr(args, "json", None)
    if path:
        out = Path(path)
        data = json.loads(out.read_text()) if out.is_file() else {}  # keep the CPU bench's part
        data["sim"] = entries
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2))
        print(f"wrote {out}")
    return 0


FAMILY = CommandFamily(
    commands={
        "bench targets": Command(
            BenchAllocationConfig, "bench/targets.yaml", BENCH_TARGETS_FLAGS, _bench_targets
        ),
        "bench baseline": Command(
            BenchAllocationConfig, "bench/baseline.yaml", BENCH_TARGETS_FLAGS, _bench_baseline
        ),
        "bench testbeds": Command(
            BenchTestbedsConfig, "bench/testbeds.yaml", BENCH_TESTBEDS_FLAGS, _bench_testbeds
        ),
        "bench update": Command(BenchUpdateConfig, "bench/update.yaml", BENCH_UPDATE_FLAGS, _bench_update),
        "bench sync": Command(BenchSyncConfig, "bench/sync.yaml", BENCH_SYNC_FLAGS, _bench_sync),
        "bench peer": Command(BenchPeerConfig, "bench/peer.yaml", BENCH_PEER_FLAGS, _bench_peer),
        "bench limit": Command(BenchLimitConfig, "bench/limit.yaml", BENCH_LIMIT_FLAGS, _bench_limit),
    },
    help={
        "bench targets": "bias of the predictor's fit targets vs the true V (simulator)",
        "bench baseline": "bias of the advantage baseline (leaf mean vs debiased node values) vs the true V "
        "(simulator)",
        "bench testbeds": "acceptance of the study's testbeds: accuracy, depth profile, habit choices",
        "bench update": "one learner update of a chosen shape: seconds, tokens/s, peak memory and the estimate",
        "bench sync": "a weight push of a chosen model size to N sampler actors: seconds, peak host memory per side",
        "bench peer": "TRL's GRPOTrainer vs tracerl grpo and trace on the same work (needs `make bench-peer`'s venv)",
        "bench limit": "the embedded default's step at the limit this machine allows, next to a real step (per phase)",
    },
    switches=(Switch("bench pipeline", "sim", add_pipeline_sim, bench_pipeline_sim),),
    variants=(
        Variant("train", lambda cfg: cfg.chaos.enabled and not cfg.resume, _chaos_drill),
        Variant("study", is_curve_study, _curves_study),
    ),
    after={  # their lines in `tracerl bench --help` stay where they were before they moved here
        "bench targets": "bench allocation",
        "bench baseline": "bench targets",
        "bench testbeds": "bench pipeline",
        "bench update": "bench testbeds",
        "bench sync": "bench update",
    },
)
