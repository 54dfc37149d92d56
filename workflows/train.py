"""``tracerl train``: TRACE (or any baseline allocator) end to end on Ray Train, tracked in MLflow.

Topology (docs/design.md): ``TorchTrainer`` workers hold the policy (DDP; gloo on CPU, NCCL on GPU;
FSDP as an option). The RL loop runs inside the worker function: rank 0 owns the sampler/environment
actor pools, the predictor and the allocator, drives the step, and broadcasts the collated batch;
every rank updates on its shard. After each update rank 0 pushes the weights to the samplers.

Per step, as named timed phases: select (candidate pool), score/allocate_roots/rollout/
expand_prefixes (the step driver), fit_predictor, collate, update_policy, sync_weights, eval, log.

The driver opens the MLflow run (params, resolved config) before the workers start and closes it
after; rank 0 logs into it by run id, so a restart after a failure (Ray's ``FailureConfig``) or a
``resume=RUN_ID`` continues the same run from the last checkpoint. Checkpoints (``ray.train.report``
every ``checkpoint_every`` steps, the last ``keep_checkpoints`` kept) hold the policy in HF format,
optimizer and schedule, predictor, candidate-pool RNG and step. Steps re-run after a restart log again
at the same MLflow step; every report here reads the last value per step (the attempt that completed it,
logged as ``system/attempt``). Metrics the tracking server cannot take are spooled under the run's storage and
sent when it is back (workflows/spool.py); ``chaos.enabled`` runs the fault drill around all this (workflows/chaos.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.registry import check_data, resolve_env_paths
from tracerl.config import TrainConfig
from tracerl.config_loader import to_flat_dict, to_yaml
from workflows.checkpoint_state import CheckpointState
from workflows.runs import (
    config_hash,
    dataset_fingerprint,
    git_sha,
    latest_checkpoint,
    phase_marker,
    run_storage,
    run_summary,
)
from workflows.tracking import resolve_uri, where

ADAPTERS = "lora_adapters.pt"  # a LoRA run's checkpoint: its adapters (peft names) beside the merged policy


# -- driver side ------------------------------------------------------------------------------------


def _abs_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    return uri


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Absolute paths and URIs, so Ray workers (whatever their cwd) see the same files; the tracking URI resolved
    (``workflows.tracking.resolve_uri``), so the config saved with a run names the store it went to."""
    model_path = cfg.model.path
    if not model_path.startswith(("models:/", "runs:/")) and Path(model_path).exists():
        model_path = str(Path(model_path).resolve())
    art = cfg.tracking.artifact_location
    if "://" not in art:
        art = str(Path(art).resolve())
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=model_path),
        env=resolve_env_paths(cfg.env),
        tracking=dataclasses.replace(
            cfg.tracking, uri=_abs_uri(resolve_uri(cfg.tracking.uri)), artifact_location=art
        ),
        out_dir=str(Path(cfg.out_dir).resolve()),
    )


