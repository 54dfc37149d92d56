"""Before a GPU run starts: does the update's largest micro-batch fit one trainer GPU by the memory estimate?

The estimate is ``tracerl.workflows.ops.gpu_plan.memory_estimate`` (within a few per cent of an H200 run, docs/gpu_check.md)
for the model's architecture, read from ``model.path``'s config on the meta device (no weights loaded), sharded over
``trainer.num_workers`` ranks under FSDP. The largest micro-batch is ``loss.micro_tokens`` (or
``loss.micro_batch_size`` sequences) of ``sampler.max_context_tokens`` tokens at most; a sequence longer than the
token budget is a micro-batch of its own, so the longest sequence counts too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tracerl.config import LossConfig, SamplerConfig, TrainerConfig
from tracerl.models.hf import SetupError
from tracerl.workflows.ops.gpu_plan import largest_micro_tokens, memory_estimate

USABLE = 0.9
"""Share of ``trainer.gpu_memory_gb`` the estimate may fill: the CUDA context and the allocator's fragmentation are
not in it."""


@dataclass(frozen=True)
class UpdateShape:
    """What the estimate needs of a model: parameter counts and widths."""

    params: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    unit_params: int
    """The largest FSDP unit: a decoder block, or the root's own parameters (embeddings, head, final norm)."""


def update_shape(config: Any, trainer: TrainerConfig) -> UpdateShape:
    """``UpdateShape`` of a transformers model config (built on the meta device; LoRA adapters on its targets)."""
    from transformers import AutoModelForCausalLM  # slow to import: transformers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    trainable = params
    if trainer.lora_rank > 0:
        trainable = sum(
            trainer.lora_rank * (m.in_features + m.out_features)
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in trainer.lora_targets
        )
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    largest_block = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    return UpdateShape(
        params=params,
        trainable=trainable,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        unit_params=max(root, largest_block),
    )


def estimate_kwargs(shape: UpdateShape, trainer: TrainerConfig, loss: LossConfig) -> dict[str, int]:
    """``memory_estimate``'s keyword arguments (all but the micro-batch's size) for this model and config."""
    return {
        "params": shape.params,
        "trainable": shape.trainable,
        "layers": shape.layers,
        "hidden": shape.hidden,
        "intermediate": shape.intermediate,
        "vocab": shape.vocab,
        "logit_chunk": loss.logit_chunk,
        "shards": trainer.num_workers if trainer.strategy == "fsdp" else 1,
        "unit_params": shape.unit_params,
    }


def check_update_memory(
    shape: UpdateShape, trainer: TrainerConfig, loss: LossConfig, sampler: SamplerConfig
) -> dict[str, float] | None:
    """The estimate of the largest micro-batch (None: no GPU or no ``trainer.gpu_memory_gb``, nothing checked).

    Raises:
        SetupError: it does not fit; the message names the key to change and the largest value that fits.
    """
    if not trainer.use_gpu or trainer.gpu_memory_gb is None:
        return None
    budget = USABLE * trainer.gpu_memory_gb * 1e9
    kw = estimate_kwargs(shape, trainer, loss)
    longest = sampler.max_context_tokens
    tokens = max(loss.micro_tokens, longest) if loss.micro_tokens > 0 else loss.micro_batch_size * longest
    est = memory_estimate(**kw, micro_batch=1, seq_len=tokens)
    if est["peak"] <= budget:
        return est
    fits = largest_micro_tokens(budget, **kw)
    limit = f"more than {USABLE:.0%} of trainer.gpu_memory_gb={trainer.gpu_memory_gb:g}"
    if fits < longest:
        one = memory_estimate(**kw, micro_batch=1, seq_len=longest)["peak"]
        raise SetupError(
            f"one sequence of sampler.max_context_tokens={longest} tokens needs {one / 1e9:.1f} GB by the "
            f"estimate, {limit}: set sampler.max_context_tokens and loss.micro_tokens <= {fits}, or add trainer "
            "GPUs (trainer.num_workers with trainer.strategy=fsdp)"
        )
    if loss.micro_tokens > 0:
        key = f"loss.micro_tokens={loss.micro_tokens}"
    else:
        key = f"loss.micro_batch_size={loss.micro_batch_size} sequences of up to {longest} tokens"
    raise SetupError(
        f"{key} needs {est['peak'] / 1e9:.1f} GB by the estimate, {limit}: set loss.micro_tokens <= {fits} "
        "(the largest that fits)"
    )
