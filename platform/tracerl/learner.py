"""The policy update on one data-parallel rank: PPO-clip on a shard of the step's batch.

Every rank receives its shard of sequences plus the batch-wide loss denominator (loss tokens for
``token_mean``, sequences for ``seq_mean_token_mean``). A rank's loss is its sum of loss terms divided
by that global denominator and multiplied by the world size, because DDP averages gradients over
ranks: the update then equals one worker's update on the whole batch, however unequal the shards'
token counts (tests/test_learner.py checks it with two gloo processes). Each rank runs exactly one
gradient-synchronising backward per optimizer step (the last micro-batch; a rank with no sequences
runs a zero-weight one), so unequal micro-batch counts cannot deadlock.

No Ray here: the Ray Train worker function builds a learner around the DDP-wrapped model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from tracerl import metrics as M
from tracerl.algos.batch import PaddedBatch, TrainBatch, micro_batch_groups
from tracerl.algos.config import LossConfig, OptimConfig
from tracerl.algos.losses import LOSSES, LossInputs, token_logprobs
from tracerl.models.logprob_head import scored_forward


def lr_lambda(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step ``s`` (0-based)."""

    def f(s: int) -> float:
        if cfg.warmup_steps and s < cfg.warmup_steps:
            return (s + 1) / (cfg.warmup_steps + 1)
        if cfg.schedule == "constant":
            return 1.0
        span = max(total_steps - cfg.warmup_steps, 1)
        frac = min(max(s - cfg.warmup_steps, 0) / span, 1.0)
        decay = 0.5 * (1 + math.cos(math.pi * frac)) if cfg.schedule == "cosine" else 1 - frac
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay

    return f


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_reduce(values: dict[str, float], device: torch.device) -> dict[str, float]:
    _, world = _dist()
    if world == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return dict(zip(keys, t.tolist()))


_SUMS = ("loss", "clipped", "approx_kl", "kl_ref", "entropy", "tokens", "is_weight", "is_truncated", "signal")
"""What every micro-batch adds to, summed over ranks once per epoch."""


