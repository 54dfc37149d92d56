"""Loading an HF causal LM policy from a local checkpoint directory (never from a hub at run time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.config import ModelConfig, SamplerConfig


class SetupError(RuntimeError):
    """Something the user must provide or fix before the command can run; the message says what."""


def load_policy(cfg: ModelConfig) -> tuple[Any, Any]:
    """Tokenizer and model from an HF checkpoint directory (no hub access)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(cfg.path)
    if not path.is_dir():
        raise SetupError(
            f"model.path={cfg.path!r} is not a checkpoint directory; build the tiny policy with "
            f"`tracerl bootstrap` (writes models/tiny-math) or point model.path at an HF checkpoint"
        )
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok, model


def check_window(path: str, cfg: SamplerConfig) -> None:
    """An engine backend (vLLM) is started with room for ``sampler.max_context_tokens``, which must lie within the
    checkpoint's position window (reads its config only). The hf backend runs a RoPE model past its window
    (degrading, not failing), so it is not held to it."""
    from transformers import AutoConfig

    if cfg.backend == "hf" or not Path(path).is_dir():
        return  # load_policy says what is wrong with a path
    window = getattr(AutoConfig.from_pretrained(path, local_files_only=True), "max_position_embeddings", None)
    if isinstance(window, int) and cfg.max_context_tokens > window:
        raise SetupError(
            f"sampler.max_context_tokens={cfg.max_context_tokens} is beyond the position window of "
            f"{path} (max_position_embeddings={window}), which sampler.backend={cfg.backend} cannot "
            f"exceed: set sampler.max_context_tokens={window} or less"
        )
