"""Per-token join for the hf sampler (``sampler.join``): one decode batch that turns enter and leave between forwards.

``HFSampler.generate`` runs a fixed batch of turns to the end of its longest one. A ``JoinBatch`` keeps one batch
running instead: ``add`` queues a turn (context, token cap, seed, KV handle); each ``step`` prefills the queued
turns (only their uncached suffixes, against their handles' caches, exactly as ``generate`` assembles them), appends
them to the running batch, runs one decode forward for every row and returns the turns that ended (a stop string,
EOS, their cap) with their KV handles. A path whose turn ended can so start its next turn (after its tool call)
while the other rows keep decoding, instead of waiting for the round's longest turn.

Rows are left-padded to the batch's width; a joining row whose context is longer widens the batch (zero keys and
values on the left, hidden by the mask), rows that leave are dropped and all-padding columns trimmed. Positions
count each row's real tokens, as in ``generate``. Sampling is ``generate``'s: the Gumbel-max draw with row r's noise
from a generator seeded by its own seed, one draw per token, and the log-prob of the temperature-scaled
distribution; so a turn gets the tokens it gets from ``generate`` (tests/test_hf_join.py), up to the float effects
of its batch-mates' padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.samplers.base import Generation, cut_at_stop


def _cache_name() -> str:
    """The keyword of a model's KV cache in forward/generate and its outputs: ``cache`` from transformers 5.24
    (which warns on the old name), ``past_key_values`` before it."""
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


CACHE = _cache_name()


@dataclass
class _Row:
    key: int
    context: list[int]
    cap: int
    gen: torch.Generator
    prefill: int
    reused: int
    new: list[int]
    logprobs: list[float]


class JoinBatch:
    """A running decode batch of an ``HFSampler`` (module docstring); ``len`` counts rows running or queued."""

    def __init__(self, sampler: Any, stop: Sequence[str], temperature: float) -> None:
        self.s = sampler
        self.stop, self.temperature = list(stop), temperature
        self.tail = max((len(x) for x in stop), default=0) + 2
        """Tokens decoded to look for a stop string the newest token completed (every token spells a character
        or more; an earlier stop string would have ended the turn before)."""
        self.queued: list[tuple[_Row, Any]] = []
        self.rows: list[_Row] = []
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        """(rows, width): 1 where the cache holds a real token."""
        self.cache: Any = None
        """The rows' ``DynamicCache``: per layer keys and values, each (rows, heads, width, head_dim)."""

    def __len__(self) -> int:
        return len(self.rows) + len(self.queued)

    def add(self, key: int, context: list[int], max_new_tokens: int, seed: int, cache: object | None) -> None:
        """Queue one turn of ``context``; it joins the batch at the next ``step``."""
        usable = self.s._usable(context, cache)
        n = usable[1] if usable else 0
        gen = torch.Generator(device=self.s.device).manual_seed(int(seed))
        row = _Row(key, list(context), max_new_tokens, gen, len(context) - n, n, [], [])
        self.queued.append((row, usable))

    @torch.no_grad()
    def step(self) -> tuple[list[tuple[int, Generation]], int]:
        """One forward of every running row's last sampled token and every queued turn's uncached suffix (one
        input block, each row right-aligned in it). Returns the turns that ended ``(key, generation)`` and the
        tokens sampled."""
        if not self.queued:  # the rows as they are: one token each, the cache grows in place
            if not self.rows:
                return [], 0
            dev = self.s.device
            last = torch.tensor([[r.new[-1]] for r in self.rows], dtype=torch.long, device=dev)
            pos = self.mask.sum(-1, keepdim=True)  # each row's real tokens so far: the new token's position
            self.mask = torch.cat([self.mask, torch.ones_like(last)], dim=1)
            out = self.s.model(
                input_ids=last,
                attention_mask=self.mask,
                position_ids=pos,
                use_cache=True,
                **{CACHE: self.cache},
            )
            n = len(self.rows)
            return self._sample(out.logits[:, -1]), n
        queued, self.queued = self.queued, []
        rows = self.rows + [r for r, _ in queued]
        feed = [[r.new[-1]] for r in self.rows] + [r.context[r.reused :] for r, _ in queued]
        q = max(len(x) for x in feed)
        width = max([self.mask.shape[1]] + [r.reused for r, _ in queued])
        dev = self.s.device
        mask = torch.zeros((len(rows), width + q), dtype=torch.long, device=dev)
        mask[: len(self.rows), width - self.mask.shape[1] : width] = self.mask
        for i, (r, _) in enumerate(queued, start=len(self.rows)):
            mask[i, width - r.reused : width] = 1
        ids = torch.full((len(rows), q), self.s.tokenizer.pad_token_id, dtype=torch.long)
        pos = torch.zeros_like(ids)
        seen = mask.sum(-1).tolist()  # real tokens before the new ones: their first position
        for i, x in enumerate(feed):
            ids[i, q - len(x) :] = torch.tensor(x, dtype=torch.long)
            pos[i, q - len(x) :] = torch.arange(seen[i], seen[i] + len(x))
            mask[i, width + q - len(x) :] = 1
        from transformers import DynamicCache

        layers = self._cache(width, [u for _, u in queued])
        self.cache = DynamicCache(layers) if layers else DynamicCache()
        out = self.s.model(
            input_ids=ids.to(dev),
            attention_mask=mask,
            position_ids=pos.to(dev),
            use_cache=True,
            logits_to_keep=1,
            **{CACHE: self.cache},
        )
        self.rows, self.mask = rows, mask
        return self._sample(out.logits[:, -1]), len(rows)  # (rows: the list before any leave)

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) of the rows' cache, each (rows, heads, width, head_dim)."""
        return [(layer.keys, layer.values) for layer in self.cache.layers] if self.cache is not None else []

    def _cache(self, width: int, usable: list[Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the running rows' cache, then the queued rows' cached prefixes, left-padded to ``width``
        (none when nothing is cached)."""
        ref = self.layers[0][0] if self.layers else next((u[0].layers[0][0] for u in usable if u), None)
        if ref is None or width == 0:
            return []
        h, d = ref.shape[-3], ref.shape[-1]
        out = []
        for li in range(len(self.layers) or len(next(u for u in usable if u)[0].layers)):
            kv = []
            for j in (0, 1):
                t = torch.zeros(
                    (len(self.rows) + len(usable), h, width, d), dtype=ref.dtype, device=self.s.device
                )
                if self.rows:
                    old = self.layers[li][j]
                    t[: len(self.rows), :, width - old.shape[2] :] = old
                for i, u in enumerate(usable, start=len(self.rows)):
                    if u:
                        handle, n = u
                        t[i, :, width - n :] = handle.layers[li][j][:, :n].to(self.s.device)
                kv.append(t)
            out.append((kv[0], kv[1]))
        return out

    def _sample(self, logits: torch.Tensor) -> list[tuple[int, Generation]]:
        """Draw each row's next token (``HFSampler``'s Gumbel-max rule), then drop and return the rows that ended."""
        t = self.temperature
        scores = logits.float() / (t if t > 0 else 1.0)
        logp = torch.log_softmax(scores, dim=-1)
        if t > 0:
            u = torch.stack(
                [torch.rand(scores.shape[-1], generator=r.gen, device=r.gen.device) for r in self.rows]
            )
            gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
            tokens = (scores + gumbel.to(scores.device)).argmax(-1)
        else:
            tokens = scores.argmax(-1)
        picked = logp.gather(1, tokens[:, None])[:, 0].tolist()
        tok = self.s.tokenizer
        done = []
        for i, (r, token, lp) in enumerate(zip(self.rows, tokens.tolist(), picked)):
            r.new.append(int(token))
            r.logprobs.append(float(lp))
            ended = token in self.s.ends or token == tok.pad_token_id or len(r.new) >= r.cap
            if ended or (self.stop and any(s in tok.decode(r.new[-self.tail :]) for s in self.stop)):
                done.append(i)
        return self._leave(done)

    def _leave(self, done: list[int]) -> list[tuple[int, Generation]]:
        """The ended rows' generations (with their KV handles); the batch keeps the others."""
        if not done:
            return []
        out = [(self.rows[i].key, self._generation(i)) for i in done]
        keep = [i for i in range(len(self.rows)) if i not in set(done)]
        self.rows = [self.rows[i] for i in keep]
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, index)
        real = self.mask.any(0).nonzero()  # leading columns that are padding in every row left are dropped
        first = int(real[0]) if len(real) else self.mask.shape[1]
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        return out

    def _generation(self, i: int) -> Generation:
        r = self.rows[i]
        kept, text, finish = cut_at_stop(self.s.tokenizer, r.new, self.stop, self.s.ends)
        handle = None
        if self.s.reuse_prefix:
            tokens = r.context + kept
            # context + fed tokens (the last sampled one was never fed back)
            pos = self.mask[i].nonzero()[:, 0][: len(tokens)]
            handle = self.s.handle(
                tokens[: len(pos)], [(k[i, :, pos, :], v[i, :, pos, :]) for k, v in self.layers]
            )
        return Generation(kept, r.logprobs[: len(kept)], text, finish, r.prefill, r.reused, handle)
