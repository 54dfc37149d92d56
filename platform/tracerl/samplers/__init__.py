"""Samplers: the policy's generation backends behind one protocol (``hf``; ``vllm`` on GPU machines; ``scripted`` replays reference turns)."""

from typing import Any

from tracerl.engine.config import SamplerConfig
from tracerl.models.config import ModelConfig
from tracerl.samplers.base import SAMPLERS, Generation, Sampler, SamplerBackend
from tracerl.samplers.hf import HFSampler
from tracerl.samplers.scripted import ScriptedSampler
from tracerl.samplers.vllm import VLLMSampler  # imports vllm lazily, inside its methods

__all__ = [
    "SAMPLERS",
    "Generation",
    "HFSampler",
    "Sampler",
    "SamplerBackend",
    "ScriptedSampler",
    "VLLMSampler",
    "make_sampler",
]


def make_sampler(
    model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0, **extra: Any
) -> Sampler:
    """The backend ``sampler.backend`` names, from the registry (``SamplerBackend.from_config``): ``hf`` around the
    loaded ``model``; ``vllm`` an engine of its own on ``model_cfg.path``, holding a ``gpus`` share of a GPU.
    ``extra``: keywords only some backends take (``push_transport``: those with ``collective_push``)."""
    return SAMPLERS.get(cfg.backend).from_config(model_cfg, cfg, model, tokenizer, gpus, **extra)
