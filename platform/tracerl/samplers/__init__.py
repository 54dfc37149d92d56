"""Samplers: the policy's generation backends behind one protocol (``hf``; ``vllm`` on GPU machines)."""

from tracerl.samplers.base import SAMPLERS, Generation, Sampler

__all__ = ["SAMPLERS", "Generation", "Sampler"]
