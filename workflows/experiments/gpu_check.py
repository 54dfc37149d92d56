"""The GPU check kit: the learner's update and the hf sampler on a bare CUDA machine (``make gpu-check``).

Needs only torch, transformers and (for the LoRA section) peft: no Ray, vLLM, MLflow or network. The model is
randomly initialised with Qwen3-1.7B's shape (conf/model/qwen3_1_7b_arch.json), so nothing is downloaded.
Sections (each written to the JSON as soon as it ends; docs/gpu_check.md says how to read it):

- ``environment``: versions, device, the plan actually run.
- ``update``: ``tracerl.learner.PolicyLearner`` PPO-clip steps, float32 master weights, bf16 autocast,
  gradient checkpointing, 4k-token sequences; tokens/s and the measured peak memory.
- ``memory``: the estimate for that configuration (formula in ``tracerl.workflows.ops.gpu_plan.memory_estimate``) against the measured peak.
- ``lora_update``: the same update with peft LoRA adapters (``tracerl.models.wrap.apply_lora``).
- ``generation_exact``, ``generation``: ``tracerl.samplers.hf.HFSampler`` (float32, then the plan's dtype) generates a
  turn, continues from the cached prefix, and the
  continuation's log-probs are compared with a re-encode of the whole sequence; tokens/s.

A missing package or no CUDA is a section status ("missing: peft"), not a failure. ``GPU_CHECK_DRY=1`` runs the
same code on CPU with the architecture scaled down (``gpu_plan.scaled``) and short sequences, for the tests.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.workflows.ops.gpu_plan import Plan, exact, load_arch, make_plan, memory_section

BUDGET_S = 300.0
"""The whole check stays under 5 minutes: a section that would start after this is skipped."""


class Report:
    """The JSON report, rewritten after every section."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def put(self, name: str, section: dict[str, Any]) -> None:
        self.data[name] = section
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, default=str))
            tmp.replace(self.path)


def missing(*modules: str) -> str | None:
    """'missing: a, b' for the modules that do not import, else None."""
    gone = []
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError:
            gone.append(m)
    return f"missing: {', '.join(gone)}" if gone else None


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _model(plan: Plan, dtype: str, use_cache: bool, seed: int = 0) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**plan.arch)
    cfg.use_cache = use_cache  # off for training (checkpointing), on for the sampler's KV re-use
    torch.manual_seed(seed)
    with torch.device(plan.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    return model.to(plan.device)  # a no-op when the device context already placed it


def _batch(plan: Plan, vocab: int, seed: int) -> Any:
    """Random sequences: the first half is the prompt (no loss), the second the model's tokens; advantages
    alternate +1 / -0.5 between sequences (a non-zero loss)."""
    import torch

    from tracerl.algos.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab - 2, (plan.sequences, plan.seq_len), generator=g).tolist()
    half = plan.seq_len // 2
    mask = [[i >= half for i in range(plan.seq_len)] for _ in ids]
    adv = [[(1.0 if r % 2 == 0 else -0.5) if m else 0.0 for m in row] for r, row in enumerate(mask)]
    zeros = [[0.0] * plan.seq_len for _ in ids]
    return TrainBatch(ids, mask, adv, zeros, [f"p{r}" for r in range(len(ids))], [0.0] * len(ids))


