"""What the GPU check runs (workflows/experiments/gpu_check.py): the plan of a full or dry run, and the memory formula its
measured peak is compared with.

The full plan is Qwen3-1.7B's shape (conf/model/qwen3_1_7b_arch.json) with 4k-token sequences; the dry plan the
same architecture scaled down (``scaled``) with short sequences, for the CPU tests.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.shipped import CONF

ARCH = CONF / "model" / "qwen3_1_7b_arch.json"

# Bytes per element of the activations that the estimate counts (see memory_estimate).
RESIDUAL_BYTES = 4  # the residual stream is float32: embeddings are not autocast, norms compute in float32
LAYER_BYTES_PER_HIDDEN = (
    24  # one recomputed layer: norms (fp32), q/k/v/o inputs and outputs (bf16), attention
)
LAYER_BYTES_PER_INTERMEDIATE = 8  # gate, up, act(gate), act*up in bf16
LOGIT_BYTES = (
    20  # log-softmax and exp kept for backward (fp32), plus the fp32 gradients flowing back through them
)
HEAD_INPUT_BYTES = 8  # chunked path: the loss positions' final hidden rows (fp32) and their gradient
GATHERED_BYTES = 4  # FSDP: the unit in use and the one prefetched, each gathered in bf16
ADAM_TEMP_BYTES = 4  # foreach AdamW's full-size float32 temporary during the step


@dataclass(frozen=True)
class Plan:
    """What one run does: the architecture, the update's batch and the sampler's turns."""

    dry: bool
    device: str
    arch: dict[str, Any]
    seq_len: int
    sequences: int
    micro_batch: int
    steps: int
    lora_rank: int
    gen_batch: int
    prompt_len: int
    obs_len: int
    new_tokens: int
    sampler_dtype: str
    logprob_tol: float
    """The largest |log-prob difference| between the sampler and a re-encode that ``generation`` accepts. In float32
    (the dry run and ``generation_exact``) 1e-3: the cached continuation must be exact. In bf16 0.5: a bound on gross
    errors (a wrong position or cache row costs whole nats), above bf16's rounding between incremental and
    full-sequence attention (0.08-0.15 measured on an H200 over 1,200-token contexts, docs/gpu_check.md)."""
    logit_chunk: int = 1024
    """``loss.logit_chunk`` of the update (0: the unchunked full-logits path)."""


def load_arch(path: Path = ARCH) -> dict[str, Any]:
    arch = json.loads(path.read_text())
    if not isinstance(arch, dict) or arch.get("model_type") != "qwen3":
        raise ValueError(f"{path} must be a JSON object with model_type 'qwen3' (a transformers Qwen3Config)")
    return arch


def scaled(arch: dict[str, Any]) -> dict[str, Any]:
    """The same architecture at a small scale factor, for the CPU dry run: 2 layers, widths / 32, heads / 4."""
    small = dict(arch)
    small.update(
        num_hidden_layers=2,
        hidden_size=arch["hidden_size"] // 32,
        intermediate_size=arch["intermediate_size"] // 32,
        num_attention_heads=arch["num_attention_heads"] // 4,
        num_key_value_heads=max(arch["num_key_value_heads"] // 4, 1),
        head_dim=arch["head_dim"] // 8,
        vocab_size=arch["vocab_size"] // 32,
        bos_token_id=None,
        eos_token_id=None,
    )
    return small


def exact(plan: Plan) -> Plan:
    """``plan``'s generation in float32 with the exact tolerance: the check that the cached continuation is right."""
    return dataclasses.replace(plan, sampler_dtype="float32", logprob_tol=1e-3)


def make_plan(dry: bool, cuda: bool, arch: dict[str, Any]) -> Plan:
    if dry:
        return Plan(
            True,
            "cpu",
            scaled(arch),
            seq_len=128,
            sequences=2,
            micro_batch=1,
            steps=2,
            lora_rank=4,
            gen_batch=2,
            prompt_len=24,
            obs_len=6,
            new_tokens=8,
            sampler_dtype="float32",
            logprob_tol=1e-3,
        )
    return Plan(
        False,
        "cuda" if cuda else "none",
        arch,
        seq_len=4096,
        sequences=4,
        micro_batch=1,
        steps=3,
        lora_rank=16,
        gen_batch=8,
        prompt_len=1024,
        obs_len=64,
        new_tokens=128,
        sampler_dtype="bfloat16",
        logprob_tol=0.5,
    )


