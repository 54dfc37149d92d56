"""``tracerl bench update``: one learner update of a chosen shape on this machine, its time and peak memory beside
the memory estimate (workflows/ops/gpu_plan.py).

The model is a randomly initialised Qwen3 architecture of ``vocab`` x ``hidden`` x ``layers`` (intermediate 4 x
hidden, heads of 32, untied head), float32 master weights with gradient checkpointing as the GPU configs run;
``dtype`` bfloat16 computes under autocast. The batch is ``tokens`` tokens in sequences of ``seq_len`` (the first
half prompt, the second loss tokens, as the GPU kit's), ``micro_tokens`` a micro-batch (0: all of them in one).
Each measured case runs in its own subprocess, so its peak is its own: resident set size (``ru_maxrss``) on CPU,
``torch.cuda.max_memory_allocated`` on a GPU. ``max_gb`` caps the subprocess's address space (``RLIMIT_AS``) so a
case that needs more fails with an allocation error instead of pressing on the machine; a failed case is a row
with its error. ``updates`` updates run; the time is the last one's (the first warms the allocator up).
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.workflows.experiments.config import BenchUpdateConfig
from tracerl.workflows.ops.results import write_results


def _model(cfg: BenchUpdateConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(cfg.seed)
    arch = Qwen3Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=4 * cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.hidden // 32,
        num_key_value_heads=cfg.hidden // 32,
        head_dim=32,
        max_position_embeddings=max(cfg.seq_len, 128),
        tie_word_embeddings=False,
        use_cache=False,
    )
    model = AutoModelForCausalLM.from_config(arch).float()
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    return model


def _batch(cfg: BenchUpdateConfig) -> Any:
    import torch

    from tracerl.algos.batch import TrainBatch

    n = cfg.tokens // cfg.seq_len
    g = torch.Generator().manual_seed(cfg.seed + 1)
    ids = torch.randint(1, cfg.vocab, (n, cfg.seq_len), generator=g).tolist()
    mask = [[j >= cfg.seq_len // 2 for j in range(cfg.seq_len)] for _ in range(n)]
    adv = [[(1.0 if r % 2 == 0 else -0.5) if m else 0.0 for m in row] for r, row in enumerate(mask)]
    zeros = [[0.0] * cfg.seq_len for _ in range(n)]
    return TrainBatch(ids, mask, adv, zeros, [f"p{r}" for r in range(n)], [0.0] * n)


def estimate(cfg: BenchUpdateConfig, chunk: int) -> dict[str, float]:
    """The memory estimate of the case (float32 master weights, all parameters trainable)."""
    import torch

    from tracerl.workflows.ops.gpu_plan import memory_estimate

    with torch.device("meta"):  # the parameter count without allocating the weights
        params = sum(p.numel() for p in _model(cfg).parameters())
    micro = cfg.micro_tokens or cfg.tokens
    micro = max(cfg.seq_len, micro // cfg.seq_len * cfg.seq_len)  # whole sequences
    return memory_estimate(
        params,
        params,
        cfg.layers,
        cfg.hidden,
        4 * cfg.hidden,
        cfg.vocab,
        1,
        micro,
        logit_chunk=chunk,
        loss_tokens=micro // 2,
    )


def run_case(cfg: BenchUpdateConfig, chunk: int) -> dict[str, Any]:
    """One case in this process: ``updates`` updates; seconds of the last, tokens/s, peak memory."""
    import torch

    from tracerl.algos.batch import micro_batch_groups
    from tracerl.config import LossConfig, OptimConfig
    from tracerl.learner import PolicyLearner, denominator

    cuda = torch.cuda.is_available()
    model = _model(cfg).to("cuda" if cuda else "cpu")
    batch = _batch(cfg)
    loss = LossConfig(micro_tokens=cfg.micro_tokens or cfg.tokens, logit_chunk=chunk)
    autocast = torch.bfloat16 if cfg.dtype == "bfloat16" else None
    learner = PolicyLearner(
        model,
        OptimConfig(lr=1e-6, warmup_steps=0),
        loss,
        total_steps=cfg.updates,
        pad_id=0,
        autocast=autocast,
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds, stats = 0.0, {}
    for _ in range(cfg.updates):
        t0 = time.perf_counter()
        stats = learner.update(batch, denominator(batch, "token_mean"))
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return {
        "status": "ok",
        "device": "cuda" if cuda else "cpu",
        "seconds": seconds,
        "tokens_per_s": cfg.tokens / seconds,
        "peak_bytes": torch.cuda.max_memory_allocated()
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_kind": "max_memory_allocated" if cuda else "ru_maxrss",
        "rss_before_update_bytes": rss_before,
        "loss": stats.get(M.LOSS),
        "micro_batches": len(micro_batch_groups([cfg.seq_len] * len(batch), 1, loss.micro_tokens)),
    }


def _child(cfg_json: str, chunk: int, max_gb: float, out: Any) -> None:
    if max_gb > 0:
        cap = int(max_gb * 1e9)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        out.put(run_case(BenchUpdateConfig(**json.loads(cfg_json)), chunk))
    except (RuntimeError, MemoryError) as exc:  # an allocation beyond max_gb
        out.put({"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
    except Exception:  # noqa: BLE001 - reported as the case's row
        out.put({"status": "error: " + traceback.format_exc(limit=2).strip().splitlines()[-1][:300]})


def run_update_bench(cfg: BenchUpdateConfig, progress: Any = lambda s: None) -> dict[str, Any]:
    """Every case of ``cfg.chunks`` in its own subprocess (or the start-up cases of ``startup_ranks``);
    results.json under ``bench_out``."""
    out = Path(cfg.bench_out)
    if cfg.startup_ranks:
        from tracerl.workflows.experiments.rank_load import dump, run_startup_bench

        summary = {"config": asdict(cfg), **run_startup_bench(_model(cfg), cfg.startup_ranks, out, progress)}
        for path in (out / "results.json", *([Path(cfg.json_path)] if cfg.json_path else [])):
            dump(summary, path)
        return summary
    ctx = multiprocessing.get_context("spawn")
    cases = []
    for chunk in cfg.chunks:
        progress(f"update: logit_chunk={chunk} ({'chunked' if chunk else 'unchunked'}), {cfg.tokens} tokens")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(json.dumps(asdict(cfg)), chunk, cfg.max_gb, q))
        p.start()
        p.join()
        row = q.get() if not q.empty() else {"status": f"error: the subprocess died (exit code {p.exitcode})"}
        row["logit_chunk"] = chunk
        row["estimate_bytes"] = estimate(cfg, chunk)
        cases.append(row)
    summary = {"config": asdict(cfg), "cases": cases}
    write_results(out, summary, cfg.json_path, indent=1)
    return summary


def format_table(summary: dict[str, Any]) -> str:
    if "startup" in summary:
        from tracerl.workflows.experiments.rank_load import format_startup

        return format_startup(summary)
    c = summary["config"]
    head = (
        f"one update: vocab {c['vocab']}, hidden {c['hidden']}, {c['layers']} layers, {c['tokens']} tokens "
        f"({c['seq_len']} a sequence), micro_tokens {c['micro_tokens'] or c['tokens']}, {c['dtype']}"
    )
    lines = [
        head,
        f"{'logit_chunk':>11} {'seconds':>8} {'tokens/s':>9} {'peak GB':>8} {'estimate GB':>11}  status",
    ]
    for r in summary["cases"]:
        ok = r["status"] == "ok"
        sec = f"{r['seconds']:.2f}" if ok else "-"
        tps = f"{r['tokens_per_s']:.0f}" if ok else "-"
        peak = f"{r['peak_bytes'] / 1e9:.2f}" if ok else "-"
        est = f"{r['estimate_bytes']['peak'] / 1e9:.2f}"
        lines.append(f"{r['logit_chunk']:>11} {sec:>8} {tps:>9} {peak:>8} {est:>11}  {r['status']}")
    return "\n".join(lines)
