"""``tracerl bench peer``: TRL's ``GRPOTrainer`` and ``tracerl train`` side by side on the same work.

Sides: ``trl`` (TRL's trainer, the project's environment inside its ``rollout_func``: workflows/bench/peer_trl.py, run
with the peer venv's interpreter), ``grpo`` (``tracerl train`` with ``allocator=grpo`` and grpo advantages) and
``trace`` (``tracerl train`` as configured: ``allocator=trace``). Every side is a subprocess started from here, so
each one's whole process tree (Ray's raylet, workers and environment actors included) is measured the same way:
its summed PSS sampled every ``sample_s`` seconds (the peak is reported), and its per-step times. Seeds run in
turn, the sides' order rotating by one each seed; every side runs with the same CPUs (the first ``threads`` of
this process's affinity), ``OMP_NUM_THREADS=torch_threads`` and Ray's workers at nice 0; TRL's single process sets
``torch.set_num_threads(torch_threads)``, tracerl's trainer worker takes OMP_NUM_THREADS and its sampler actors
keep their own one thread each (``pools.rollout_cpus``), as recorded in the JSON.

``settings`` is the one place where the training setup is turned into TRL's arguments; its rows are printed into
the JSON, so a reader can check both sides do the same work.

Per step and side: wall seconds between step ends (an evaluation's own seconds left out), split into rollout
(tracerl: select, score, allocate_roots, rollout, expand_prefixes; TRL: the rollout function), update (tracerl:
broadcast and update_policy; TRL: the step's forward/backward micro-batches and optimizer step) and the rest;
generated tokens per second over those seconds; start-up seconds from launch to the first step's begin. The first
``warmup_steps`` steps are not in the means. With ``eval_every`` > 0 each side is evaluated (greedy, held-out,
as ``tracerl train`` does) at every ``eval_every`` steps and at the end, giving held-out accuracy against wall
seconds (start-up included, evaluations left out) and the wall seconds to ``target`` accuracy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.schema import check, check_flat_keys, flattened
from workflows.bench.peer_report import KEYS, aggregate, side_stats, write_json
from workflows.ops.proc_memory import TreeMemory

SIDES = ("trl", "grpo", "trace")
REPO = Path(__file__).resolve().parents[2]
ROLLOUT_PHASES = ("select", "score", "allocate_roots", "rollout", "expand_prefixes")
"""tracerl's phases that make up a step's rollout (``time/<phase>_s``)."""
UPDATE_PHASES = ("broadcast", "update_policy")


@check_flat_keys
@dataclass(frozen=True)
class BenchPeerConfig:
    """``tracerl bench peer``: TRL's GRPO trainer and tracerl's grpo and trace side by side on one setup."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup every side runs (its keys at the top level); ``eval_every`` > 0 adds accuracy curves."""
    sides: list[str] = field(default_factory=lambda: list(SIDES))
    """Which of trl, grpo, trace to run (``--sides trl,grpo``)."""
    seeds: int = 3
    """Seeds per side (seed, seed + 1, ...); the sides' order rotates by one each seed."""
    threads: int = 2
    torch_threads: int = 1
    """torch threads of each side's computing processes: TRL's one process and tracerl's trainer worker
    (OMP_NUM_THREADS); tracerl's sampler actors take theirs from ``pools.rollout_cpus`` (1). More threads than free
    cores spin against each other: on the busy 2-core machine TRL's rollouts took 1.4-10 s a call with 2 threads
    and 0.3-0.5 s with 1 (docs/results/peer.md)."""
    """CPUs every side may use (the first N of this process's affinity)."""
    warmup_steps: int = 1
    """Steps left out of the per-step means (the first step pays for lazy set-up)."""
    target: float | None = None
    """Held-out accuracy whose wall time is reported (with ``eval_every`` > 0); null: 90% of the way from the start
    to the first side's final accuracy (``workflows.study.curves.target_accuracy``)."""
    sample_s: float = 0.5
    """Seconds between PSS samples of a side's process tree."""
    peer_python: str = ".venv-peer/bin/python"
    """The interpreter of the venv holding TRL (``make bench-peer`` builds it), relative to the repository."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/peer"
    """Where results.json, the sides' configs, logs and runs go."""

    def __post_init__(self) -> None:
        unknown = [s for s in self.sides if s not in SIDES]
        check(
            not unknown and bool(self.sides), f"sides must name some of {', '.join(SIDES)} (got {self.sides})"
        )
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(self.threads >= 1, f"threads must be >= 1 (got {self.threads})")
        check(self.torch_threads >= 1, f"torch_threads must be >= 1 (got {self.torch_threads})")
        check(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(
            self.train.steps is not None and self.train.steps > self.warmup_steps,
            f"steps ({self.train.steps}) must be set and exceed warmup_steps ({self.warmup_steps})",
        )
        check(self.sample_s > 0, f"sample_s must be > 0 (got {self.sample_s})")
        check(self.train.resume is None, "bench peer starts fresh runs; resume is not allowed")


# -- the same work ---------------------------------------------------------------------------------------------


def settings(tc: TrainConfig) -> dict[str, Any]:
    """The training setup as both sides run it: ``rows`` (setting, tracerl's key and value, what TRL is given) and
    ``trl_args`` (``GRPOConfig``'s keyword arguments). One place, printed into the JSON.

    Raises:
        ValueError: a setting TRL's side cannot match (naming the key and what to set).
    """
    b, o, lo, s = tc.budget, tc.optim, tc.loss, tc.sampler
    leaves, group, micro = b.num_leaves, b.group_size, lo.micro_batch_size
    if leaves is None:
        raise ValueError("bench peer needs budget.num_leaves (rollouts per step); got null")
    if leaves % group:
        raise ValueError(f"budget.num_leaves ({leaves}) must be a multiple of budget.group_size ({group})")
    if leaves % micro:
        raise ValueError(
            f"budget.num_leaves ({leaves}) must be a multiple of loss.micro_batch_size ({micro})"
        )
    if lo.name != "ppo_clip":
        raise ValueError(
            f"bench peer maps loss.name=ppo_clip to TRL's clipped loss; got loss.name={lo.name!r}"
        )
    if lo.importance_sampling == "on" or s.backend != "hf":
        raise ValueError(
            "bench peer runs the hf sampler on both sides (TRL's rollout_func has no importance weight without vLLM): "
            f"set sampler.backend=hf and loss.importance_sampling=auto or off (got {s.backend}, {lo.importance_sampling})"
        )
    if tc.trainer.num_workers != 1 or tc.trainer.lora_rank > 0:
        raise ValueError(
            "bench peer compares one trainer process with full weights: set trainer.num_workers=1, lora_rank=0"
        )
    loss_type = {"token_mean": "dapo", "seq_mean_token_mean": "grpo"}[lo.aggregation]
    trl_args: dict[str, Any] = {
        "max_steps": tc.steps,
        "seed": tc.seed,
        "num_generations": group,
        "generation_batch_size": leaves,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": leaves // micro,
        "learning_rate": o.lr,
        "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1],
        "weight_decay": o.weight_decay,
        "max_grad_norm": o.grad_clip,
        "beta": lo.kl_coef,
        "epsilon": lo.eps_low,
        "epsilon_high": lo.eps_high,
        "loss_type": loss_type,
        "scale_rewards": "group" if lo.normalize_std else "none",
        "num_iterations": lo.epochs,
        "temperature": s.temperature if s.temperature > 0 else 1.0,
        "max_completion_length": s.max_context_tokens,
        "mask_truncated_completions": False,
        "bf16": tc.model.dtype == "bfloat16",
        "use_cpu": not tc.trainer.use_gpu,
        "save_strategy": "steps",
        "save_steps": tc.checkpoint_every,
        "save_total_limit": tc.keep_checkpoints,
        "logging_steps": 1,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
    }
    if tc.trainer.gradient_checkpointing:  # TRL warns that the flag is deprecated, set or not: only when on
        trl_args["gradient_checkpointing"] = True
    rows = [
        (
            "checkpoint",
            "model.path",
            tc.model.path,
            "model (the same directory, loaded by tracerl's load_policy)",
        ),
        ("dtype", "model.dtype", tc.model.dtype, f"bf16={trl_args['bf16']}"),
        (
            "template and stop strings",
            "model.template",
            tc.model.template,
            "the project's template in rollout_func",
        ),
        (
            "tasks",
            "env",
            f"{tc.env.name}, {len(_train_prompts(tc))} training prompts",
            "train_dataset: the same prompts",
        ),
        ("tool and reward", "env.name", tc.env.name, "the project's environment in rollout_func; its reward"),
        (
            "episode limits",
            "sampler.max_turns/max_turn_tokens/max_episode_tokens/max_context_tokens",
            f"{s.max_turns}/{s.max_turn_tokens}/{s.max_episode_tokens}/{s.max_context_tokens}",
            "the project's engine in rollout_func, the same SamplerConfig",
        ),
        ("temperature", "sampler.temperature", s.temperature, f"temperature={trl_args['temperature']}"),
        ("rollouts per step", "budget.num_leaves", leaves, f"generation_batch_size={leaves}"),
        ("group size", "budget.group_size (grpo)", group, f"num_generations={group}"),
        (
            "micro-batch",
            "loss.micro_batch_size",
            micro,
            f"per_device_train_batch_size={micro}, gradient_accumulation_steps={leaves // micro}",
        ),
        (
            "optimizer",
            "optim.lr/betas/weight_decay",
            f"AdamW {o.lr}, {list(o.betas)}, {o.weight_decay}",
            "optimizers=(torch AdamW, the same arguments)",
        ),
        (
            "schedule",
            "optim.warmup_steps/schedule/min_lr_ratio",
            f"{o.warmup_steps}/{o.schedule}/{o.min_lr_ratio}",
            "optimizers=(..., LambdaLR(tracerl.learner.lr_lambda))",
        ),
        ("grad clip", "optim.grad_clip", o.grad_clip, f"max_grad_norm={o.grad_clip}"),
        ("KL", "loss.kl_coef", lo.kl_coef, f"beta={lo.kl_coef}"),
        (
            "clip",
            "loss.eps_low/eps_high",
            f"{lo.eps_low}/{lo.eps_high}",
            f"epsilon={lo.eps_low}, epsilon_high={lo.eps_high}",
        ),
        ("loss aggregation", "loss.aggregation", lo.aggregation, f"loss_type={loss_type}"),
        (
            "advantage",
            "loss.normalize_std",
            lo.normalize_std,
            f"group mean-centred, scale_rewards={trl_args['scale_rewards']} (grpo side: loss.advantage=grpo)",
        ),
        ("epochs", "loss.epochs", lo.epochs, f"num_iterations={lo.epochs}"),
        (
            "tool tokens",
            "collate: loss mask on model tokens only",
            "masked",
            "env_mask=0 on observation tokens",
        ),
        ("steps", "steps", tc.steps, f"max_steps={tc.steps}"),
        ("checkpoints", "checkpoint_every", tc.checkpoint_every, f"save_steps={tc.checkpoint_every}"),
    ]
    return {
        "rows": [{"setting": a, "tracerl": k, "value": v, "trl": t} for a, k, v, t in rows],
        "trl_args": trl_args,
    }


def _train_prompts(tc: TrainConfig) -> list[Any]:
    from workflows.lm.stack import task_prompts

    return task_prompts(tc.env)


def side_config(cfg: BenchPeerConfig, side: str, seed: int, run_name: str) -> TrainConfig:
    """The training config ``side`` runs with ``seed``: grpo with grpo advantages, trace as configured; no held-out
    evaluation at the start (the bench evaluates the checkpoint once), outputs under ``bench_out``."""
    tc = cfg.train
    if side == "grpo":
        tc = dataclasses.replace(
            tc,
            allocator=dataclasses.replace(tc.allocator, name="grpo"),
            loss=dataclasses.replace(tc.loss, advantage="grpo"),
        )
    elif side == "trace":
        tc = dataclasses.replace(tc, allocator=dataclasses.replace(tc.allocator, name="trace"))
    out = Path(cfg.bench_out).resolve()
    return dataclasses.replace(
        tc, seed=seed, eval_at_start=False, run_name=run_name, out_dir=str(out / "runs"), log_trees_every=0
    )


def run_order(sides: Sequence[str], k: int) -> list[str]:
    """The sides' order for the k-th seed: rotated by k, so each side goes first in turn."""
    j = k % len(sides)
    return list(sides[j:]) + list(sides[:j])


# -- running a side ----------------------------------------------------------------------------------------------


def _cpus(threads: int) -> list[int]:
    have = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    return have[:threads]


def run_process(
    cmd: Sequence[str], log: Path, threads: int, every: float, torch_threads: int = 1
) -> dict[str, Any]:
    """Run ``cmd`` on the first ``threads`` CPUs with OMP_NUM_THREADS=torch_threads, its output to ``log``, sampling its
    tree's PSS. Returns launch time, exit code, wall seconds, peak PSS and process count.

    Raises:
        RuntimeError: the command failed (naming its log).
    """
    cpus = _cpus(threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(torch_threads), "MKL_NUM_THREADS": str(torch_threads)}
    # Ray starts its workers at nice 15 by default: beside a nice-0 TRL process on a busy machine that would slow
    # tracerl's side for a reason that is not its own.
    env.setdefault("RAY_worker_niceness", "0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "platform"), str(REPO), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)

    def pin() -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    log.parent.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            list(cmd), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd(), preexec_fn=pin
        )
        with TreeMemory(proc.pid, every) as mem:
            rc = proc.wait()
    out = {
        "launch": launch,
        "rc": rc,
        "wall_s": time.time() - launch,
        "peak_pss_mb": mem.peak_mb,
        "peak_processes": mem.peak_processes,
        "pss_samples": mem.samples,
        "cpus": cpus,
    }
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        raise RuntimeError(
            f"`{' '.join(Path(c).name for c in cmd[:4])}` exited {rc}; see {log}"
            + (f": {tail[0]}" if tail else "")
        )
    return out


def peer_interpreter(cfg: BenchPeerConfig) -> Path:
    """The TRL venv's python (``peer_python``, relative to the repository).

    Raises:
        FileNotFoundError: there is none (saying how to build it).
    """
    py = Path(cfg.peer_python)
    py = py if py.is_absolute() else REPO / py
    if not py.is_file():
        raise FileNotFoundError(
            f"peer_python={cfg.peer_python!r}: no interpreter there; build the TRL venv with `make bench-peer` "
            "(or point peer_python at a python with trl installed)"
        )
    return py


def run_trl_side(
    cfg: BenchPeerConfig, seed: int, tag: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    """TRL's side for ``seed``: the spec and config written under ``bench_out/tag``, workflows.bench.peer_trl run."""
    from tracerl.config_loader import to_yaml

    py = peer_interpreter(cfg)
    work = Path(cfg.bench_out).resolve() / tag
    work.mkdir(parents=True, exist_ok=True)
    tc = side_config(cfg, "grpo", seed, tag)
    (work / "config.yaml").write_text(to_yaml(tc))
    spec = {
        "config": str(work / "config.yaml"),
        "trl_args": settings(tc)["trl_args"],
        "threads": cfg.torch_threads,
        "eval_every": tc.eval_every,
        "output_dir": str(work / "trl_out"),
        "out": str(work / "steps.json"),
    }
    (work / "spec.json").write_text(json.dumps(spec, indent=2))
    progress(f"   trl: {py} -m workflows.bench.peer_trl {work / 'spec.json'}")
    proc = run_process(
        [str(py), "-m", "workflows.bench.peer_trl", str(work / "spec.json")],
        work / "log.txt",
        cfg.threads,
        cfg.sample_s,
        cfg.torch_threads,
    )
    rec = json.loads((work / "steps.json").read_text())
    steps = [
        {
            "step": r["step"],
            "begin": r["begin"],
            "end": r["end"],
            "eval_s": r["eval_s"],
            "rollout_s": r["rollout_s"],
            "update_s": max(r["end"] - r["begin"] - r["scoring_s"], 0.0),
            "generated_tokens": r["generated_tokens"],
        }
        for r in rec["steps"]
    ]
    evals = [{"step": e["step"], "accuracy": e["accuracy"]} for e in rec["evals"]]
    return {
        **proc,
        "steps": steps,
        "evals": evals,
        "threads": {"trl_process_torch_threads": cfg.torch_threads},
    }


def run_tracerl_side(
    cfg: BenchPeerConfig, side: str, seed: int, tag: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    """A ``tracerl train`` side for ``seed`` (its config written under ``bench_out/tag``), read back from MLflow."""
    from tracerl.config_loader import to_yaml

    work = Path(cfg.bench_out).resolve() / tag
    work.mkdir(parents=True, exist_ok=True)
    tc = side_config(cfg, side, seed, tag)
    (work / "config.yaml").write_text(to_yaml(tc))
    progress(f"   {side}: tracerl train --config {work / 'config.yaml'}")
    proc = run_process(
        [sys.executable, "-m", "workflows.cli", "train", "--config", str(work / "config.yaml")],
        work / "log.txt",
        cfg.threads,
        cfg.sample_s,
        cfg.torch_threads,
    )
    found = sorted(Path(tc.out_dir).glob(f"{tag}-*/summary.json"))
    if not found:
        raise RuntimeError(
            f"tracerl train wrote no {tc.out_dir}/{tag}-*/summary.json; see {work / 'log.txt'}"
        )
    summary = json.loads(found[-1].read_text())
    steps, evals = tracerl_steps(summary["run_id"], summary["tracking_uri"])
    threads = {
        "trainer_OMP_NUM_THREADS": cfg.torch_threads,
        "sampler_actor_torch_threads": max(1, int(tc.pools.rollout_cpus)),
        "sampler_actors": tc.pools.rollout_workers,
    }
    return {**proc, "steps": steps, "evals": evals, "run_id": summary["run_id"], "threads": threads}


def tracerl_steps(run_id: str, uri: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
    phases = {p: last(M.phase_time(p)) for p in (*ROLLOUT_PHASES, *UPDATE_PHASES, "eval")}
    tokens = last(M.GENERATED_TOKENS)

    def val(series: dict[int, tuple[float, float]], k: int) -> float:
        return series[k][1] if k in series else 0.0

    steps = []
    for k in sorted(step_t):
        ts, dur = step_t[k]
        ev = val(phases["eval"], k)
        steps.append(
            {
                "step": k,
                "begin": ts - dur,
                "end": ts - ev,
                "eval_s": ev,
                "rollout_s": sum(val(phases[p], k) for p in ROLLOUT_PHASES),
                "update_s": sum(val(phases[p], k) for p in UPDATE_PHASES),
                "generated_tokens": val(tokens, k),
            }
        )
    evals = [{"step": k, "accuracy": v} for k, (_, v) in sorted(last(M.EVAL_ACCURACY).items())]
    return steps, evals


# -- statistics --------------------------------------------------------------------------------------------------


def checkpoint_accuracy(tc: TrainConfig) -> float:
    """Greedy held-out accuracy of the starting checkpoint, in this process (as ``tracerl train`` evaluates)."""
    from workflows.lm.stack import task_prompts
    from workflows.train.evaluate import evaluate_prompts, local_runner

    run = local_runner(tc.model, tc.sampler, tc.env)
    m, _ = evaluate_prompts(run, task_prompts(tc.env, held_out=True), 0, 0.0, tc.seed + 10_000)
    return float(m["accuracy"])


def run_peer_bench(cfg: BenchPeerConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    mapping = settings(cfg.train)  # a setting TRL cannot match fails before anything runs
    if "trl" in cfg.sides:
        peer_interpreter(cfg)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    curves = cfg.train.eval_every > 0
    acc0 = None
    if curves:
        progress("held-out accuracy of the starting checkpoint ...")
        acc0 = checkpoint_accuracy(cfg.train)
        progress(f"   {acc0:.3f}")
    raw: dict[str, list[dict[str, Any]]] = {s: [] for s in cfg.sides}
    stats: dict[str, list[dict[str, Any]]] = {s: [] for s in cfg.sides}
    order = []
    for k in range(cfg.seeds):
        seed = cfg.train.seed + k
        for side in run_order(cfg.sides, k):
            tag = f"peer-{side}-s{seed}-{stamp}"
            progress(f"== {side}, seed {seed}: {cfg.train.steps} steps")
            run = (
                run_trl_side(cfg, seed, tag, progress)
                if side == "trl"
                else run_tracerl_side(cfg, side, seed, tag, progress)
            )
            run["seed"] = seed
            st = side_stats(run, cfg.warmup_steps, acc0)
            raw[side].append(run)
            stats[side].append(st)
            order.append(f"{side}/s{seed}")
            progress(
                f"   {side} seed {seed}: {st['s_per_step']:.2f} s/step, start-up {st['startup_s']:.1f} s, "
                f"peak PSS {st['peak_pss_mb']:.0f} MB"
            )
    target = cfg.target
    if target is None and curves and acc0 is not None:
        from workflows.study.curves import target_accuracy

        first = stats[cfg.sides[0]]
        final = statistics.fmean(r["curve"][-1][1] for r in first if r["curve"])
        target = target_accuracy(acc0, final)
    summary = {
        "sides": aggregate(stats, target if curves else None),
        "runs": {
            s: [
                {
                    "seed": r["seed"],
                    **{k: st[k] for k in (*KEYS, "peak_processes", "steps_measured", "curve")},
                    "per_step": st["per_step"],
                    "threads": r["threads"],
                    "cpus": r["cpus"],
                    **({"run_id": r["run_id"]} if "run_id" in r else {}),
                }
                for r, st in zip(raw[s], stats[s])
            ]
            for s in cfg.sides
        },
        "order": order,
        "settings": mapping,
        "steps": cfg.train.steps,
        "seeds": cfg.seeds,
        "warmup_steps": cfg.warmup_steps,
        "threads": cfg.threads,
        "torch_threads": cfg.torch_threads,
        "eval_every": cfg.train.eval_every,
        "acc_start": acc0,
        "target": target if curves else None,
        "machine": {"cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
    }
    write_json(summary, Path(cfg.bench_out) / "results.json", cfg.json_path)
    return summary
