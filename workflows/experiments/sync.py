"""``tracerl bench sync``: one weight push of a model of a chosen size from a trainer to N hf sampler actors on the
embedded Ray, timed, with the host memory it takes on both sides.

The model is a randomly initialised Qwen3 architecture of ``vocab`` x ``hidden`` x ``layers`` (intermediate
``intermediate`` or 3 x hidden, heads of 64 dimensions, untied head). This process plays the trainer's rank 0: it
holds the float32 master weights, as a DDP trainer does, and pushes them the way the training loop does
(``push_policy``: the same function ``workflows/train/loop.py`` calls). The samplers are ``RolloutWorker`` actors
(``pools.rollout_workers`` of the train config) that loaded the same architecture in ``dtype`` from a checkpoint
written into ``bench_out`` first.

Memory is the resident set (``VmRSS`` of /proc/<pid>/status, anonymous and shared pages: what the process touched
of the object store counts) sampled every ``sample_ms`` by a thread in each process during the push; "extra" is the
peak less the reading just before the push. The sender's peak is this process's; the receiver's, the largest of
the actors'. ``pushes`` pushes run; the first is a warm-up, the table gives the mean seconds of the others and the
largest peaks of all.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tracerl.workflows.experiments.config import BenchSyncConfig
from tracerl.workflows.ops.results import write_results

PROBES = ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight")


def _arch(cfg: BenchSyncConfig) -> Any:
    from transformers import Qwen3Config

    heads = cfg.hidden // 64
    return Qwen3Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate or 4 * cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )


def write_checkpoint(cfg: BenchSyncConfig, path: Path) -> Any:
    """The float32 model (the sender's master weights) and its checkpoint in ``cfg.dtype`` at ``path`` (the
    samplers' start), with the tiny policy's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(_arch(cfg)).float()
    path.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, cfg.dtype)).save_pretrained(path)
    model.float()
    for f in Path("models/tiny-math").glob("tokenizer*"):
        shutil.copy(f, path / f.name)
    return model


def run_sync_bench(cfg: BenchSyncConfig, progress: Any = lambda s: None) -> dict[str, Any]:
    """Write the checkpoint, start the samplers on the embedded Ray, push ``cfg.pushes`` times; results.json."""
    import ray
    import torch

    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import ClusterConfig, EnvConfig, ModelConfig, PoolConfig, SamplerConfig, TrainerConfig
    from tracerl.workflows.experiments.proc_memory import RssPeak
    from tracerl.workflows.experiments.sync_actors import (
        SyncBenchPool,  # Ray: imported when the bench runs, not by the CLI
    )
    from tracerl.workflows.ops.ray_utils import init_ray
    from tracerl.workflows.train.push import push_policy

    out = Path(cfg.bench_out)
    ckpt = out / "model"
    model = write_checkpoint(cfg, ckpt)
    params = sum(p.numel() for p in model.parameters())
    size = params * torch.finfo(getattr(torch, cfg.dtype)).bits // 8
    progress(
        f"sync: {params / 1e6:.0f} M parameters, {size / 1e9:.2f} GB in {cfg.dtype}, {cfg.samplers} samplers"
    )
    init_ray(
        ClusterConfig(address="local", num_cpus=cfg.samplers + 1, object_store_memory_mb=cfg.object_store_mb)
    )
    pools = PoolConfig(
        rollout_workers=cfg.samplers, rollout_cpus=0.5, sampler_threads=cfg.sampler_threads, env_workers=0
    )
    spec = WorkerSpec(
        model=ModelConfig(path=str(ckpt.resolve()), dtype=cfg.dtype),
        sampler=SamplerConfig(backend="hf"),
        env=EnvConfig(name="math"),
        pools=pools,
    )
    pool = SyncBenchPool(spec, cfg.samplers, 0.5, 0.0, 0, cfg.seed)
    trainer = TrainerConfig(push_bucket_mb=cfg.bucket_mb)
    rows = []
    try:
        pool.wait_ready()
        for i in range(cfg.pushes):
            with torch.no_grad():  # a new version each push, so every push carries new values
                next(model.parameters()).add_(1.0)
            ray.get([w.rss_start.remote(cfg.sample_ms / 1000) for w in pool.workers])
            sender = RssPeak(cfg.sample_ms / 1000)
            t0 = time.perf_counter()
            push_policy(model, trainer, pool, cfg.dtype)
            seconds = time.perf_counter() - t0
            send = sender.stop()
            recv = ray.get([w.rss_stop.remote() for w in pool.workers])
            probe = ray.get(pool.workers[0].probe.remote(PROBES))
            rows.append({"push": i, "seconds": seconds, "sender": send, "receivers": recv, "probe": probe})
            progress(f"sync: push {i}: {seconds:.2f} s, sender +{send['extra'] / 1e9:.2f} GB")
    finally:
        pool.shutdown()
    state = model.state_dict()
    want = [float(x) for k in PROBES for x in state[k].to(getattr(torch, cfg.dtype)).flatten()[:4]]
    timed = rows[1:] or rows
    summary = {
        "config": asdict(cfg),
        "params": params,
        "model_bytes": size,
        "pushes": rows,
        "seconds_mean": sum(r["seconds"] for r in timed) / len(timed),
        "sender_extra_bytes": max(r["sender"]["extra"] for r in rows),
        "receiver_extra_bytes": max(x["extra"] for r in rows for x in r["receivers"]),
        "landed": rows[-1]["probe"] == want,
    }
    shutil.rmtree(ckpt, ignore_errors=True)
    write_results(out, summary, cfg.json_path, indent=1)
    return summary


def format_table(summary: dict[str, Any]) -> str:
    c, size = summary["config"], summary["model_bytes"]
    lines = [
        f"weight push: {summary['params'] / 1e6:.0f} M parameters ({c['vocab']} vocab, {c['hidden']} hidden, "
        f"{c['layers']} layers), {size / 1e9:.2f} GB in {c['dtype']}, to {c['samplers']} hf sampler actors, "
        f"bucket {c['bucket_mb']} MB",
        f"{'push':>4} {'seconds':>8} {'sender +GB':>10} {'receiver +GB':>12}",
    ]
    for r in summary["pushes"]:
        recv = max(x["extra"] for x in r["receivers"])
        lines.append(
            f"{r['push']:>4} {r['seconds']:>8.2f} {r['sender']['extra'] / 1e9:>10.2f} {recv / 1e9:>12.2f}"
        )
    lines.append(
        f"mean seconds (pushes after the first) {summary['seconds_mean']:.2f}; peak extra sender "
        f"{summary['sender_extra_bytes'] / size:.2f} x the model, receiver {summary['receiver_extra_bytes'] / size:.2f} x; "
        f"weights landed: {summary['landed']}"
    )
    return "\n".join(lines)
