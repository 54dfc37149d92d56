"""Collation: rollout trees to a token batch for the policy update (docs/method.md, "Tree-aware advantages" and "Loss").

Every leaf is one training sequence: the prompt's tokens, then each turn on its root-to-leaf path
(model tokens, then tool/observation tokens). Shared prefixes appear once per leaf below them, each
time with that leaf's advantage. Only model-generated tokens carry loss; the prompt and tool /
observation tokens are masked. A turn's advantage (from the estimator's ``per_turn``) is broadcast to
that turn's model tokens; the sampler's log-probs are kept alongside for the importance-sampling
correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from tracerl.algos.advantages import (
    ADVANTAGES,
    grpo_advantages,
    node_mc_advantages,
    tree_grpo_advantages,
    tree_subgroup_advantages,
)
from tracerl.tree import RolloutTree

if TYPE_CHECKING:  # torch is imported where tensors are built: collating trees needs none
    import torch

    from tracerl.algos.allocators import Allocator

# The estimators whose node values come from the tree (V^ or D): 'auto' may switch them to D.
_TREE_VALUED = (grpo_advantages, tree_subgroup_advantages, node_mc_advantages, tree_grpo_advantages)


def debiased_setting(setting: bool | str, allocator: Allocator, estimator: str) -> bool:
    """The run's ``loss.debiased_values``: true or false as given; 'auto': true for an allocator that ``branches``
    (its continuations sit where it chose after seeing rewards, so the root's leaf mean is selection-biased;
    docs/results/baseline_bias.md) with a built-in estimator, false otherwise: flat allocators and estimators
    registered by users keep the leaf means, exactly as with false."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"loss.debiased_values must be one of true, false, 'auto' (got {setting!r})")
    return allocator.branches and ADVANTAGES.get(estimator) in _TREE_VALUED


@dataclass
class TrainBatch:
    """Sequences of one policy update, unpadded (``pad`` makes tensors)."""

    input_ids: list[list[int]] = field(default_factory=list)
    loss_mask: list[list[bool]] = field(default_factory=list)
    """True on model-generated tokens (the tokens the loss is taken on)."""
    advantages: list[list[float]] = field(default_factory=list)
    """Per token; 0 where the mask is False."""
    sampler_logprobs: list[list[float]] = field(default_factory=list)
    """Per token, the sampler's log-prob; 0 where the mask is False."""
    prompt_ids: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_tokens(self) -> int:
        """Loss tokens (model-generated) in the batch."""
        return sum(sum(m) for m in self.loss_mask)

    def select(self, idx: Sequence[int]) -> TrainBatch:
        return TrainBatch(
            *(
                [getattr(self, f)[i] for i in idx]
                for f in ("input_ids", "loss_mask", "advantages", "sampler_logprobs", "prompt_ids", "rewards")
            )
        )

    def shard(self, rank: int, world: int) -> TrainBatch:
        """This rank's contiguous share of the sequences (sizes differ by at most one; token counts may differ)."""
        n = len(self)
        lo, hi = rank * n // world, (rank + 1) * n // world
        return self.select(range(lo, hi))

    def balanced_shard(self, rank: int, world: int) -> TrainBatch:
        """This rank's share with the tokens balanced: longest sequence first, each to the rank with the fewest
        tokens so far (ties to the lower rank); deterministic, so every rank computes the same split."""
        load = [0] * world
        mine: list[int] = []
        for i in sorted(range(len(self)), key=lambda i: (-len(self.input_ids[i]), i)):
            r = min(range(world), key=lambda r: (load[r], r))
            load[r] += len(self.input_ids[i])
            if r == rank:
                mine.append(i)
        return self.select(sorted(mine))

    def pad(self, pad_id: int) -> PaddedBatch:
        """Right-padded tensors of shape (sequences, longest sequence)."""
        import torch

        width = max((len(x) for x in self.input_ids), default=1)

        def mat(rows: Sequence[Sequence[float]], fill: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)

        return PaddedBatch(
            input_ids=mat(self.input_ids, pad_id, torch.long),
            attention_mask=mat([[1] * len(x) for x in self.input_ids], 0, torch.long),
            loss_mask=mat(self.loss_mask, False, torch.bool),
            advantages=mat(self.advantages, 0.0, torch.float32),
            sampler_logprobs=mat(self.sampler_logprobs, 0.0, torch.float32),
        )


