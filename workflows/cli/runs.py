"""``tracerl register``, ``compare``, ``submit``, ``sync`` and ``ui``: commands on runs already tracked in MLflow, and on a
Ray cluster; they take plain flags, not a job config."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracerl.config import TrackingConfig
from tracerl.workflows.cli.args import progress
from tracerl.workflows.tracking.store import DEFAULT_URI, ENV_VAR

# Each command's module is imported inside its handler (tagged "CLI start-up" there): `tracerl --help` and every
# other command start without loading it (several load torch, Ray or MLflow).

URI_HELP = f"MLflow tracking URI (default: ${ENV_VAR} when set, else {DEFAULT_URI})"


def _register(args: argparse.Namespace) -> int:
    from tracerl.workflows.tracking.model_registry import register  # CLI start-up

    v = register(args.run_id, args.name, args.alias, args.tracking_uri, progress=progress)
    alias = f" (alias {args.alias})" if args.alias else ""
    print(f"registered {args.name} version {v['version']}{alias} from run {args.run_id}: {v['source']}")
    print(
        f"  load with: mlflow.artifacts.download_artifacts('models:/{args.name}/{v['version']}') -> "
        "AutoModelForCausalLM.from_pretrained(<dir>/artifacts/policy)"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tracerl.workflows.tracking.compare import compare  # CLI start-up

    tracking = TrackingConfig(uri=args.tracking_uri, experiment=args.experiment or "tracerl")
    res = compare(tracking, args.experiment, args.run_ids, args.out, log_to_mlflow=not args.no_log)
    print(res.format(args.tracking_uri))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from tracerl.workflows.ops import submit as sub  # CLI start-up

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
    print(f"job {job_id}: {state}")
    return 0 if state in ("SUCCEEDED", "PENDING") else 1


def _sync(args: argparse.Namespace) -> int:
    from tracerl.workflows.tracking.sync import sync_run  # CLI start-up

    sent, status = sync_run(args.run_id, args.tracking_uri, say=progress)
    done = f"status {status} recorded" if status else "no final status was waiting"
    print(f"MLflow run {args.run_id}: {sent} spooled metrics sent, {done}")
    return 0


def _ui(args: argparse.Namespace) -> int:
    from tracerl.workflows.tracking.ui import serve  # CLI start-up

    return serve(args.tracking_uri, args.host, args.port, args.experiment, check=args.check)


def add_parsers(sub: Any) -> None:
    """The subcommands' parsers, on ``sub`` (the top-level ``add_subparsers`` result)."""
    reg = sub.add_parser("register", help="register a training run's checkpoint in the MLflow Model Registry")
    reg.add_argument("run_id", help="MLflow run id of a `tracerl train` run")
    reg.add_argument("--name", required=True, help="registered model name")
    reg.add_argument("--alias", help="alias to point at the new version (e.g. champion)")
    reg.add_argument("--tracking-uri", help=URI_HELP)
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
    sm.add_argument(
        "--python", help="run `PYTHON -m tracerl.workflows.cli.app` instead of `tracerl` on the cluster"
    )
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
    syn = sub.add_parser(
        "sync", help="send a run's spooled metrics and final status to the tracking store (no training)"
    )
    syn.add_argument(
        "run_id", help="MLflow run id of a `tracerl train` run that ended with its metrics spooled"
    )
    syn.add_argument("--tracking-uri", help=URI_HELP)
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


HANDLERS = {"register": _register, "compare": _compare, "submit": _submit, "sync": _sync, "ui": _ui}