def train(
    cfg: TrainConfig,
    overrides: list[str] | None = None,
    progress: Callable[[str], None] = lambda s: None,
    tags: dict[str, str] | None = None,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) a training job; returns the summary (also written to <storage>/summary.json).

    ``tags`` go on a new MLflow run (a sweep passes its parent run and trial); ``callbacks`` are Ray Train
    user callbacks (a sweep forwards every report to Tune).
    """
    if not cfg.tracking.enabled:
        raise ValueError(
            "tracerl train needs MLflow tracking (tracking.enabled=true): runs resume and register "
            "through it; use tracking.uri=sqlite:///PATH for a local store"
        )
    resume_ckpt: Path | None = None
    run_id = cfg.resume or ""
    if cfg.resume:
        storage = run_storage(cfg.resume, cfg.tracking)
        from tracerl.config_loader import compose

        saved = storage / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"run {cfg.resume} has no saved config at {saved}")
        keep = [o for o in (overrides or []) if not o.startswith("resume=")]
        cfg = compose(TrainConfig, saved, keep + [f"resume={cfg.resume}"])
        resume_ckpt = latest_checkpoint(storage)
        progress(f"resuming MLflow run {run_id} from {resume_ckpt or 'its start (no checkpoint yet)'}")
    check_data(cfg.env)  # a bad data file is the user's to fix: before Ray starts or a run exists
    progress(where(cfg.tracking))
    import mlflow
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from workflows import tracking as trk
    from workflows.progress import bar
    from workflows.ray_utils import check_resources, init_ray
    from workflows.run_info import train_tags

    cfg = resolve_paths(cfg)
    from workflows.lm_stack import SetupError

    if not Path(cfg.model.path).is_dir():
        raise SetupError(
            f"model.path={cfg.model.path!r} is not a checkpoint directory; build the tiny policy with "
            "`tracerl bootstrap` or point model.path at an HF checkpoint"
        )
    from tracerl.models.hf import check_window

    check_window(cfg.model.path, cfg.sampler)
    if cfg.trainer.lora_rank > 0:  # before any run is created: a bad target list is the user's to fix
        from tracerl.models.wrap import check_lora

        check_lora(cfg.model.path, cfg.trainer)
    # Quiet workers: no per-load progress bars (the workers inherit these when this process starts Ray).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    init_ray(cfg.cluster)  # before the run exists: a job that cannot fit leaves no empty run behind
    check_resources(resource_demand(cfg), cfg.cluster, RESOURCE_KNOBS, progress)
    exp_id = trk.setup(cfg.tracking)
    client = mlflow.MlflowClient()
    if not cfg.resume:
        name = cfg.run_name or f"{cfg.allocator.name}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = client.create_run(
            exp_id,
            run_name=name,
            tags={
                "tracerl.command": "train",
                "tracerl.allocator": cfg.allocator.name,
                "tracerl.git_sha": git_sha(),
                "tracerl.config_hash": config_hash(cfg),
                "tracerl.dataset_fingerprint": dataset_fingerprint(cfg),
                "tracerl.base_model": cfg.model.path,
                **train_tags(cfg),
                **(tags or {}),
            },
        )
        run_id = run.info.run_id
        storage = Path(cfg.out_dir) / f"{name}-{run_id[:8]}"
        storage.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(cfg, run_name=name)
        (storage / "config.yaml").write_text(to_yaml(cfg))
        client.set_tag(run_id, "tracerl.storage", str(storage))
        flat = to_flat_dict(cfg)
        for i in range(0, len(flat), 100):
            keys = list(flat)[i : i + 100]
            client.log_batch(
                run_id,
                params=[
                    mlflow.entities.Param(k, ("null" if flat[k] is None else str(flat[k]))[:6000])
                    for k in keys
                ],
            )
        client.log_artifact(run_id, str(storage / "config.yaml"))
    else:
        client.update_run(run_id, status="RUNNING")
        (storage / "config.yaml").write_text(to_yaml(dataclasses.replace(cfg, resume=None)))
    progress(f"MLflow run {run_id} ({cfg.tracking.uri}); checkpoints in {storage}")
    t = cfg.trainer
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"cfg": cfg, "run_id": run_id, "storage": str(storage)},
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker={"CPU": t.cpus_per_worker, **({"GPU": 1} if t.use_gpu else {})},
        ),
        run_config=RunConfig(
            name=storage.name,
            storage_path=str(storage.parent),  # type: ignore[call-arg]
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            logging_config=LoggingConfig(log_level="WARNING"),
            callbacks=callbacks,
        ),
    )
    t0 = time.perf_counter()
    status = "FAILED"
    start = CheckpointState.read(resume_ckpt).step if resume_ckpt is not None else 0
    steps_bar = bar(progress, cfg.steps, f"train {cfg.run_name or run_id[:8]}", "step", initial=start)
    steps_bar.follow(
        lambda: max((m.step for m in client.get_metric_history(run_id, "train/loss")), default=0)
    )
    try:
        trainer.fit()
        status = "FINISHED"
    finally:
        steps_bar.close()
        if status == "FAILED" and "tracerl.stopped_early" in client.get_run(run_id).data.tags:
            status = (
                "KILLED"  # a sweep's scheduler stopped this trial (and said so) before its Train run ended
            )
        from workflows.spool import MetricLog

        if not MetricLog(
            client, run_id, storage, 0, progress, fail_fast=False
        ).flush():  # what rank 0 spooled and could not send
            progress(f"metrics still spooled in {storage}: the tracking server is unreachable")
        client.set_terminated(run_id, status=status)
        if status == "FAILED":
            progress(
                f"training failed; the run and its checkpoints are kept: `tracerl train resume={run_id}`"
            )
    summary = run_summary(run_id, cfg.tracking)
    summary.update(
        run_id=run_id,
        storage=str(storage),
        wall_s=time.perf_counter() - t0,
        tracking_uri=cfg.tracking.uri,
        experiment=cfg.tracking.experiment,
    )
    (storage / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


RESOURCE_KNOBS = (
    "trainer.num_workers / trainer.cpus_per_worker, pools.rollout_workers / pools.rollout_cpus / "
    "pools.rollout_gpus or pools.env_workers / pools.env_cpus"
)


def resource_demand(cfg: TrainConfig) -> list[tuple[str, int, float, float]]:
    """(what, how many, CPUs each, GPUs each) of every actor a training run holds at once: Train workers,
    samplers, their environment actors and the run's shared services (e.g. the search retriever)."""
    from envs.registry import env_class
    from tracerl.actors.services import service_factories

    t, p = cfg.trainer, cfg.pools
    rows = [
        ("trainer", t.num_workers, t.cpus_per_worker, 1.0 if t.use_gpu else 0.0),
        ("samplers", p.rollout_workers, p.rollout_cpus, p.rollout_gpus),
    ]
    if p.env_workers > 0:
        rows.append(("environments", p.rollout_workers * p.env_workers, p.env_cpus, 0.0))
        n = len(service_factories(env_class(cfg.env.name), cfg.env))
        if n:
            rows.append(("services", n, p.env_cpus, 0.0))
    return rows


