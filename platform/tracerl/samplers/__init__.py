"""Samplers: the policy's generation backends behind one protocol (``hf``; ``vllm`` on GPU machines; ``scripted`` replays reference turns)."""

from tracerl.samplers.base import SAMPLERS, Generation, Sampler
from tracerl.samplers.hf import HFSampler
from tracerl.samplers.scripted import ScriptedSampler
from tracerl.samplers.vllm import VLLMSampler  # imports vllm lazily, inside its methods

__all__ = ["SAMPLERS", "Generation", "HFSampler", "Sampler", "ScriptedSampler", "VLLMSampler"]