def run_update(plan: Plan, lora: bool) -> dict[str, Any]:
    """PolicyLearner steps on a random batch; the first step warms up, tokens/s is over the rest."""
    import torch

    from tracerl.config import LossConfig, OptimConfig, TrainerConfig
    from tracerl.learner import PolicyLearner, denominator
    from tracerl.models.wrap import apply_lora

    cuda = plan.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = _model(
        plan, "float32", use_cache=False
    )  # float32 master weights; compute under bf16 autocast as tracerl.learner does
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    if lora:
        model = apply_lora(model, TrainerConfig(lora_rank=plan.lora_rank, lora_alpha=2 * plan.lora_rank))
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    learner = PolicyLearner(
        model,
        OptimConfig(lr=1e-6, warmup_steps=0),
        LossConfig(micro_batch_size=plan.micro_batch, logit_chunk=plan.logit_chunk),
        total_steps=plan.steps,
        pad_id=0,
        autocast=torch.bfloat16,
    )
    batch = _batch(plan, plan.arch["vocab_size"], seed=1)
    times, stats = [], {}
    for _ in range(plan.steps):
        _sync(plan.device)
        t0 = time.perf_counter()
        stats = learner.update(batch, denominator(batch, "token_mean"))
        _sync(plan.device)
        times.append(time.perf_counter() - t0)
    timed = times[1:] or times
    tokens = plan.sequences * plan.seq_len
    out: dict[str, Any] = {
        "status": "ok",
        "device": str(learner.device),
        "params": params,
        "trainable": trainable,
        "tokens_per_step": tokens,
        "step_s": times,
        "tokens_per_s": tokens / (sum(timed) / len(timed)),
        "loss": stats[M.LOSS],
        "grad_norm": stats[M.GRAD_NORM],
        "update_skipped": bool(stats[M.UPDATE_SKIPPED]),
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }
    if not all(math.isfinite(v) for v in (out["loss"], out["grad_norm"])):
        out["status"] = "error: non-finite loss or gradient norm"
    del learner, model
    if cuda:
        torch.cuda.empty_cache()
    return out


class IdTokenizer:
    """The sampler's tokenizer interface for a randomly initialised model, which has no vocabulary to download:
    decode writes the token ids; pad and EOS are the two last ids (a random model seldom samples them)."""

    def __init__(self, vocab: int) -> None:
        self.pad_token_id, self.eos_token_id = vocab - 1, vocab - 2

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def run_generation(plan: Plan) -> dict[str, Any]:
    """A turn, then a continuation from the cached prefix; its log-probs against a re-encode of the sequence."""
    import torch

    from tracerl.samplers.hf import HFSampler

    vocab = plan.arch["vocab_size"]
    model = _model(plan, plan.sampler_dtype, use_cache=True)
    sampler = HFSampler(model, IdTokenizer(vocab), device=plan.device, reuse_prefix=True)
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(2, vocab - 2, (plan.gen_batch, plan.prompt_len), generator=g).tolist()
    obs = torch.randint(2, vocab - 2, (plan.gen_batch, plan.obs_len), generator=g).tolist()
    _sync(plan.device)
    t0 = time.perf_counter()
    first = sampler.generate(prompts, plan.new_tokens, [], temperature=1.0, seeds=range(len(prompts)))
    _sync(plan.device)
    t1 = time.perf_counter()
    nxt = [p + f.token_ids + o for p, f, o in zip(prompts, first, obs)]
    second = sampler.generate(
        nxt, plan.new_tokens, [], temperature=1.0, seeds=range(len(nxt)), caches=[f.cache for f in first]
    )
    _sync(plan.device)
    t2 = time.perf_counter()
    diff = 0.0
    with torch.no_grad():
        for ctx, gen in zip(nxt, second):
            if not gen.token_ids:
                continue
            ids = torch.tensor([ctx + gen.token_ids], device=plan.device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            pos = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(gen.token_ids), device=plan.device)
            ref = logp[pos, torch.tensor(gen.token_ids, device=plan.device)].cpu()
            diff = max(diff, float((ref - torch.tensor(gen.logprobs)).abs().max()))
    gen1, gen2 = sum(len(f.token_ids) for f in first), sum(len(s.token_ids) for s in second)
    reused, ctx_tokens = sum(s.reused_tokens for s in second), sum(len(n) for n in nxt)
    ok = diff <= plan.logprob_tol and reused > 0
    del sampler, model
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return {
        "status": "ok"
        if ok
        else f"mismatch: max |log-prob diff| {diff:.3g} > {plan.logprob_tol} or no prefix re-used",
        "dtype": plan.sampler_dtype,
        "batch": plan.gen_batch,
        "first_turn": {"generated_tokens": gen1, "seconds": t1 - t0, "tokens_per_s": gen1 / (t1 - t0)},
        "continuation": {
            "generated_tokens": gen2,
            "seconds": t2 - t1,
            "tokens_per_s": gen2 / (t2 - t1),
            "reused_tokens": reused,
            "prefill_tokens": sum(s.prefill_tokens for s in second),
            "reused_fraction": reused / ctx_tokens,
        },
        "max_abs_logprob_diff": diff,
        "tolerance": plan.logprob_tol,
    }