# -- worker side ------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    """A progress line from a worker (straight to the process's stdout, which Ray forwards to the driver;
    Ray Train's patched print would log it twice when another library wraps sys.stdout)."""
    out = sys.__stdout__ or sys.stdout
    out.write(msg + "\n")
    out.flush()


def _peak_memory_mb() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _broadcast(obj: Any, world: int) -> Any:
    import torch

    if world == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _parallelize(model: Any, cfg: TrainConfig, world: int) -> Any:
    """Place the policy on this rank's device: plain (one worker), DDP, or FSDP2 (``trainer.strategy``)."""
    import ray.train.torch

    if world == 1 or cfg.trainer.strategy == "ddp":
        kwargs = {"broadcast_buffers": False} if world > 1 else None
        return ray.train.torch.prepare_model(
            model, parallel_strategy="ddp" if world > 1 else None, parallel_strategy_kwargs=kwargs
        )
    import torch

    from tracerl.models.wrap import fully_shard_model

    return fully_shard_model(
        model.to(ray.train.torch.get_device()), compute_dtype=getattr(torch, cfg.model.dtype)
    )


def _gather(model: Any, cfg: TrainConfig, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy's HF-named full weights (LoRA adapters merged) and the LoRA adapters alone, on rank 0.

    Under FSDP every rank takes part in the gather (the others get empty dicts); DDP ranks hold full replicas, so
    only rank 0 reads its own."""
    from tracerl.models.wrap import adapter_weights, gather_state, hf_weights

    if cfg.trainer.strategy != "fsdp" and rank != 0:
        return {}, {}
    state = gather_state(model)
    if rank != 0:
        return {}, {}
    return hf_weights(state, cfg.trainer), adapter_weights(state)


def _restore_dir(ckpt: Any, storage: Path) -> str | None:
    """The newest checkpoint: Ray's (after a restart or resume_from_checkpoint) or a newer one in storage.

    A worker that dies right after ``ray.train.report`` may leave a persisted checkpoint the controller never
    registered; its step is in its state.json, so it is found here and nothing done before the death is redone.
    """
    best: tuple[int, str] | None = None
    if ckpt is not None:
        d = ckpt.to_directory()
        best = (CheckpointState.read(d).step, d)
    found = latest_checkpoint(storage)
    if found is not None:
        step = CheckpointState.read(found).step
        if best is None or step > best[0]:
            best = (step, str(found))
    return best[1] if best else None


def _quiet_train_reports() -> None:
    """Ray Train V2 logs every ``ray.train.report`` with its whole metrics dict at INFO from each rank (a 3 kB line
    a step), through a logger named after its source file; our own progress line already says the step."""
    import logging

    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # pragma: no cover - another Ray layout: leave its logging alone
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker function (every rank)."""
    import ray.train
    import ray.train.torch
    import torch

    from tracerl.models.wrap import adapter_weights, apply_lora, unwrap
    from workflows.lm_stack import load_policy

    cfg: TrainConfig = config["cfg"]
    run_id, storage = config["run_id"], Path(config["storage"])
    _quiet_train_reports()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(cfg.seed + rank)
    master = dataclasses.replace(
        cfg.model, dtype=cfg.trainer.master_dtype
    )  # the trainer's weights (mixed precision)
    tok, model = load_policy(master)
    ckpt_dir = _restore_dir(ray.train.get_checkpoint(), storage)
    state = CheckpointState(step=0)
    lora = cfg.trainer.lora_rank > 0
    if ckpt_dir is not None:
        state = CheckpointState.read(ckpt_dir)
        if rank == 0:
            _say(f"restoring from {ckpt_dir} (step {state.step})")
        if not lora:  # a LoRA run restores its adapters onto the base policy below
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                Path(ckpt_dir) / "policy", dtype=model.dtype, local_files_only=True
            )
    if cfg.trainer.gradient_checkpointing:  # transformers 5.x renamed it; older versions have only the first
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model = apply_lora(model, cfg.trainer)
    if lora and ckpt_dir is not None:
        saved = torch.load(Path(ckpt_dir) / ADAPTERS, weights_only=True)
        missing = set(adapter_weights(model.state_dict())) - set(saved)
        if missing:
            raise RuntimeError(
                f"checkpoint {ckpt_dir} lacks LoRA adapters {sorted(missing)[:3]}: was it saved with "
                f"the same trainer.lora_rank and lora_targets?"
            )
        model.load_state_dict(saved, strict=False)
    ref_model = None
    if cfg.loss.kl_coef > 0:
        _, ref_model = load_policy(cfg.model)  # the initial policy
        ref_model.requires_grad_(False)
    model = _parallelize(model, cfg, world)
    from tracerl.learner import PolicyLearner, denominator
    from tracerl.models.wrap import fully_shard_model, is_fsdp

    if ref_model is not None:  # sharded like the policy under FSDP (a full frozen replica per GPU otherwise)
        ref_model = ref_model.to(next(model.parameters()).device)
        ref_model = fully_shard_model(ref_model) if is_fsdp(model) else ref_model

    compute = getattr(torch, cfg.model.dtype)
    # FSDP2 casts the gathered parameters itself (its MixedPrecisionPolicy); a replica computes under autocast.
    autocast = compute if compute != getattr(torch, cfg.trainer.master_dtype) and not is_fsdp(model) else None

    use_is = cfg.loss.importance_sampling == "on" or (
        cfg.loss.importance_sampling == "auto" and cfg.sampler.backend == "vllm"
    )
    learner = PolicyLearner(
        model,
        cfg.optim,
        cfg.loss,
        cfg.steps,
        pad_id=tok.pad_token_id,
        temperature=cfg.sampler.temperature,
        importance_sampling=use_is,
        ref_model=ref_model,
        autocast=autocast,
    )
    if ckpt_dir is not None:
        learner.load_state_dict(
            torch.load(Path(ckpt_dir) / f"trainer_rank{rank}.pt", weights_only=False)
            if (Path(ckpt_dir) / f"trainer_rank{rank}.pt").exists()
            else torch.load(Path(ckpt_dir) / "trainer_rank0.pt", weights_only=False)
        )
    # A restored policy is pushed to the samplers; a fresh run's samplers loaded these very weights from model.path,
    # so nothing is gathered for them (under FSDP a gather is a full-model collective).
    restored = _gather(model, cfg, rank)[0] if ckpt_dir is not None else None
    driver = (
        _Driver(cfg, run_id, storage, tok, unwrap(model), state, ckpt_dir, restored) if rank == 0 else None
    )
    start = state.step
    if driver is not None and start == 0 and cfg.eval_at_start:
        driver.evaluate(0)
    for step in range(start, cfg.steps):
        batch = driver.rollout_step(step) if driver is not None else None
        t0 = time.perf_counter()
        batch = _broadcast(batch, world)
        t1 = time.perf_counter()
        stats = learner.update(batch.shard(rank, world), denominator(batch, cfg.loss.aggregation))
        t2 = time.perf_counter()
        metrics: dict[str, float] = {}
        if driver is not None:
            driver.phase("broadcast", t1 - t0)
            driver.phase("update_policy", t2 - t1)
        weights, adapters = _gather(model, cfg, rank)  # a collective under FSDP
        if driver is not None:
            metrics = driver.after_update(step, stats, weights)
        done = step + 1
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            with tempfile.TemporaryDirectory() as tmp:
                torch.save(learner.state_dict(), Path(tmp) / f"trainer_rank{rank}.pt")
                if driver is not None:
                    driver.save(Path(tmp), done, weights, adapters)
                ray.train.report(
                    {"step": done, **metrics},
                    checkpoint=ray.train.Checkpoint.from_directory(tmp),
                    checkpoint_dir_name=f"checkpoint_{done:06d}",
                )
        else:  # every step reports (a sweep's scheduler sees the curve); checkpoints every checkpoint_every
            ray.train.report({"step": done, **metrics})
        if driver is not None and step == cfg.faults.kill_trainer_at_step:
            from tracerl.actors.pools import _fault_once

            if _fault_once(str(storage / ".faults"), f"trainer-step{step}"):
                _say(f"fault injection: rank 0 exits after step {step}")
                os._exit(1)
    if driver is not None:
        driver.close()


