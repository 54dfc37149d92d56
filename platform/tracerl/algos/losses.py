"""Policy losses (docs/method.md, "Tree-aware advantages" and "Loss"): PPO-clip with separate low/high clip ranges.

Per model token t with ratio rho_t = exp(log pi(t) - log pi_old(t)) and advantage A_t:

    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high)) * w_t  +  beta * KL_t

* w_t: truncated importance weight min(exp(log pi_old(t) - log mu(t)), C) for the gap between the
  sampler mu (e.g. vLLM) and the trainer's old policy; 1 when the correction is off.
* KL_t: the k3 estimator exp(r) - r - 1 with r = log pi_ref(t) - log pi(t) (only when beta > 0).

A loss returns the *sum* of its per-token (or per-sequence) terms; the caller divides by the global
count (tokens for ``token_mean``, sequences for ``seq_mean_token_mean``) so that data-parallel shards of
unequal size give exactly the gradient of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tracerl.registry import Registry

LOSSES: Registry[Callable[..., LossOutput]] = Registry("policy loss")


@dataclass(frozen=True)
class LossInputs:
    """Aligned (batch, length) tensors; ``mask`` marks the loss tokens."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    is_weight: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    total: torch.Tensor
    """Sum of loss terms (divide by the global count for the mean)."""
    stats: dict[str, torch.Tensor]
    """Sums over loss tokens: 'clipped' (tokens whose ratio was clipped), 'kl_ref', 'approx_kl'."""


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Sum of per-token losses (token_mean) or of per-sequence token means (seq_mean_token_mean)."""
    m = mask.to(per_token.dtype)
    if mode == "token_mean":
        return (per_token * m).sum()
    if mode == "seq_mean_token_mean":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).sum()
    raise ValueError(f"loss aggregation {mode!r} is not one of token_mean, seq_mean_token_mean")


@LOSSES.register("ppo_clip")
def ppo_clip_loss(
    x: LossInputs,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    aggregation: str = "token_mean",
) -> LossOutput:
    log_ratio = x.logp - x.old_logp
    ratio = torch.exp(log_ratio)
    pg1 = -x.advantages * ratio
    pg2 = -x.advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(pg1, pg2)
    if x.is_weight is not None:
        per_token = per_token * x.is_weight
    m = x.mask.to(per_token.dtype)
    stats = {
        "clipped": ((pg2 > pg1).to(m.dtype) * m).sum().detach(),
        "approx_kl": ((-log_ratio).detach() * m).sum(),
    }
    if x.ref_logp is not None:
        r = x.ref_logp - x.logp
        kl = torch.exp(r) - r - 1.0
        stats["kl_ref"] = (kl.detach() * m).sum()
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    return LossOutput(aggregate(per_token, x.mask, aggregation), stats)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each token given the ones before (position 0 gets 0) and the entropy there, both (B, T).

    Logits are divided by the sampling temperature first, as the sampler did.
    """
    logits = logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    zero = torch.zeros_like(lp[:, :1])
    return torch.cat([zero, lp], dim=1), torch.cat([zero, ent], dim=1)
