"""The trainer's view of the policy: LoRA adapters (peft) and full, HF-named weights from any wrapping.

Samplers, checkpoints and the registry always get a plain HF state dict (the architecture's own key names):
``full_weights`` gathers it from a plain, DDP- or FSDP-wrapped model, with LoRA adapters merged into the base
weights (W + alpha/r * B A). Gathering an FSDP model is a collective: every rank calls it.
"""

from __future__ import annotations

from typing import Any

import torch

from tracerl.actors.config import TrainerConfig
from tracerl.models.hf import SetupError

_PEFT_PREFIX = "base_model.model."


def _check_targets(model: torch.nn.Module, cfg: TrainerConfig) -> None:
    try:
        import peft  # noqa: F401
    except ImportError as e:  # pragma: no cover - peft is in the dev and lora extras
        raise SetupError(
            "trainer.lora_rank > 0 needs peft: pip install -e '.[lora]' (or set trainer.lora_rank=0)"
        ) from e
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    }  # Conv1D: GPT-2's linear layers
    missing = sorted(set(cfg.lora_targets) - names)
    if missing:
        raise SetupError(
            f"trainer.lora_targets {missing} name no linear layer of this model; its linear layers are "
            f"{sorted(names)}"
        )


def check_lora(model_path: str, cfg: TrainerConfig) -> None:
    """Check ``trainer.lora_*`` against the checkpoint's architecture before a run starts (no weights loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model_path, local_files_only=True)
        )
    _check_targets(model, cfg)


def apply_lora(model: torch.nn.Module, cfg: TrainerConfig) -> torch.nn.Module:
    """Wrap ``model`` with trainable LoRA adapters (base weights frozen) when ``trainer.lora_rank > 0``."""
    if cfg.lora_rank <= 0:
        return model
    from peft import LoraConfig, get_peft_model

    _check_targets(model, cfg)
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=list(cfg.lora_targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    wrapped = get_peft_model(model, lora)  # peft also prepares a checkpointed model (inputs require grad)
    return wrapped


def lora_scaling(cfg: TrainerConfig) -> float:
    return cfg.lora_alpha / cfg.lora_rank


def merge_lora(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft LoRA state dict (``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``, ...) as the
    plain architecture's state dict with every adapter merged: ``W + scaling * B @ A``."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key or ".lora_embedding_" in key or ".lora_magnitude" in key:
            continue
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        if ".base_layer." in name:
            module, _, leaf = name.replace(".base_layer.", ".\0").partition("\0")
            name = module + leaf
            if leaf == "weight":
                stem = key.rsplit(".base_layer.", 1)[0]
                a, b = state.get(f"{stem}.lora_A.default.weight"), state.get(f"{stem}.lora_B.default.weight")
                if a is not None and b is not None:
                    value = (value.float() + scaling * (b.float() @ a.float())).to(value.dtype)
        out[name] = value
    return out


def skeleton(path: str, dtype: torch.dtype) -> torch.nn.Module:
    """The architecture of the checkpoint directory ``path`` on the meta device: no memory, no weights. An FSDP
    rank other than 0 starts from it and receives only its shards (``fill_from_rank0``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(path, local_files_only=True), dtype=dtype
        )
    return model.eval()


def is_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def fill_from_rank0(model: torch.nn.Module, full_state: dict[str, Any] | None, device: torch.device) -> None:
    """Every rank's shards of the FSDP2 ``model`` from rank 0's whole state dict ``full_state`` (taken before
    sharding; None on the other ranks, whose ``model`` is a sharded ``skeleton`` still on the meta device, given
    memory on ``device`` here), one tensor at a time, and the buffers a state dict leaves out (RoPE's
    ``inv_freq``) broadcast as rank 0 holds them. A collective: every rank calls it. No rank but 0 ever holds more
    than its shards and the tensor in flight."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if is_meta(model):
        model.to_empty(device=device)
    set_model_state_dict(
        model, full_state or {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    for buf in model.buffers():
        torch.distributed.broadcast(buf, src=0)


def is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)  # what fully_shard_model returns


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP/FSDP wrapper."""
    return getattr(model, "module", model)


def gather_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainer model's whole state dict on CPU under its own names (peft names for a LoRA model).

    A collective for FSDP (call on every rank; rank 0 gets the weights, the others an empty dict)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state: dict[str, Any] = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    else:
        state = unwrap(model).state_dict()
    return {k: v.detach().to("cpu") for k, v in state.items()}  # FSDP2 keeps the module's own names


def hf_weights(state: dict[str, torch.Tensor], cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """``gather_state``'s dict as the architecture's own state dict (adapters merged for a LoRA run)."""
    if cfg.lora_rank > 0:
        state = merge_lora(state, lora_scaling(cfg))
    return {k: v.clone() for k, v in state.items()}


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA adapters alone, under peft names (what a LoRA run's checkpoint adds to the base policy)."""
    return {k: v.clone() for k, v in state.items() if ".lora_" in k}


def fully_shard_model(model: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder block its own unit, then the root.

    FSDP2 runs on CPU with gloo as well as on GPUs with NCCL (FSDP1 needs an accelerator). Blocks are the classes
    the HF model lists in ``_no_split_modules``; the model must already be on the rank's device. A
    ``compute_dtype`` other than the parameters' is mixed precision: the sharded (master) parameters, their
    gradients and the optimizer state keep the parameters' dtype, each unit's forward and backward run on
    parameters gathered in ``compute_dtype``, and gradients are reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise SetupError(
            f"trainer.strategy=fsdp found no decoder blocks to shard in {type(unwrap(model)).__name__} "
            "(no _no_split_modules); use trainer.strategy=ddp"
        )
    dtype = next(model.parameters()).dtype
    mp = (
        MixedPrecisionPolicy()
        if compute_dtype in (None, dtype)
        else MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    )
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model
