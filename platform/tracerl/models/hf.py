"""Loading an HF causal LM policy from a local checkpoint directory (never from a hub at run time)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

from tracerl.engine.config import SamplerConfig
from tracerl.models.config import ModelConfig


class SetupError(RuntimeError):
    """Something the user must provide or fix before the command can run; the message says what."""


def load_policy(cfg: ModelConfig) -> tuple[Any, Any]:
    """Tokenizer and model from an HF checkpoint directory (no hub access)."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(cfg)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.dtype]
    model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=dtype, local_files_only=True).eval()
    return tok, model


def load_tokenizer(cfg: ModelConfig) -> Any:
    """The tokenizer of the HF checkpoint directory ``model.path`` (its weights files checked whole, not loaded: an
    engine sampler such as vLLM loads them itself), with a pad token (the EOS where it has none)."""
    from transformers import AutoTokenizer

    path = Path(cfg.path)
    if not path.is_dir():
        raise SetupError(
            f"model.path={cfg.path!r} is not a checkpoint directory; build the tiny policy with "
            f"`tracerl bootstrap` (writes models/tiny-math) or point model.path at an HF checkpoint"
        )
    check_weights(path)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


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


def weights_problem(path: Path) -> str | None:
    """What is wrong with one weights file, read without loading it (None: nothing found).

    A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header giving each tensor's byte range,
    then the data: its header must parse and the file must be exactly as long as the furthest range ends (a copy cut
    short, or with bytes appended, fails). A ``.bin``/``.pt`` file from ``torch.save`` (torch >= 1.6) is a zip
    archive whose directory sits at its end: it must open (a truncated one does not). Other files are not checked.
    """
    try:
        size = path.stat().st_size
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    return f"{path.name} is {size} bytes, too short for a safetensors header"
                (n,) = struct.unpack("<Q", head)
                if 8 + n > size:
                    return f"{path.name} is {size} bytes, its safetensors header alone needs {8 + n}"
                header = json.loads(f.read(n))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
            expected = 8 + n + max(ends, default=0)
            if size != expected:
                return f"{path.name} is {size} bytes, its safetensors header says {expected}"
        elif path.suffix in (".bin", ".pt"):
            with open(path, "rb") as f:
                zipped = f.read(4) == b"PK\x03\x04"
            if zipped:  # torch's pre-1.6 pickle format has no directory to check
                with zipfile.ZipFile(path) as z:
                    z.infolist()
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile) as exc:
        return f"{path.name} cannot be read ({type(exc).__name__}: {exc})"
    return None


def check_weights(path: Path | str) -> None:
    """Every weights file of the checkpoint directory ``path`` is whole (``weights_problem``), checked before
    transformers loads it (whose error on a file cut short names neither the file nor the fix).

    Raises:
        SetupError: one weights file is damaged; says which and what to do.
    """
    d = Path(path)
    for f in sorted([*d.glob("*.safetensors"), *d.glob("*.bin")]):
        why = weights_problem(f)
        if why is not None:
            raise SetupError(
                f"checkpoint {d} is damaged: {why}; point model.path at an intact checkpoint (a training run's "
                "earlier one is under its storage directory, checkpoint_NNNNNN/policy) or re-create this one"
            )
