"""Running one side of ``tracerl bench peer`` as a subprocess on the bench's CPUs, its whole process tree's PSS
sampled, and reading its per-step records back: TRL's from the JSON its script writes, tracerl's from MLflow."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tracerl import metrics as M
from tracerl.actors.spec import WorkerSpec
from tracerl.config import TrainConfig
from tracerl.shipped import PACKAGE
from tracerl.workflows.experiments.config import BenchPeerConfig
from tracerl.workflows.experiments.peer_report import EvalPoint, ProcessRun, SideRun, StepRecord
from tracerl.workflows.experiments.peer_settings import (
    grpo_draws,
    settings,
    side_config,
    side_mode,
    side_threads,
)
from tracerl.workflows.experiments.proc_memory import TreeMemory
from tracerl.workflows.ops.turns import Conductor

ROLLOUT_PHASES = ("select", "score", "allocate_roots", "rollout", "expand_prefixes")
"""tracerl's phases that make up a step's rollout (``time/<phase>_s``)."""
UPDATE_PHASES = ("broadcast", "update_policy")


def _cpus(threads: int) -> list[int]:
    have = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    return have[:threads]


@dataclass
class Launched:
    """A side's process as ``launch_process`` started it, its PSS sampled until ``finish_process``."""

    proc: subprocess.Popen[bytes]
    cmd: list[str]
    log: Path
    launch: float
    cpus: list[int]
    mem: TreeMemory
    out: IO[bytes]


