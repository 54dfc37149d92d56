"""What the GPU check runs (workflows/ops/gpu_check.py): the plan of a full or dry run, and the memory formula its
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

ARCH = Path(__file__).resolve().parents[2] / "conf" / "model" / "qwen3_1_7b_arch.json"

# Bytes per element of the activations that the estimate counts (see memory_estimate).
RESIDUAL_BYTES = 4  # the residual stream is float32: embeddings are not autocast, norms compute in float32
LAYER_BYTES_PER_HIDDEN = (
    24  # one recomputed layer: norms (fp32), q/k/v/o inputs and outputs (bf16), attention
)
LAYER_BYTES_PER_INTERMEDIATE = 8  # gate, up, act(gate), act*up in bf16
LOGIT_BYTES = (
    20  # log-softmax and exp kept for backward (fp32), plus the fp32 gradients flowing back through them
)
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
) -> dict[str, float]:
    """Bytes for the update with float32 master weights, AdamW, bf16 autocast and gradient checkpointing.

    weights 4 P + grads 4 T + Adam 8 T (P parameters, T trainable), plus the activations of one micro-batch of
    N = micro_batch * seq_len tokens: the checkpointed layer inputs 4 L N H, one recomputed layer
    N (24 H + 8 I), and the logits path 20 N V. Peak = max(backward: all of that, optimizer step: weights + grads
    + Adam + a 4 T temporary).
    """
    n = micro_batch * seq_len
    parts = {
        "weights": 4.0 * params,
        "grads": 4.0 * trainable,
        "adam": 8.0 * trainable,
        "checkpoints": float(RESIDUAL_BYTES * layers * n * hidden),
        "layer_recompute": float(
            n * (LAYER_BYTES_PER_HIDDEN * hidden + LAYER_BYTES_PER_INTERMEDIATE * intermediate)
        ),
        "logits": float(LOGIT_BYTES * n * vocab),
    }
    static = parts["weights"] + parts["grads"] + parts["adam"]
    backward = static + parts["checkpoints"] + parts["layer_recompute"] + parts["logits"]
    step = static + ADAM_TEMP_BYTES * trainable
    return {**parts, "peak": max(backward, step)}


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
    )
    peak = update.get("peak_bytes")
    return {
        "status": "ok" if peak is not None else "ok: no CUDA, estimate only",
        "estimate_bytes": est,
        "measured_peak_bytes": peak,
        "measured_over_estimate": peak / est["peak"] if peak else None,
        "formula": memory_estimate.__doc__,
    }
