"""Samplers: the policy's generation backends behind one protocol (``hf``; ``vllm`` on GPU machines)."""

from tracerl.samplers.base import SAMPLERS, Generation, Sampler
from tracerl.samplers.hf import HFSampler
from tracerl.samplers.vllm import VLLMSampler  # imports vllm lazily, inside its methods

__all__ = ["SAMPLERS", "Generation", "HFSampler", "Sampler", "VLLMSampler"]