class _Driver:
    """Rank 0's part of the loop: pools, predictor, allocator, candidate pools, evaluation and logging."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_id: str,
        storage: Path,
        tok: Any,
        model: Any,
        state: CheckpointState,
        ckpt_dir: str | None,
        restored: dict[str, Any] | None,
    ) -> None:
        import mlflow
        import numpy as np
        import torch

        from envs.registry import tool_env_class
        from predictors.length import attach_lengths
        from tracerl.actors.pools import RolloutPool
        from tracerl.actors.spec import WorkerSpec
        from tracerl.algos.allocators import build_allocator
        from tracerl.engine.react import TEMPLATES
        from workflows.lm_stack import make_text_predictor, task_prompts

        self.cfg, self.run_id, self.storage, self.tok = cfg, run_id, storage, tok
        # The HF model class and config that checkpoints are written with (a LoRA run's base model).
        self.export = model.get_base_model() if hasattr(model, "get_base_model") else model
        mlflow.set_tracking_uri(resolve_uri(cfg.tracking.uri))
        self.client = mlflow.MlflowClient()
        from workflows.spool import MetricLog, next_attempt

        self.metrics = MetricLog(self.client, run_id, storage, next_attempt(storage), _say)
        self.metrics.flush()  # what an earlier attempt spooled
        self.mark = phase_marker(storage, cfg.chaos.enabled, state.step)
        spec = WorkerSpec(
            cfg.model,
            cfg.sampler,
            cfg.env,
            cfg.pools,
            kill_at_step=cfg.faults.kill_rollout_worker_at_step,
            kill_env_at_step=cfg.faults.kill_env_worker_at_step,
            fault_dir=str(storage / ".faults"),
        )
        p = cfg.pools
        self.pool = RolloutPool(
            spec, p.rollout_workers, p.rollout_cpus, p.rollout_gpus, p.max_retries, cfg.seed
        )
        for w in self.pool.warnings():
            _say(f"sandbox: {w}")
        self.allocator = build_allocator(cfg.allocator)
        attach_lengths(self.allocator)  # trace_plus: its length predictor
        template = TEMPLATES.get(cfg.model.template)(tok)
        tools = list(tool_env_class(cfg.env.name).tools)
        self.predictor = make_text_predictor(
            cfg.predictor,
            cfg.seed,
            model,
            tok,
            lambda q: template.prompt(q, tools),
            name=self.allocator.predictor,
            targets=self.allocator.targets,
        )
        self.prompts = task_prompts(cfg.env)
        self.eval_prompts = task_prompts(cfg.env, held_out=True)
        self.rng = np.random.default_rng(cfg.seed)
        # Token mode: generated tokens and leaves so far, for the mean cost of a leaf.
        self.spent = [0.0, 0.0]
        if ckpt_dir is not None:
            self.rng.bit_generator.state = state.rng
            self.spent = list(state.spent)
            self.predictor.load_state_dict(torch.load(Path(ckpt_dir) / "predictor.pt", weights_only=False))
            if (Path(ckpt_dir) / "allocator.pt").exists():  # trace_plus: its length predictor
                self.allocator.load_state_dict(
                    torch.load(Path(ckpt_dir) / "allocator.pt", weights_only=False)
                )
        self.phases: dict[str, float] = {}
        self.step_metrics: dict[str, float] = {}
        self.last_out: Any = None
        self.t_step, self.cpu_step = time.perf_counter(), time.process_time()
        if restored is not None:
            self.sync(restored)

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def sync(self, weights: dict[str, Any]) -> None:
        """Push the policy's full HF-named weights (from ``_gather``) to every sampler."""
        import torch

        self.mark("sync_weights")
        t0 = time.perf_counter()
        dtype = getattr(torch, self.cfg.model.dtype)  # the samplers' (master weights may be more precise)
        self.pool.load_weights({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()})
        self.phase("sync_weights", time.perf_counter() - t0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.log(metrics, step)  # spooled under the run's storage while the server is unreachable

    def evaluate(self, step: int) -> dict[str, float]:
        from workflows.evaluate import evaluate_prompts
        from workflows.run_info import key_metrics

        self.mark("eval", step)
        t0 = time.perf_counter()
        m, traces = evaluate_prompts(self.pool.evaluate, self.eval_prompts, 0, 0.0, self.cfg.seed + 10_000)
        with tempfile.TemporaryDirectory() as tmp:  # per-task outcomes: the study's bootstrap resamples tasks
            (Path(tmp) / f"outcomes_step_{step:05d}.json").write_text(
                json.dumps(
                    {t["prompt_id"]: float(any(r["reward"] > 0.5 for r in t["rollouts"])) for t in traces}
                )
            )
            self.metrics.log_artifacts(Path(tmp), "eval")
        out = {"eval/accuracy": m["accuracy"], "eval/well_formed_turns": m["greedy"]["well_formed_turns"]}
        for src, acc in m["greedy"]["by_source"].items():
            out[f"eval/accuracy/{src}"] = acc
        out.update({f"eval/{k}": v for k, v in m["greedy"].get("scores", {}).items()})  # search: em, f1
        if step == 0:  # later evaluations are logged with their step's metrics
            self.log({**out, **key_metrics(out), "budget/retried": float(self.pool.ledger.retried)}, step)
        self.phase("eval", time.perf_counter() - t0)
        _say(
            f"held-out greedy accuracy after {step} steps: {m['accuracy']:.3f} ({len(self.eval_prompts)} tasks)"
        )
        return out

    def rollout_step(self, step: int) -> Any:
        from tracerl.algos.batch import collate
        from tracerl.calibration import collect_calibration, summarize_calibration
        from tracerl.engine.step import run_step
        from tracerl.engine.step_stats import step_metrics
        from workflows.evaluate import leaf_score_means
        from workflows.rollout import sample_pool

        self.phases, self.t_step, self.cpu_step = {}, time.perf_counter(), time.process_time()
        self.mark("rollout", step + 1)
        t0 = time.perf_counter()
        budget = self.cfg.budget
        if budget.token_budget is not None and self.spent[1] > 0:
            budget = budget.for_tokens(self.spent[0] / self.spent[1], max_candidates=len(self.prompts))
        pool = sample_pool(self.prompts, budget.num_candidates, self.rng)
        self.pool.begin_step(step)
        self.phase("select", time.perf_counter() - t0)
        out = run_step(pool, self.allocator, self.predictor, self.pool, budget, self.rng)
        from workflows.rollout import merge_ledgers

        out.ledger = merge_ledgers(out.ledger, self.pool.ledger)
        self.spent = [self.spent[0] + out.ledger.generated_tokens, self.spent[1] + out.ledger.leaves]
        m = step_metrics(out)
        m["budget/leaf_budget"] = float(budget.leaves)
        if self.predictor.ready:
            for group, vals in summarize_calibration(collect_calibration(out)).items():
                m.update({f"predictor/{group}/{k}": v for k, v in vals.items()})
        t0 = time.perf_counter()
        fit = {**self.predictor.fit(out.sampled_trees), **self.allocator.observe(out.sampled_trees)}
        m.update({f"predictor/fit_{k}": v for k, v in fit.items()})
        self.phase("fit_predictor", time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch = collate(
            out.trees, self.cfg.loss.advantage, self.cfg.loss.normalize_std, self.cfg.loss.debiased_values
        )
        self.phase("collate", time.perf_counter() - t0)
        leaves = max(out.ledger.leaves, 1)
        rewards = batch.rewards
        m["train/reward_mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        m["train/accuracy"] = sum(r > 0.5 for r in rewards) / len(rewards) if rewards else 0.0
        m["train/response_tokens"] = out.ledger.generated_tokens / leaves
        m.update({f"rollout/{k}": v for k, v in leaf_score_means(out.trees).items()})  # search: em, f1
        m["train/sequences"] = float(len(batch))
        gen_s = out.ledger.phase_s.get("generate", 0.0)
        m["throughput/generated_tokens_per_s"] = out.ledger.generated_tokens / gen_s if gen_s else 0.0
        self.step_metrics, self.last_out = m, out
        return batch

    def after_update(self, step: int, stats: dict[str, float], weights: dict[str, Any]) -> dict[str, float]:
        from workflows.run_info import key_metrics

        self.sync(weights)
        done = step + 1
        m = dict(self.step_metrics)
        m.update(stats)
        if self.cfg.eval_every and done % self.cfg.eval_every == 0 or done == self.cfg.steps:
            m.update(self.evaluate(done))
        m["budget/retried"] = float(
            self.pool.ledger.retried
        )  # with retries of the weight sync and evaluation
        m["system/attempt"] = float(self.metrics.attempt)
        self.mark("log")
        t0 = time.perf_counter()
        for k, v in self.phases.items():
            m[f"time/{k}_s"] = v
        rollout_s = m.get("time/rollout_s", 0.0)
        overhead = sum(
            m.get(f"time/{k}_s", 0.0) for k in ("score", "allocate_roots", "expand_prefixes", "fit_predictor")
        )
        m["time/alloc_predictor_fraction"] = overhead / rollout_s if rollout_s else 0.0
        m["system/peak_memory_mb"] = _peak_memory_mb()
        m["system/cpu_s"] = time.process_time() - self.cpu_step  # rank 0's process: step driver and learner
        if (self.cfg.log_trees_every and done % self.cfg.log_trees_every == 0) or done == self.cfg.steps:
            self._log_trees(done)
        m["time/log_s"] = time.perf_counter() - t0
        m["time/step_s"] = time.perf_counter() - self.t_step
        m["train/tokens_per_s"] = m.get("budget/generated_tokens", 0.0) / max(m["time/step_s"], 1e-9)
        self.log({**m, **key_metrics(m, self.spent[0])}, done)
        _say(
            f"step {done}/{self.cfg.steps}  ER {m['rollout/effective_ratio']:.2f}  reward {m['train/reward_mean']:.2f}"
            f"  loss {m['train/loss']:+.4f}  clip {m['train/clip_fraction']:.3f}  {m['time/step_s']:.1f} s"
            + (f"  held-out {m['eval/accuracy']:.3f}" if "eval/accuracy" in m else "")
        )
        return m  # every step's metrics reach Ray Train's report (and a sweep's scheduler)

    def _log_trees(self, step: int) -> None:
        from workflows.rollout import outcome_records
        from workflows.viewer import render_html

        if self.last_out is None:
            return
        records = outcome_records(self.last_out)
        with tempfile.TemporaryDirectory() as tmp:
            with open(Path(tmp) / "trees.jsonl", "w") as f:
                for r in records[:16]:
                    f.write(json.dumps(r) + "\n")
            (Path(tmp) / "trees.html").write_text(
                render_html(records[:16], f"{self.cfg.run_name}: step {step}")
            )
            self.metrics.log_artifacts(Path(tmp), f"trees/step_{step:05d}")

    def save(self, path: Path, step: int, weights: dict[str, Any], adapters: dict[str, Any]) -> None:
        import torch

        self.mark("save", step)
        self.export.save_pretrained(path / "policy", state_dict=weights)
        if adapters:
            torch.save(adapters, path / ADAPTERS)
        self.tok.save_pretrained(path / "policy")
        torch.save(self.predictor.state_dict(), path / "predictor.pt")
        if self.allocator.state_dict():
            torch.save(self.allocator.state_dict(), path / "allocator.pt")
        CheckpointState(
            step, self.run_id, self.rng.bit_generator.state, (self.spent[0], self.spent[1])
        ).write(path)
        (path / "config.yaml").write_text(to_yaml(self.cfg))

    def close(self) -> None:
        self.mark("done")
        self.metrics.flush()
        self.pool.shutdown()
