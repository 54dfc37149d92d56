"""The transformers sampler: batched ``generate`` that stops at turn boundaries and re-uses prefix KV.

Contexts are left-padded into one batch; generation stops per sequence at EOS or at a stop string;
new tokens are cut before the stop string and returned with their sampling log-probabilities
(temperature-scaled log-softmax of the logits, as the trainer recomputes them), taken one decode step at a time
(``_StepLogprobs``), never a whole turn's logits at once.

Prefix re-use. Each ``Generation`` carries a handle to the KV cache of its context plus kept tokens
(per layer, this row only, padding removed). A later call passes the handle with a context that
starts with those tokens (the next turn of the episode, or each continuation forked from that turn):
the batch cache is assembled by left-padding every row's cached keys/values to the longest, the
uncached suffixes (an observation, typically) follow with their own left padding, and the attention
mask hides both paddings. Positions come from the mask's cumulative sum, exactly as when the cache
was written, so re-use is numerically the same computation as re-encoding (a test checks log-probs).
Only the uncached suffix counts as prefill computed; the cached length counts as re-used.

Seeds per row. Each context comes with its own seed; sampling is the Gumbel-max draw argmax(logits / T + g)
with the noise g of row r drawn from a generator seeded with row r's seed (one draw per generated token), run
as greedy decoding over the noised scores. A row's tokens therefore do not depend on the other rows of the batch,
up to the float effects of padding on its logits (measured on the tiny model: the same tokens alone and in a
batch of three, log-probs within 1e-5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.engine.config import SamplerConfig
from tracerl.models.config import ModelConfig
from tracerl.samplers.base import SAMPLERS, Generation, cut_at_stop, end_ids
from tracerl.samplers.hf_join import CACHE, JoinBatch
from tracerl.samplers.hf_kv import full_attention, reserved_cache


class _RowGumbel:
    """A logits processor that turns greedy decoding into sampling at ``temperature``, row r's noise from its
    own generator: argmax(scores / T + Gumbel) is a draw from softmax(scores / T)."""

    def __init__(self, seeds: Sequence[int], temperature: float, device: str) -> None:
        self.temperature = temperature
        self.gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        v = scores.shape[-1]
        u = torch.stack([torch.rand(v, generator=g, device=g.device) for g in self.gens])
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        return scores.float() / self.temperature + gumbel.to(scores.device)


class _StepLogprobs:
    """The sampling log-probability of each generated token, one decode step at a time, from the model's raw logits.

    A forward hook keeps the temperature-scaled log-softmax of each forward's last-position logits (in float32, as
    ``generate`` hands them on); as a logits processor, called once per generated position, it moves that block to
    ``pending``, and at the next call, whose ``input_ids`` end with the token drawn from it, keeps that token's
    log-probability only. Memory stays three (rows, vocabulary) blocks, where ``output_logits`` kept every step's logits
    (rows x tokens x vocabulary: 20 GB for 64 rows of 512 tokens over a 152k vocabulary). A row's log-softmax is the
    same alone as in a stacked tensor (a test checks it bitwise)."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.latest: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []
        """Per generated position, (rows,) log-probabilities of the tokens drawn there."""
        self._bufs: tuple[torch.Tensor, ...] | None = None

    def hook(self, module: Any, args: Any, output: Any) -> None:
        logits = output.logits[:, -1].to(dtype=torch.float32).cpu()
        if self._bufs is None or self._bufs[0].shape != logits.shape:
            # written in place each step (a fresh 4.7 MB block a step cost SmolLM2 twice the time): the scaled
            # logits, then two log-softmax blocks taking turns as ``latest`` and ``pending``
            self._bufs = tuple(torch.empty_like(logits) for _ in range(3))
        scaled, *outs = self._bufs
        out = outs[0] if self.pending is not outs[0] else outs[1]
        torch.div(logits, self.temperature, out=scaled)
        self.latest = torch.log_softmax(scaled, dim=-1, out=out)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.drawn(input_ids[:, -1])
        self.pending, self.latest = self.latest, None
        return scores

    def drawn(self, tokens: torch.Tensor) -> None:
        """The tokens drawn from the pending position's distribution (one a row)."""
        assert self.pending is not None
        self.steps.append(self.pending.gather(1, tokens.cpu().long().unsqueeze(1)).squeeze(1))
        self.pending = None