def environment(plan: Plan | None, error: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"status": error or "ok"}
    for mod in ("torch", "transformers", "peft"):
        try:
            info[mod] = importlib.import_module(mod).__version__
        except ImportError:
            info[mod] = None
    if info["torch"]:
        import torch

        info["cuda"] = torch.cuda.is_available()
        info["gpu"] = torch.cuda.get_device_name(0) if info["cuda"] else None
        info["gpu_total_bytes"] = torch.cuda.get_device_properties(0).total_memory if info["cuda"] else None
    if plan is not None:
        info["plan"] = asdict(plan)
    return info


def run(json_path: Path | None, dry: bool, budget_s: float = BUDGET_S) -> dict[str, Any]:
    """Every section in turn; returns the report (also written to ``json_path`` after each section)."""
    start = time.perf_counter()
    report = Report(json_path)
    base = missing("torch", "transformers")
    cuda = False
    if base is None:
        import torch

        cuda = torch.cuda.is_available()
    gate = base or (None if dry or cuda else "missing: cuda (GPU_CHECK_DRY=1 runs the small CPU version)")
    plan = make_plan(dry, cuda, load_arch())
    report.put("environment", environment(plan, base))

    def section(name: str, fn: Any, *extra: str) -> dict[str, Any] | None:
        reason = gate or missing(*extra)
        if reason is None and time.perf_counter() - start > budget_s:
            reason = f"skipped: the {budget_s:.0f} s budget is spent"
        if reason is not None:
            report.put(name, {"status": reason})
            return None
        try:
            result: dict[str, Any] = fn()
        except Exception as e:  # a failing section is reported; the next one still runs
            result = {"status": f"error: {type(e).__name__}: {e}"}
        report.put(name, result)
        return result

    update = section("update", lambda: run_update(plan, lora=False))
    if update is not None and update["status"] == "ok":
        report.put("memory", memory_section(plan, update))
    else:
        report.put("memory", {"status": "skipped: no update measured"})
    lora = section("lora_update", lambda: run_update(plan, lora=True), "peft")
    if (
        lora is not None and lora["status"] == "ok"
    ):  # the same estimate with the adapters as the trainable part
        report.put("lora_update", {**lora, "memory": memory_section(plan, lora)})
    section("generation_exact", lambda: run_generation(exact(plan)))
    section("generation", lambda: run_generation(plan))
    report.put("total_s", {"status": "ok", "seconds": time.perf_counter() - start})
    return report.data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tracerl.workflows.experiments.gpu_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--json",
        default=os.environ.get("GPU_CHECK_OUT", "bench_out/gpu_check.json"),
        help="where the report goes (default: $GPU_CHECK_OUT or bench_out/gpu_check.json)",
    )
    args = ap.parse_args(argv)
    dry = os.environ.get("GPU_CHECK_DRY", "0") not in ("", "0")
    data = run(Path(args.json), dry)
    summary = {k: v.get("status") for k, v in data.items()}
    print(json.dumps(summary, indent=2))  # the command's own output (library code never prints)
    print(f"report: {args.json}")
    return 1 if any(str(s).startswith("error") for s in summary.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