def memory_estimate(
    params: int,
    trainable: int,
    layers: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    micro_batch: int,
    seq_len: int,
    logit_chunk: int = 0,
    loss_tokens: int | None = None,
    shards: int = 1,
    unit_params: int = 0,
) -> dict[str, float]:
    """Bytes for the update with float32 master weights, AdamW, bf16 autocast and gradient checkpointing.

    weights 4 P + grads 4 T + Adam 8 T (P parameters, T trainable; divided by ``shards`` under FSDP, which adds
    4 U for the unit in use and the one prefetched, gathered in bf16, U = ``unit_params``: the largest unit),
    plus the activations of one micro-batch of N = micro_batch * seq_len tokens: the checkpointed layer inputs
    4 L N H, one recomputed layer N (24 H + 8 I), and the logits path. Unchunked (``logit_chunk`` 0) that is
    20 N V: every position's logits. Chunked (tracerl.models.logprob_head) it is 20 min(C, K) V for one chunk of
    C = ``logit_chunk`` positions plus 8 K H for the K = ``loss_tokens`` (default N) scored positions' hidden rows
    and their gradient. Peak = max(backward: all of that, optimizer step: weights + grads + Adam + a 4 T
    temporary).
    """
    n = micro_batch * seq_len
    k = n if loss_tokens is None else min(loss_tokens, n)
    logits = LOGIT_BYTES * (min(logit_chunk, k) if logit_chunk > 0 else n) * vocab
    parts = {
        "weights": 4.0 * params / shards,
        "grads": 4.0 * trainable / shards,
        "adam": 8.0 * trainable / shards,
        "gathered": float(GATHERED_BYTES * unit_params) if shards > 1 else 0.0,
        "checkpoints": float(RESIDUAL_BYTES * layers * n * hidden),
        "layer_recompute": float(
            n * (LAYER_BYTES_PER_HIDDEN * hidden + LAYER_BYTES_PER_INTERMEDIATE * intermediate)
        ),
        "logits": float(logits),
        "head_inputs": float(HEAD_INPUT_BYTES * k * hidden) if logit_chunk > 0 else 0.0,
    }
    static = parts["weights"] + parts["grads"] + parts["adam"] + parts["gathered"]
    backward = static + sum(parts[x] for x in ("checkpoints", "layer_recompute", "logits", "head_inputs"))
    step = static + ADAM_TEMP_BYTES * trainable / shards
    return {**parts, "peak": max(backward, step)}


def largest_micro_tokens(budget_bytes: float, **shape: int) -> int:
    """The most tokens one micro-batch may hold for ``memory_estimate(**shape, micro_batch=1, seq_len=tokens)``
    to stay within ``budget_bytes`` (0: not even one token; loss tokens = all tokens, the worst case)."""

    def fits(n: int) -> bool:
        return memory_estimate(**shape, micro_batch=1, seq_len=n)["peak"] <= budget_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # fits(lo), not fits(hi); the estimate grows with n
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def memory_section(plan: Plan, update: dict[str, Any]) -> dict[str, Any]:
    a = plan.arch
    est = memory_estimate(
        update["params"],
        update["trainable"],
        a["num_hidden_layers"],
        a["hidden_size"],
        a["intermediate_size"],
        a["vocab_size"],
        plan.micro_batch,
        plan.seq_len,
        logit_chunk=plan.logit_chunk,
        # gpu_check._batch: the loss tokens are the second half of every sequence
        loss_tokens=plan.micro_batch * (plan.seq_len - plan.seq_len // 2),
    )
    peak = update.get("peak_bytes")
    return {
        "status": "ok" if peak is not None else "ok: no CUDA, estimate only",
        "estimate_bytes": est,
        "measured_peak_bytes": peak,
        "measured_over_estimate": peak / est["peak"] if peak else None,
        "formula": memory_estimate.__doc__,
    }
