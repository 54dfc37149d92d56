"""Per-token log-probs and entropy from a causal LM's final hidden states, a chunk of positions at a time.

The full-logits path (``tracerl.algos.losses.token_logprobs``) keeps float32 logits, their log-softmax and its
``exp`` for every position of a micro-batch: about 20 bytes x vocabulary per token (3 MB a token at Qwen3's
151,936), whatever the loss mask says. Here only the positions whose next token is a loss token are scored, in
chunks of ``chunk`` positions; each chunk's output projection runs under ``torch.utils.checkpoint`` (recomputed in
backward), so the logits of one chunk at a time exist and the peak is bounded by chunk x vocabulary, not by
sequence x vocabulary.

``scored_forward`` puts this computation inside the model's own forward: for the length of the call, the output
layer (``get_output_embeddings()``) returns (batch, length, 2) of [log-prob, entropy] instead of logits. The
wrapped model is called as usual, so DDP's gradient hooks and FSDP's parameter gathering work unchanged (the output
layer's weight is unsharded while the root module's forward runs), and LoRA (peft) needs nothing special.

The entropy is a statistic: it is computed without gradient (no loss here takes its gradient).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the entropy at each row of ``hidden`` (rows, hidden): both (rows,), float32."""
    # The full-logits path's operations, row for row (dividing by 1.0 is exact, so it is skipped). Each chunk-sized
    # tensor is let go as soon as it is used: log-softmax keeps only its output for backward.
    z = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        z = z / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    del z
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        p = logp_all.exp()
        ent = -p.mul_(logp_all).sum(-1)
    return lp, ent


def chunked_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_chunk_scores`` over the rows of ``hidden`` in chunks of ``chunk`` rows, each recomputed in backward when
    gradients are on (then only the chunk's hidden rows and two numbers a row are kept between forward and
    backward)."""
    lps, ents = [], []
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for lo in range(0, hidden.shape[0], chunk):
        h, y = hidden[lo : lo + chunk], targets[lo : lo + chunk]
        if recompute:
            lp, ent = checkpoint(_chunk_scores, h, weight, bias, y, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_scores(h, weight, bias, y, temperature)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(lps), torch.cat(ents)


def output_layer(model: torch.nn.Module) -> torch.nn.Linear:
    """The output projection (``lm_head``) of a plain, DDP-, FSDP- or peft-wrapped HF causal LM."""
    inner = getattr(model, "module", model)  # DDP
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(
            f"{type(inner).__name__} has no linear output layer (get_output_embeddings); set loss.logit_chunk=0 "
            "to score it from full logits"
        )
    return head


def _scoring_forward(
    head: torch.nn.Linear, input_ids: torch.Tensor, loss_mask: torch.Tensor, temperature: float, chunk: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The output layer's forward while scoring: hidden (B, T, H) -> (B, T, 2) [log-prob, entropy], zero at
    position 0 and wherever ``loss_mask`` is False."""
    sel = loss_mask.clone()
    sel[:, 0] = False  # position 0 has no token before it
    rows, cols = sel.nonzero(as_tuple=True)
    targets = input_ids[rows, cols]

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        b, t = hidden.shape[:2]
        h = hidden[rows, cols - 1]
        lp, ent = chunked_scores(h, head.weight, head.bias, targets, temperature, chunk)
        out = hidden.new_zeros((b, t, 2), dtype=torch.float32)
        out = out.index_put((rows, cols), torch.stack([lp, ent], dim=-1))
        if rows.numel() == 0 and torch.is_grad_enabled():
            # No loss token: a zero-weight use of the layer, so every parameter still gets a (zero) gradient and
            # DDP's reducer sees the same parameters on every rank.
            z, _ = _chunk_scores(hidden[:1, 0], head.weight, head.bias, input_ids[:1, 0], temperature)
            out = out + 0.0 * z.sum()
        return out

    return forward


@contextlib.contextmanager
def scoring(
    model: torch.nn.Module, input_ids: torch.Tensor, loss_mask: torch.Tensor, temperature: float, chunk: int
) -> Iterator[None]:
    """While open, ``model(input_ids=input_ids, ...)``'s ``logits`` are (B, T, 2): [log-prob, entropy] of each
    loss token (``loss_mask``) given the ones before, zero elsewhere."""
    head = output_layer(model)
    head.forward = _scoring_forward(head, input_ids, loss_mask, temperature, chunk)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del head.forward  # back to nn.Linear.forward


def scored_forward(
    model: torch.nn.Module,
    call: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy (B, T) of the loss tokens of a right-padded batch: ``call(model, input_ids=...,
    attention_mask=...)`` runs the model (the caller's autocast, if any, applies)."""
    with scoring(model, input_ids, loss_mask, temperature, chunk):
        out = call(model, input_ids=input_ids, attention_mask=attention_mask)
    scores = out.logits
    return scores[..., 0], scores[..., 1]
