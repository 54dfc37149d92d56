"""Config schemas of the algorithm's parts: allocation, the per-step budget, the predictor, the loss, the optimiser.

Values live in YAML under conf/ (allocator/, predictor/, budget/); ``tracerl.config`` composes them into the
command configs. Closed choices are ``Literal`` fields (``tracerl.schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from tracerl.schema import check, check_choices


@dataclass(frozen=True)
class AllocatorConfig:
    """How the rollout budget is placed on prompts and prefixes (docs/method.md, "Stage 1", "Stage 2", "Baselines")."""

    name: str = "trace"
    """Registered allocator (grpo, pcl, knapsack, treepo, trace, trace_debiased, trace_plus, trace_root_only, trace_prefix_only, oracle_trace, trace_mc, dapo) or 'module:attr'."""
    m_min: int = 2
    """Smallest non-zero number of bare rollouts per selected prompt (a single rollout has no contrast)."""
    m_max: int = 16
    """Largest number of bare rollouts per prompt."""
    k_max: int = 0
    """Cap on continuations per prefix; 0 means no cap."""
    root_group_size: int = 4
    """Bare rollouts per prompt for uniform-root tree allocators (treepo, trace_prefix_only) and cold start."""
    max_gen_batches: int = 4
    """dapo: most generation batches (of budget.num_groups prompts) drawn to fill the kept groups."""
    knapsack_info: Literal["paper", "variance"] = "paper"
    """knapsack: the information term I(p) of a prompt's value: 'paper', Knapsack RL's InfoGain p (1 - p)^2, or
    'variance', the reward variance p (1 - p) (algos/knapsack.py)."""
    mc_samples: int = 8
    """trace_mc: K, extra rollouts of the current policy per candidate prompt (Stage 1) and per bare prefix
    (Stage 2) whose success rate is the score; not trained on, not charged to the budget (``mc/`` metrics)."""
    mc_prior: float = 1.0
    """trace_mc: pseudo-successes and pseudo-failures added to each estimate, (s + a) / (K + 2a); 1 is Laplace's
    rule, 0 the raw success rate."""

    def __post_init__(self) -> None:
        check_choices(self, "allocator")
        check(self.m_min >= 1, f"allocator.m_min must be >= 1 (got {self.m_min})")
        check(
            self.m_max >= self.m_min,
            f"allocator.m_max must be >= allocator.m_min (got {self.m_max} < {self.m_min})",
        )
        check(self.k_max >= 0, f"allocator.k_max must be >= 0, 0 for no cap (got {self.k_max})")
        check(
            self.root_group_size >= 1, f"allocator.root_group_size must be >= 1 (got {self.root_group_size})"
        )
        check(
            self.max_gen_batches >= 1, f"allocator.max_gen_batches must be >= 1 (got {self.max_gen_batches})"
        )
        check(self.mc_samples >= 1, f"allocator.mc_samples must be >= 1 (got {self.mc_samples})")
        check(self.mc_prior >= 0, f"allocator.mc_prior must be >= 0 (got {self.mc_prior})")


@dataclass(frozen=True)
class BudgetConfig:
    """The per-step rollout budget. Leaves L = M (1 + N) for tree allocators; G L/G-groups for flat ones."""

    num_leaves: int | None = 288
    """L: leaves (finished rollouts) per step, equal for every allocator but dapo. Null to derive from num_roots."""
    num_roots: int | None = None
    """M: bare rollouts per step for tree allocators. Null to derive M = L / (1 + N)."""
    continuations: int = 2
    """N: continuation multiplier; a prompt with m bare rollouts gets m N continuations."""
    group_size: int = 8
    """G: rollouts per prompt for the flat allocators (grpo, pcl, dapo)."""
    pool_factor: int = 4
    """The candidate pool holds pool_factor * L / G prompts, shared by every allocator that selects."""
    token_budget: int | None = None
    """Token mode (training): T, generated tokens per step. Unspent tokens carry over: step t (0-based) may
    spend (t + 1) T less what steps 0..t-1 spent, and its L is the largest multiple of lcm(1 + N, G) whose
    expected cost, at the run's mean generated tokens per leaf so far, fits that (at least m_min bare rollouts);
    num_leaves sets the first step's L. Null: leaf mode, L fixed."""

    def __post_init__(self) -> None:
        n = self.continuations
        check(
            self.token_budget is None or self.token_budget >= 1,
            f"budget.token_budget must be >= 1 or null (got {self.token_budget})",
        )
        check(n >= 0, f"budget.continuations must be >= 0 (got {n})")
        check(self.group_size >= 2, f"budget.group_size must be >= 2 (got {self.group_size})")
        check(self.pool_factor >= 1, f"budget.pool_factor must be >= 1 (got {self.pool_factor})")
        check(
            self.num_leaves is not None or self.num_roots is not None,
            "set budget.num_leaves or budget.num_roots",
        )
        if self.num_roots is not None:
            check(self.num_roots >= 1, f"budget.num_roots must be >= 1 (got {self.num_roots})")
            check(
                self.num_leaves is None or self.num_leaves == self.num_roots * (1 + n),
                f"budget.num_leaves={self.num_leaves} disagrees with budget.num_roots={self.num_roots} x "
                f"(1 + continuations={n}); set only one of them (the other to null)",
            )
        else:
            assert self.num_leaves is not None
            check(
                self.num_leaves >= 1 and self.num_leaves % (1 + n) == 0,
                f"budget.num_leaves={self.num_leaves} must be a positive multiple of 1 + continuations = {1 + n}",
            )
        check(
            self.leaves % self.group_size == 0,
            f"budget leaves L={self.leaves} must be a multiple of budget.group_size={self.group_size}",
        )

    @property
    def leaves(self) -> int:
        """L, leaves per step."""
        return self.num_leaves if self.num_leaves is not None else self.roots * (1 + self.continuations)

    @property
    def roots(self) -> int:
        """M, bare rollouts per step for tree allocators."""
        if self.num_roots is not None:
            return self.num_roots
        assert self.num_leaves is not None
        return self.num_leaves // (1 + self.continuations)

    @property
    def num_groups(self) -> int:
        """L / G, prompts per step for flat allocators."""
        return self.leaves // self.group_size

    @property
    def num_candidates(self) -> int:
        """B, the shared candidate pool size."""
        return self.pool_factor * self.num_groups

    def for_tokens(
        self, tokens_per_leaf: float, max_candidates: int | None = None, min_roots: int = 1
    ) -> BudgetConfig:
        """Token mode: this budget with L set so that L x ``tokens_per_leaf`` fits ``token_budget`` (and the
        candidate pool, pool_factor L / G prompts, fits ``max_candidates`` where given). L is a multiple of
        lcm(1 + N, G) and never below what one step can place: at least ``min_roots`` bare rollouts (the tree
        allocators' m_min; a prompt gets 0 or at least m_min) and one flat group."""
        import math

        if self.token_budget is None or tokens_per_leaf <= 0:
            return self
        unit = math.lcm(1 + self.continuations, self.group_size)
        units = int(self.token_budget // (tokens_per_leaf * unit))
        if max_candidates is not None:
            units = min(units, max_candidates * self.group_size // (self.pool_factor * unit))
        least = max(1, math.ceil(min_roots * (1 + self.continuations) / unit))
        return replace(self, num_leaves=max(least, units) * unit, num_roots=None)


@dataclass(frozen=True)
class PredictorConfig:
    """The shared success-probability predictor V~ (docs/method.md, "The shared predictor")."""

    name: str = "learned"
    """Registered predictor (constant, tabular, learned, oracle) or 'module:attr'."""
    warmup_steps: int = 2
    """Cold start: allocation is uniform until the predictor has been fit on this many steps."""
    constant_value: float = 0.5
    """constant: the probability it always returns."""
    prior_alpha: float = 1.0
    """tabular: Beta prior successes."""
    prior_beta: float = 1.0
    """tabular: Beta prior failures."""
    discount: float = 0.95
    """tabular: per-step forgetting of old counts (the policy drifts); 1 keeps everything."""
    hidden_size: int = 32
    """learned: width of the MLP head."""
    embedding_buckets: int = 16384
    """learned: hashed prompt-identity embedding rows; 0 turns the identity input off."""
    lr: float = 0.01
    """learned: Adam learning rate."""
    embedding_lr: float = 0.2
    """learned: learning rate of the prompt-identity embedding (it sees few updates per row)."""
    fit_steps: int = 15
    """learned: optimiser steps per RL step."""
    batch_size: int = 512
    """learned: anchors per optimiser step."""
    replay_steps: int = 8
    """learned: the replay window, in RL steps."""
    weight_by_leaves: bool = True
    """learned: weight each anchor's squared error by its leaf count n_y (debiased targets: its number of children)."""
    targets: Literal["recursive", "debiased"] = "recursive"
    """learned: fit targets, 'recursive' (V^, the mean of the leaves below) or 'debiased' (allocator trace_debiased forces it)."""
    seed: int = 0
    """learned: initialisation and minibatch seed (offset by the run seed)."""
    features: Literal["numeric", "hashed", "policy"] = "numeric"
    """learned: what it reads of an anchor: 'numeric' (simulator features), 'hashed' (word n-grams of the
    question and history) or 'policy' (the policy's last hidden state, stop-gradient)."""

    def __post_init__(self) -> None:
        check_choices(self, "predictor")
        check(self.warmup_steps >= 0, f"predictor.warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(
            0.0 <= self.constant_value <= 1.0,
            f"predictor.constant_value must be in [0, 1] (got {self.constant_value})",
        )
        check(
            self.prior_alpha > 0 and self.prior_beta > 0, "predictor.prior_alpha and prior_beta must be > 0"
        )
        check(0.0 < self.discount <= 1.0, f"predictor.discount must be in (0, 1] (got {self.discount})")
        check(self.hidden_size >= 1, f"predictor.hidden_size must be >= 1 (got {self.hidden_size})")
        check(
            self.embedding_buckets >= 0,
            f"predictor.embedding_buckets must be >= 0 (got {self.embedding_buckets})",
        )
        check(self.lr > 0 and self.embedding_lr > 0, "predictor.lr and predictor.embedding_lr must be > 0")
        check(self.fit_steps >= 1, f"predictor.fit_steps must be >= 1 (got {self.fit_steps})")
        check(self.batch_size >= 1, f"predictor.batch_size must be >= 1 (got {self.batch_size})")
        check(self.replay_steps >= 1, f"predictor.replay_steps must be >= 1 (got {self.replay_steps})")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warm-up and a schedule."""

    lr: float = 5e-5
    """Peak learning rate (the tiny policy's; about 1e-6 for an 8B model)."""
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 2
    """Optimizer steps of linear warm-up from 0."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After warm-up: 'constant', 'cosine' or 'linear' decay to min_lr_ratio * lr at the last step."""
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0: no clipping; the norm is logged either way)."""

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        check(self.lr > 0, f"optim.lr must be > 0 (got {self.lr})")
        check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optim.betas must be two numbers in [0, 1)",
        )
        check(
            self.warmup_steps >= 0 and self.grad_clip >= 0 and self.weight_decay >= 0,
            "optim.warmup_steps, grad_clip and weight_decay must be >= 0",
        )
        check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]")


@dataclass(frozen=True)
class LossConfig:
    """The policy loss (docs/method.md, "Tree-aware advantages" and "Loss") and how trees become a batch."""

    name: str = "ppo_clip"
    """Registered loss (tracerl.algos.losses.LOSSES) or 'module:attr'."""
    advantage: str = "tree_subgroup"
    """Registered advantage estimator: grpo, tree_subgroup, node_mc, tree_grpo."""
    normalize_std: bool = False
    """Divide advantages by the group's reward std (GRPO-style); off = mean-centred (Dr. GRPO)."""
    debiased_values: bool | Literal["auto"] = "auto"
    """true: the estimator's node values (baselines) are the debiased targets D instead of leaf means V^ (tree.py);
    'auto': true for tree allocators with a built-in estimator, false otherwise (flat allocators: unchanged), the
    choice docs/results/baseline_bias.md measured (``tracerl.algos.batch.debiased_setting``)."""
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """'token_mean' over every loss token of the batch, or 'seq_mean_token_mean'."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference (initial) policy; 0 = no reference model is kept."""
    importance_sampling: Literal["auto", "on", "off"] = "auto"
    """Truncated importance-sampling correction for sampler/trainer log-prob gaps: 'on', 'off', or 'auto' (on with vllm)."""
    is_cap: float = 2.0
    """Truncation C of the importance weight."""
    epochs: int = 1
    """Optimizer steps per RL step, each over the whole batch (1 = on-policy)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward on one worker (gradients accumulate); used when ``micro_tokens`` is 0."""
    micro_tokens: int = 0
    """> 0: micro-batches are formed by this token budget instead: sequences sorted by length, packed while
    sequences x the longest <= micro_tokens (a longer sequence is a micro-batch of its own), and the step's batch
    is shared over the ranks balanced by length. 0: ``micro_batch_size`` sequences a micro-batch, contiguous shards."""
    logit_chunk: int = 1024
    """Positions whose log-probs one output-projection chunk scores (tracerl.models.logprob_head): only loss
    positions are scored, each chunk recomputed in backward, so the logits' memory is logit_chunk x vocabulary.
    0: full-vocabulary logits for every position of the micro-batch (the unchunked path, for comparison)."""

    def __post_init__(self) -> None:
        check_choices(self, "loss")
        check(self.eps_low > 0 and self.eps_high > 0, "loss.eps_low and loss.eps_high must be > 0")
        check(self.kl_coef >= 0 and self.is_cap >= 1, "loss.kl_coef must be >= 0 and loss.is_cap >= 1")
        check(
            self.epochs >= 1 and self.micro_batch_size >= 1,
            "loss.epochs and loss.micro_batch_size must be >= 1",
        )
        check(
            self.micro_tokens >= 0 and self.logit_chunk >= 0,
            f"loss.micro_tokens and loss.logit_chunk must be >= 0 (got {self.micro_tokens}, {self.logit_chunk})",
        )