@dataclass(frozen=True)
class _KV:
    tokens: tuple[int, ...]
    """The tokens the cache covers."""
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    """Per layer (keys, values), each (heads, len(tokens), head_dim)."""


@SAMPLERS.register("hf")
class HFSampler:
    def __init__(self, model: Any, tokenizer: Any, device: str = "cpu", reuse_prefix: bool = True) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.reuse_prefix = reuse_prefix
        self.ends = end_ids(tokenizer, model)
        """Every token that ends a turn (``end_ids``: the tokenizer's EOS and the generation config's list)."""
        self.full_attention = full_attention(getattr(model, "config", None))
        """Every layer attends to its whole context: the KV cache grows in reserved buffers (``hf_kv``)."""

    @classmethod
    def from_config(
        cls, model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0
    ) -> HFSampler:
        """Around the loaded policy ``model`` (it generates with the weights the learner updates in place)."""
        return cls(model, tokenizer, reuse_prefix=cfg.reuse_prefix)

    def _usable(self, context: list[int], cache: object | None) -> tuple[_KV, int] | None:
        """The handle and how many of its leading tokens match ``context`` (at least one token is left to feed).

        Any handle sharing a prefix with the context helps: the previous turn's (a prefix of the context),
        or a sibling path's that ran past the fork point (its first tokens are the prefix itself).
        """
        if not self.reuse_prefix or not isinstance(cache, _KV):
            return None
        limit = min(len(cache.tokens), len(context) - 1)
        n = 0
        while n < limit and cache.tokens[n] == context[n]:
            n += 1
        return (cache, n) if n > 0 else None

    @torch.no_grad()
    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float = 1.0,
        seeds: Sequence[int] = (),
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        if len(seeds) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts need one seed each, got {len(seeds)} seeds")
        if not contexts:
            return []
        pad = self.tokenizer.pad_token_id
        kvs = [self._usable(c, k) for c, k in zip(contexts, caches or [None] * len(contexts))]
        cached = [k[1] if k else 0 for k in kvs]
        lc = max(cached)
        suffix = [list(c[n:]) for c, n in zip(contexts, cached)]
        ls = max(len(s) for s in suffix)
        b = len(contexts)
        ids = torch.full((b, lc + ls), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (c, n, s) in enumerate(zip(contexts, cached, suffix)):
            ids[r, lc - n : lc] = torch.tensor(c[:n], dtype=torch.long) if n else ids[r, lc - n : lc]
            mask[r, lc - n : lc] = 1
            ids[r, lc + ls - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[r, lc + ls - len(s) :] = 1
        past = self._batch_cache(kvs, lc, lc + ls + max_new_tokens)
        sample = temperature > 0
        logprobs = _StepLogprobs(temperature if sample else 1.0)
        processors: list[Any] = [logprobs] + ([_RowGumbel(seeds, temperature, self.device)] if sample else [])
        hook = self.model.register_forward_hook(logprobs.hook)
        try:
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                **{CACHE: past},
                max_new_tokens=max_new_tokens,
                do_sample=False,  # sampling is the per-row Gumbel noise on greedy decoding
                logits_processor=processors,
                temperature=None,
                top_p=None,
                top_k=None,
                stop_strings=list(stop) or None,
                tokenizer=self.tokenizer,
                pad_token_id=pad,
                eos_token_id=self.ends or None,
                return_dict_in_generate=True,
            )
        finally:
            hook.remove()
        width = lc + ls
        seqs = out.sequences[:, width:].cpu()
        if len(logprobs.steps) < seqs.shape[1] and logprobs.pending is not None:
            logprobs.drawn(seqs[:, len(logprobs.steps)])  # the last token: no forward read it
        if len(logprobs.steps) < seqs.shape[1]:
            raise RuntimeError(
                f"the hf sampler has log-probabilities for {len(logprobs.steps)} of {seqs.shape[1]} generated "
                f"tokens: {type(self.model).__name__}.generate must run the model itself (pass the plain "
                "transformers model, not a wrapper)"
            )
        logp = torch.stack(logprobs.steps, dim=1) if logprobs.steps else torch.zeros((b, 0))
        gens = []
        for r in range(b):
            kept, text, finish = cut_at_stop(self.tokenizer, seqs[r].tolist(), stop, self.ends)
            lp = logp[r, : len(kept)].tolist()
            handle = (
                self._row_cache(getattr(out, CACHE), mask[r], r, list(contexts[r]) + kept)
                if self.reuse_prefix
                else None
            )
            gens.append(
                Generation(
                    kept,
                    lp,
                    text,
                    finish,
                    prefill_tokens=len(suffix[r]),
                    reused_tokens=cached[r],
                    cache=handle,
                )
            )
        return gens

    def _batch_cache(self, kvs: Sequence[tuple[_KV, int] | None], lc: int, capacity: int) -> Any:
        """The call's KV cache: the rows' cached prefixes left-padded to ``lc`` tokens (none: empty), in buffers
        reserved for ``capacity`` tokens (``hf_kv.reserved_cache``) where the model attends to its whole context;
        else a transformers ``DynamicCache`` (None when nothing is cached)."""
        from transformers import DynamicCache

        reserve = self.full_attention
        if not lc:
            return reserved_cache(capacity) if reserve else None
        ref = next(k for k in kvs if k is not None)[0]
        layers = []
        for li, (k0, _v0) in enumerate(ref.layers):
            h, _, d = k0.shape
            keys = torch.zeros((len(kvs), h, lc, d), dtype=k0.dtype)
            vals = torch.zeros_like(keys)
            for r, item in enumerate(kvs):
                if item is not None:
                    kv, n = item
                    keys[r, :, lc - n :, :] = kv.layers[li][0][:, :n, :]
                    vals[r, :, lc - n :, :] = kv.layers[li][1][:, :n, :]
            layers.append((keys.to(self.device), vals.to(self.device)))
        return reserved_cache(capacity, layers) if reserve else DynamicCache(layers)

    def _row_cache(self, past: Any, input_mask: torch.Tensor, r: int, tokens: list[int]) -> _KV | None:
        """This row's keys/values for ``tokens`` (= context + kept), dropping padding; None if not all computed."""
        if past is None:
            return None
        real = torch.nonzero(input_mask, as_tuple=True)[0]  # positions of the context's real tokens
        start = input_mask.shape[0]
        n_gen = len(tokens) - int(input_mask.sum())
        pos = torch.cat([real, torch.arange(start, start + n_gen)])
        length = past.layers[0].keys.shape[2]
        pos = pos[pos < length]  # the last sampled token was never fed back: its keys do not exist
        return self.handle(
            tokens[: len(pos)],
            [(layer.keys[r, :, pos, :], layer.values[r, :, pos, :]) for layer in past.layers],
        )

    def handle(self, tokens: Sequence[int], layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> _KV:
        """A KV handle for ``tokens`` from one row's per-layer (keys, values), each (heads, len(tokens), head_dim)."""
        return _KV(tuple(tokens), tuple((k.clone().cpu(), v.clone().cpu()) for k, v in layers))

    def join_batch(self, stop: Sequence[str], temperature: float) -> JoinBatch:
        """A running decode batch that turns join and leave between forwards (``sampler.join``, hf_join.py)."""
        return JoinBatch(self, stop, temperature)
