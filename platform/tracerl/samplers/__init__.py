"""Samplers: the policy's generation backends behind one protocol (``hf``; ``vllm`` on GPU machines; ``scripted`` replays reference turns)."""

from typing import Any

from tracerl.config import ModelConfig, SamplerConfig
from tracerl.samplers.base import SAMPLERS, Generation, Sampler
from tracerl.samplers.hf import HFSampler
from tracerl.samplers.scripted import ScriptedSampler
from tracerl.samplers.vllm import VLLMSampler  # imports vllm lazily, inside its methods

__all__ = ["SAMPLERS", "Generation", "HFSampler", "Sampler", "ScriptedSampler", "VLLMSampler", "make_sampler"]


def make_sampler(
    model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0
) -> Any:
    """The configured backend: ``hf`` around the loaded ``model``; an engine backend (vLLM) started on
    ``model_cfg.path``, sized to hold whole episodes (``sampler.max_context_tokens``) and, when it shares a GPU
    (``gpus`` < 1), to take only that share of the GPU's memory."""
    if cfg.backend == "hf":
        return HFSampler(model, tokenizer, reuse_prefix=cfg.reuse_prefix)
    engine: dict[str, Any] = {"max_model_len": cfg.max_context_tokens}
    if 0 < gpus < 1:
        engine["gpu_memory_utilization"] = round(0.9 * gpus, 3)
    return SAMPLERS.get(cfg.backend).from_pretrained(model_cfg.path, model_cfg.dtype, **engine)
