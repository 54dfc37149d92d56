"""The experiments' ``tracerl bench`` subcommands: ``bench peer``, ``bench limit`` and the ``--sim`` switch of
``bench pipeline``, as one command family (``FAMILY``) that the CLI finds through
``tracerl.workflows.COMMAND_FAMILIES`` (workflows/cli/families.py) without importing this room by name."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.workflows.cli.args import Command, CommandFamily, Shorthand, Switch, run_bench
from tracerl.workflows.experiments.limit import BenchLimitConfig, run_limit_bench
from tracerl.workflows.experiments.limit_report import format_table as format_limit_table
from tracerl.workflows.experiments.peer import BenchPeerConfig, run_peer_bench
from tracerl.workflows.experiments.peer_report import format_table as format_peer_table
from tracerl.workflows.experiments.pipeline_profile import load_profile, shipped_profiles
from tracerl.workflows.experiments.pipeline_report import format_table as format_sim_table
from tracerl.workflows.experiments.pipeline_report import read_cpu, sim_entry

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


def _bench_peer(cfg: BenchPeerConfig) -> int:
    try:
        return run_bench(cfg, run_peer_bench, format_peer_table)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:  # no peer venv, a side that failed: one line
        print(f"tracerl: {exc}", file=sys.stderr)
        return 2


def _bench_limit(cfg: BenchLimitConfig) -> int:
    return run_bench(cfg, run_limit_bench, format_limit_table)


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
        "bench peer": Command(BenchPeerConfig, "bench/peer.yaml", BENCH_PEER_FLAGS, _bench_peer),
        "bench limit": Command(BenchLimitConfig, "bench/limit.yaml", BENCH_LIMIT_FLAGS, _bench_limit),
    },
    help={
        "bench peer": "TRL's GRPOTrainer vs tracerl grpo and trace on the same work (needs `make bench-peer`'s venv)",
        "bench limit": "the embedded default's step at the limit this machine allows, next to a real step (per phase)",
    },
    switches=(Switch("bench pipeline", "sim", add_pipeline_sim, bench_pipeline_sim),),
)