class PolicyLearner:
    """Optimizer, schedule and the PPO step for ``model`` (a plain or DDP/FSDP-wrapped causal LM)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optim: OptimConfig,
        loss: LossConfig,
        total_steps: int,
        pad_id: int,
        temperature: float = 1.0,
        importance_sampling: bool = False,
        ref_model: torch.nn.Module | None = None,
        autocast: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.autocast = (
            autocast  # compute dtype of an unsharded model whose (master) weights are more precise
        )
        self.cfg, self.loss_cfg = optim, loss
        self.pad_id = pad_id
        self.temperature = temperature if temperature > 0 else 1.0
        self.importance_sampling = importance_sampling
        self.ref_model = ref_model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=optim.lr,
            betas=(optim.betas[0], optim.betas[1]),
            weight_decay=optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(optim, total_steps * loss.epochs)
        )
        self.loss_fn = LOSSES.get(loss.name)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def _micro_batches(self, shard: TrainBatch) -> list[PaddedBatch]:
        """``loss.micro_batch_size`` sequences each, or packed to ``loss.micro_tokens`` padded tokens."""
        lengths = [len(x) for x in shard.input_ids]
        groups = micro_batch_groups(lengths, self.loss_cfg.micro_batch_size, self.loss_cfg.micro_tokens)
        return [shard.select(g).pad(self.pad_id).to(self.device) for g in groups]

    def _forward(self, model: torch.nn.Module, **inputs: torch.Tensor) -> Any:
        if self.autocast is None:
            return model(**inputs)
        with torch.autocast(self.device.type, dtype=self.autocast):
            return model(**inputs)

    def _logprobs(self, model: torch.nn.Module, mb: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob and entropy (B, T) of each token; off the loss mask they are 0 on the chunked path."""
        chunk = self.loss_cfg.logit_chunk
        if chunk > 0:
            ids, att, mask, t = mb.input_ids, mb.attention_mask, mb.loss_mask, self.temperature
            return scored_forward(model, self._forward, ids, att, mask, t, chunk)
        out = self._forward(model, input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        return token_logprobs(out.logits, mb.input_ids, self.temperature)

    @torch.no_grad()
    def _frozen_logprobs(
        self, model: torch.nn.Module, mbs: list[PaddedBatch], rounds: int
    ) -> list[torch.Tensor]:
        out = [self._logprobs(model, mb)[0] for mb in mbs]
        for _ in range(
            rounds - len(mbs)
        ):  # sharded models gather parameters in every forward: same count on all ranks
            self._forward(model, input_ids=self._dummy_ids())
        return out

    def _dummy_ids(self) -> torch.Tensor:
        return torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)

    def update(self, shard: TrainBatch, denominator: float) -> dict[str, float]:
        """``loss.epochs`` optimizer steps on this rank's ``shard``; ``denominator`` is batch-wide.

        Returns batch-wide statistics (summed over ranks): loss, clip fraction, KL, entropy, grad norm, lr.
        """
        _, world = _dist()
        lc = self.loss_cfg
        self.model.train()
        mbs = self._micro_batches(shard)
        # Every rank runs the same number of forward/backward rounds (the most any rank has); extra rounds are
        # zero-weight, so collectives inside forward (FSDP) and the one gradient all-reduce (DDP) always match.
        rounds = int(_all_reduce_max(len(mbs), self.device)) if world > 1 else len(mbs)
        rounds = max(rounds, 1)
        # Old log-probs: the policy before this step's updates. At one epoch that is the current policy, whose
        # log-probs the update's own forward gives (detached): no separate forward, with or without the
        # importance-sampling weight.
        old = self._frozen_logprobs(self.model, mbs, rounds) if lc.epochs > 1 else None
        ref = self._frozen_logprobs(self.ref_model, mbs, rounds) if self.ref_model is not None else None
        stats: dict[str, float] = {}
        for _epoch in range(lc.epochs):
            sums = dict.fromkeys(_SUMS, 0.0)
            self.optimizer.zero_grad(set_to_none=True)
            for i in range(rounds):
                sync = i == rounds - 1
                no_sync = getattr(self.model, "no_sync", None)
                ctx = contextlib.nullcontext() if sync or no_sync is None else no_sync()
                with ctx:
                    if i >= len(mbs):
                        (self._forward(self.model, input_ids=self._dummy_ids()).logits.sum() * 0.0).backward()
                        continue
                    self._micro_step(
                        mbs[i],
                        old[i] if old is not None else None,
                        ref[i] if ref else None,
                        world / denominator,
                        sums,
                    )
            params = [p for p in self.model.parameters() if p.requires_grad]
            max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            lr = float(self.scheduler.get_last_lr()[0])
            tot = _all_reduce(sums, self.device)
            # A batch without a non-zero advantage has no signal: Adam would still move the weights along its
            # momentum, so the optimizer step is skipped (the schedule still advances).
            skipped = tot["signal"] == 0
            if not skipped:
                self.optimizer.step()
            self.scheduler.step()
            stats = self._epoch_stats(tot, grad_norm, lr, skipped, denominator)
        return stats

    def _micro_step(
        self,
        mb: PaddedBatch,
        old_lp: torch.Tensor | None,
        ref_lp: torch.Tensor | None,
        scale: float,
        sums: dict[str, float],
    ) -> None:
        """Forward and backward of one micro-batch (its loss times ``scale`` = world / denominator), its sums
        added to ``sums``. ``old_lp``: the frozen old log-probs (None: the current ones, detached)."""
        lc = self.loss_cfg
        logp, ent = self._logprobs(self.model, mb)
        mask = mb.loss_mask
        old_lp = old_lp if old_lp is not None else logp.detach()
        w = None
        if self.importance_sampling:
            raw = torch.exp(old_lp - mb.sampler_logprobs)
            w = torch.clamp(raw, max=lc.is_cap)
            m = mask.float()
            sums["is_weight"] += float((raw * m).sum())
            sums["is_truncated"] += float(((raw > lc.is_cap).float() * m).sum())
        res = self.loss_fn(
            LossInputs(logp, old_lp, mb.advantages, mask, w, ref_lp),
            eps_low=lc.eps_low,
            eps_high=lc.eps_high,
            kl_coef=lc.kl_coef,
            aggregation=lc.aggregation,
        )
        (res.total * scale).backward()
        sums["loss"] += float(res.total.detach())
        for k, v in res.stats.items():
            sums[k] += float(v)
        sums["entropy"] += float((ent.detach() * mask.float()).sum())
        sums["tokens"] += float(mask.sum())
        sums["signal"] += float(((mb.advantages != 0) & mask).sum())

    def _epoch_stats(
        self, tot: dict[str, float], grad_norm: float, lr: float, skipped: bool, denominator: float
    ) -> dict[str, float]:
        """The batch-wide statistics of one epoch from the summed micro-batch sums."""
        tokens = max(tot["tokens"], 1.0)
        stats = {
            M.LOSS: tot["loss"] / denominator,
            M.CLIP_FRACTION: tot["clipped"] / tokens,
            M.APPROX_KL: tot["approx_kl"] / tokens,
            M.ENTROPY: tot["entropy"] / tokens,
            M.GRAD_NORM: grad_norm,
            M.LR: lr,
            M.LOSS_TOKENS: tot["tokens"],
            M.SIGNAL_TOKENS: tot["signal"],
            M.UPDATE_SKIPPED: float(skipped),
        }
        if self.ref_model is not None:
            stats[M.KL_REF] = tot["kl_ref"] / tokens
        if self.importance_sampling:
            stats[M.IS_WEIGHT_MEAN] = tot["is_weight"] / tokens
            stats[M.IS_TRUNCATED_FRACTION] = tot["is_truncated"] / tokens
        return stats


def _all_reduce_max(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


def denominator(batch: TrainBatch, aggregation: str) -> float:
    """The batch-wide count a loss sum is divided by."""
    if aggregation == "token_mean":
        return float(max(batch.num_tokens, 1))
    return float(max(len(batch), 1))