def launch_process(
    cmd: Sequence[str],
    log: Path,
    threads: int,
    every: float,
    torch_threads: int = 1,
    extra_env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> Launched:
    """Start ``cmd`` on the first ``threads`` CPUs with OMP_NUM_THREADS=torch_threads (and ``extra_env``; the
    descriptors ``pass_fds`` left open in it), its output to ``log``, sampling its tree's PSS every ``every`` s."""
    cpus = _cpus(threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(torch_threads), "MKL_NUM_THREADS": str(torch_threads)}
    # Ray starts its workers at nice 15 by default: beside a nice-0 TRL process on a busy machine that would slow
    # tracerl's side for a reason that is not its own.
    env.setdefault("RAY_worker_niceness", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra_env or {})

    def pin() -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    log.parent.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    out = open(log, "wb")  # noqa: SIM115 -- held until finish_process
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=os.getcwd(),
            preexec_fn=pin,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        out.close()
        raise
    mem = TreeMemory(proc.pid, every).__enter__()
    return Launched(proc, list(cmd), log, launch, cpus, mem, out)


def finish_process(p: Launched) -> ProcessRun:
    """Wait for a launched process to end: launch time, exit code, wall seconds, peak PSS and process count.

    Raises:
        RuntimeError: the command failed (naming its log).
    """
    try:
        rc = p.proc.wait()
    finally:
        p.mem.__exit__()
        p.out.close()
    out = ProcessRun(
        launch=p.launch,
        rc=rc,
        wall_s=time.time() - p.launch,
        peak_pss_mb=p.mem.peak_mb,
        peak_processes=p.mem.peak_processes,
        pss_samples=p.mem.samples,
        cpus=p.cpus,
    )
    if rc != 0:
        log = p.log
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        raise RuntimeError(
            f"`{' '.join(Path(c).name for c in p.cmd[:4])}` exited {rc}; see {log}"
            + (f": {tail[0]}" if tail else "")
        )
    return out


def run_process(
    cmd: Sequence[str], log: Path, threads: int, every: float, torch_threads: int = 1
) -> ProcessRun:
    """Run ``cmd`` on the first ``threads`` CPUs with OMP_NUM_THREADS=torch_threads, its output to ``log``, sampling its
    tree's PSS. Returns launch time, exit code, wall seconds, peak PSS and process count.

    Raises:
        RuntimeError: the command failed (naming its log).
    """
    return finish_process(launch_process(cmd, log, threads, every, torch_threads))


def peer_interpreter(cfg: BenchPeerConfig) -> Path:
    """The TRL venv's python (``peer_python``, relative to the working directory).

    Raises:
        FileNotFoundError: there is none (saying how to build it).
    """
    # absolute, not resolved: a venv's bin/python is a symlink to the base interpreter, which outside the venv's
    # bin/ no longer finds the venv's site-packages
    py = Path(cfg.peer_python).absolute()
    if not py.is_file():
        raise FileNotFoundError(
            f"peer_python={cfg.peer_python!r}: no interpreter there; build the TRL venv with `make bench-peer` "
            "(or point peer_python at a python with trl installed)"
        )
    return py


@dataclass(frozen=True)
class SideJob:
    """A side's run, ready to start: its command, log and torch threads, and how to read its records back once its
    process ended."""

    cmd: list[str]
    log: Path
    torch_threads: int
    read: Callable[[ProcessRun], SideRun]


def run_job(cfg: BenchPeerConfig, job: SideJob) -> SideRun:
    """Run a side alone on the bench's CPUs and read it back."""
    return job.read(run_process(job.cmd, job.log, cfg.threads, cfg.sample_s, job.torch_threads))


def run_trl_side(
    cfg: BenchPeerConfig, seed: int, tag: str, progress: Callable[[str], None], side: str = "trl"
) -> SideRun:
    """TRL's side for ``seed``, run alone (``trl_job``)."""
    return run_job(cfg, trl_job(cfg, seed, tag, progress, side))


def run_tracerl_side(
    cfg: BenchPeerConfig, side: str, seed: int, tag: str, progress: Callable[[str], None]
) -> SideRun:
    """A ``tracerl train`` side for ``seed``, run alone (``tracerl_job``)."""
    return run_job(cfg, tracerl_job(cfg, side, seed, tag, progress))


def trl_job(
    cfg: BenchPeerConfig, seed: int, tag: str, progress: Callable[[str], None], side: str = "trl"
) -> SideJob:
    """TRL's side for ``seed`` (``side``: ``trl`` or ``trl@T``, its torch threads): the spec and config written under
    ``bench_out/tag``, tracerl.workflows.experiments.peer_trl to run."""
    from tracerl.config_loader import to_yaml

    py = peer_interpreter(cfg)
    work = Path(cfg.bench_out).resolve() / tag
    work.mkdir(parents=True, exist_ok=True)
    threads = side_threads(cfg, side)
    tc = side_config(cfg, "grpo", seed, tag)
    tc = dataclasses.replace(tc, trainer=dataclasses.replace(tc.trainer, torch_threads=threads))
    (work / "config.yaml").write_text(to_yaml(tc))
    spec = {
        "config": str(work / "config.yaml"),
        "trl_args": settings(tc)["trl_args"],
        "prompts": grpo_draws(tc),
        "threads": threads,
        "eval_every": tc.eval_every,
        "output_dir": str(work / "trl_out"),
        "out": str(work / "steps.json"),
    }
    (work / "spec.json").write_text(json.dumps(spec, indent=2))
    progress(f"   trl: {py} -m tracerl.workflows.experiments.peer_trl {work / 'spec.json'}")
    cmd = [str(py), "-m", "tracerl.workflows.experiments.peer_trl", str(work / "spec.json")]
    return SideJob(cmd, work / "log.txt", threads, lambda proc: _read_trl(proc, work, threads))


def _read_trl(proc: ProcessRun, work: Path, threads: int) -> SideRun:
    rec = json.loads((work / "steps.json").read_text())
    steps = [
        StepRecord(
            step=r["step"],
            begin=r["begin"],
            end=r["end"],
            eval_s=r["eval_s"],
            rollout_s=r["rollout_s"],
            update_s=max(r["end"] - r["begin"] - r["scoring_s"], 0.0),
            generated_tokens=r["generated_tokens"],
            generate_s=r.get("phase_s", {}).get("generate", 0.0),
            tools_s=r.get("phase_s", {}).get("tools", 0.0),
        )
        for r in rec["steps"]
    ]
    evals = [EvalPoint(step=e["step"], accuracy=e["accuracy"]) for e in rec["evals"]]
    return SideRun(
        **proc,
        steps=steps,
        evals=evals,
        threads={"trl_process_torch_threads": threads},
        mode="trl",
    )


def tracerl_job(
    cfg: BenchPeerConfig, side: str, seed: int, tag: str, progress: Callable[[str], None]
) -> SideJob:
    """A ``tracerl train`` side for ``seed`` (its config written under ``bench_out/tag``; in-process or on Ray, as
    ``side_mode`` says), to read back from MLflow."""
    from tracerl.config_loader import to_yaml

    work = Path(cfg.bench_out).resolve() / tag
    work.mkdir(parents=True, exist_ok=True)
    tc = side_config(cfg, side, seed, tag)
    (work / "config.yaml").write_text(to_yaml(tc))
    progress(f"   {side}: tracerl train --config {work / 'config.yaml'}")
    threads = side_threads(cfg, side)
    cmd = [sys.executable, "-m", "tracerl.workflows.cli", "train", "--config", str(work / "config.yaml")]
    return SideJob(
        cmd, work / "log.txt", threads, lambda proc: _read_tracerl(proc, tc, side, tag, work, threads)
    )


def _read_tracerl(
    proc: ProcessRun, tc: TrainConfig, side: str, tag: str, work: Path, threads: int
) -> SideRun:
    found = sorted(Path(tc.out_dir).glob(f"{tag}-*/summary.json"))
    if not found:
        raise RuntimeError(
            f"tracerl train wrote no {tc.out_dir}/{tag}-*/summary.json; see {work / 'log.txt'}"
        )
    summary = json.loads(found[-1].read_text())
    steps, evals = tracerl_steps(summary["run_id"], summary["tracking_uri"])
    if tc.cluster.in_process:  # one process: the trainer's threads run the sampler's shards too
        counts = {
            "process_torch_threads": tc.trainer.torch_threads or threads,
            "sampler_shards": tc.pools.rollout_workers,
        }
    else:
        counts = {
            "trainer_torch_threads": tc.trainer.torch_threads or threads,
            "sampler_actor_torch_threads": WorkerSpec(tc.model, tc.sampler, tc.env, tc.pools).threads,
            "sampler_actors": tc.pools.rollout_workers,
        }
    return SideRun(
        **proc,
        steps=steps,
        evals=evals,
        run_id=summary["run_id"],
        threads=counts,
        mode=side_mode(side),
    )


def tracerl_steps(run_id: str, uri: str) -> tuple[list[StepRecord], list[EvalPoint]]:
    """A ``tracerl train`` run's per-step records (as ``run_trl_side``'s) and held-out evaluations, from MLflow:
    a step ends when its metrics were logged (the timestamp of ``time/step_s``), less its evaluation."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)

    def last(key: str) -> dict[int, tuple[float, float]]:
        out: dict[int, tuple[float, float]] = {}
        for m in client.get_metric_history(run_id, key):
            if m.step not in out or m.timestamp >= out[m.step][0]:
                out[m.step] = (m.timestamp / 1000.0, m.value)
        return out

    step_t = last(M.TIME_STEP)
    phases = {
        p: last(M.phase_time(p)) for p in (*ROLLOUT_PHASES, *UPDATE_PHASES, "eval", "generate", "tools")
    }
    tokens = last(M.GENERATED_TOKENS)

    def val(series: dict[int, tuple[float, float]], k: int) -> float:
        return series[k][1] if k in series else 0.0

    steps: list[StepRecord] = []
    for k in sorted(step_t):
        ts, dur = step_t[k]
        ev = val(phases["eval"], k)
        steps.append(
            StepRecord(
                step=k,
                begin=ts - dur,
                end=ts - ev,
                eval_s=ev,
                rollout_s=sum(val(phases[p], k) for p in ROLLOUT_PHASES),
                update_s=sum(val(phases[p], k) for p in UPDATE_PHASES),
                generated_tokens=val(tokens, k),
                generate_s=val(phases["generate"], k),
                tools_s=val(phases["tools"], k),
            )
        )
    evals = [EvalPoint(step=k, accuracy=v) for k, (_, v) in sorted(last(M.EVAL_ACCURACY).items())]
    return steps, evals


def run_in_turns(cfg: BenchPeerConfig, jobs: dict[str, SideJob]) -> dict[str, SideRun]:
    """One seed's sides taking turns (``interleave=step``): started one after another, each paused at its first
    step until all have started, then one step each in ``jobs``' order, round after round, until all have ended
    (``tracerl.workflows.ops.turns``). Each run carries its ``pauses``, which its statistics leave out.

    Raises:
        RuntimeError: a side failed (naming its log); the others are stopped.
    """
    conductor = Conductor()
    launched: dict[str, Launched] = {}

    def launch(
        name: str, job: SideJob
    ) -> Callable[[dict[str, str], tuple[int, ...]], subprocess.Popen[bytes]]:
        def start(env: dict[str, str], fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
            launched[name] = launch_process(
                job.cmd, job.log, cfg.threads, cfg.sample_s, job.torch_threads, env, fds
            )
            return launched[name].proc

        return start

    def check(name: str) -> None:
        if not conductor.procs[name].alive and launched[name].proc.wait() != 0:
            finish_process(launched.pop(name))  # raises, naming the log

    try:
        for name, job in jobs.items():
            conductor.start(name, launch(name, job))
            check(name)
        while any(conductor.procs[n].alive for n in jobs):
            for name in jobs:
                if conductor.turn(name) is False:
                    check(name)
        runs = {}
        for name, job in jobs.items():
            proc = finish_process(launched.pop(name))
            proc["pauses"] = [[a, b] for a, b in conductor.procs[name].pauses]
            runs[name] = job.read(proc)
        return runs
    finally:
        conductor.close()
        for p in launched.values():  # left running only when another side failed
            p.proc.terminate()
            with contextlib.suppress(RuntimeError):
                finish_process(p)