def micro_batch_groups(lengths: Sequence[int], max_sequences: int, max_tokens: int = 0) -> list[list[int]]:
    """Indices of the sequences of each micro-batch. ``max_tokens`` 0: consecutive groups of ``max_sequences``.
    ``max_tokens`` > 0: sequences longest first, a group growing while its size x its longest (the padded tokens
    of the micro-batch) stays within ``max_tokens``; a sequence longer than that is a group of its own."""
    n = len(lengths)
    if max_tokens <= 0:
        return [list(range(i, min(i + max_sequences, n))) for i in range(0, n, max_sequences)]
    groups: list[list[int]] = []
    for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@dataclass(frozen=True)
class PaddedBatch:
    """A micro-batch as tensors, each (sequences, width), right-padded (``TrainBatch.pad``)."""

    input_ids: torch.Tensor
    """Token ids; pad id past each sequence's end."""
    attention_mask: torch.Tensor
    """1 on real tokens, 0 on padding."""
    loss_mask: torch.Tensor
    """True on model-generated tokens (bool)."""
    advantages: torch.Tensor
    """Per-token advantage (float32); 0 off the loss mask."""
    sampler_logprobs: torch.Tensor
    """Per-token log-prob under the sampler (float32); 0 off the loss mask."""

    def to(self, device: torch.device | str) -> PaddedBatch:
        return PaddedBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def collate(
    trees: Sequence[RolloutTree],
    estimator: str = "tree_subgroup",
    normalize_std: bool = False,
    debiased: bool = False,
) -> TrainBatch:
    """One sequence per leaf of every tree, with per-token advantages from ``estimator`` (ADVANTAGES).

    ``debiased``: the estimator's node values are the debiased targets (``loss.debiased_values``).
    """
    fn = ADVANTAGES.get(estimator)
    opts = {"debiased": True} if debiased else {}  # estimators registered by users need not take the flag
    batch = TrainBatch()
    for tree in trees:
        if not tree.prompt_token_ids:
            raise ValueError(
                f"tree of prompt {tree.prompt.prompt_id!r} has no prompt tokens; only trees rolled out "
                "by a language-model engine can be collated"
            )
        adv = fn(tree, normalize_std=normalize_std, **opts)
        for leaf_id, per_turn in zip(adv.leaf_ids, adv.per_turn):
            ids, mask, turn = tree.sequence(leaf_id)
            a = [float(per_turn[t - 1]) if m else 0.0 for m, t in zip(mask, turn)]
            lps: list[float] = []
            for nid in tree.path(leaf_id)[1:]:
                node = tree.nodes[nid]
                n_model = sum(node.model_mask)
                if len(node.logprobs) != n_model:
                    # Zeros here would make the importance weight exp(log pi_old - 0) without a word.
                    raise ValueError(
                        f"prompt {tree.prompt.prompt_id!r}, node {nid}: the sampler returned "
                        f"{len(node.logprobs)} log-probs for {n_model} generated tokens; every sampler must "
                        "return one log-prob per kept token (tracerl.samplers.base.Generation)"
                    )
                lps += list(node.logprobs) + [0.0] * (len(node.token_ids) - n_model)
            lps = [0.0] * len(tree.prompt_token_ids) + lps
            batch.input_ids.append(ids)
            batch.loss_mask.append(mask)
            batch.advantages.append(a)
            batch.sampler_logprobs.append(lps)
            batch.prompt_ids.append(tree.prompt.prompt_id)
            batch.rewards.append(float(tree.nodes[leaf_id].reward or 0.0))
    return batch
