"""The transformers sampler: batched ``generate`` that stops at turn boundaries.

Contexts are left-padded into one batch; generation stops per sequence at EOS or at any stop string
(``stop_strings``); the new tokens are cut before the stop string and returned with their sampling
log-probabilities (temperature-scaled log-softmax of the logits, as the trainer will recompute them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tracerl.samplers.base import SAMPLERS, Generation


@SAMPLERS.register("hf")
class HFSampler:
    def __init__(self, model, tokenizer, device: str = "cpu") -> None:  # type: ignore[no-untyped-def]
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device

    def _cut(self, new: list[int], stop: Sequence[str]) -> tuple[list[int], str, str]:
        """Drop the pad/EOS tail; cut before the first stop string. Returns (tokens, text, finish)."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        finish = "length"
        for i, t in enumerate(new):
            if t in (eos, pad):
                new, finish = new[: i + (t == eos)], "eos" if t == eos else "length"
                break
        body = new[:-1] if finish == "eos" else new  # EOS is kept as a model token but not as text
        text = self.tokenizer.decode(body)
        hits = [text.find(s) for s in stop if s in text]
        if not hits:
            return new, text, finish
        new = body
        pos = min(hits)
        keep = 0  # largest token prefix whose text ends at or before the stop string
        for k in range(len(new) + 1):
            if len(self.tokenizer.decode(new[:k])) <= pos:
                keep = k
            else:
                break
        return new[:keep], self.tokenizer.decode(new[:keep]), "stop"

    @torch.no_grad()
    def generate(
        self, contexts: Sequence[list[int]], max_new_tokens: int, stop: Sequence[str], temperature: float = 1.0, seed: int = 0
    ) -> list[Generation]:
        if not contexts:
            return []
        width = max(len(c) for c in contexts)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, c in enumerate(contexts):
            ids[r, width - len(c):] = torch.tensor(c)
            mask[r, width - len(c):] = 1
        torch.manual_seed(seed)
        sample = temperature > 0
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=max_new_tokens,
            do_sample=sample, temperature=temperature if sample else None, top_p=None, top_k=None,
            stop_strings=list(stop) or None, tokenizer=self.tokenizer, pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id, return_dict_in_generate=True, output_logits=True,
        )
        seqs = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu()  # (B, T, V), raw
        logp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
        gens = []
        for r in range(len(contexts)):
            new = seqs[r].tolist()
            kept, text, finish = self._cut(new, stop)
            lp = logp[r, torch.arange(len(kept)), torch.tensor(kept, dtype=torch.long)].tolist() if kept else []
            gens.append(Generation(kept, lp, text, finish, prefill_tokens=len(contexts[r])))
        return gens
