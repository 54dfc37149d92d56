"""Chunked log-probs from the final hidden states (tracerl.models.logprob_head), token-budget micro-batches, and the
memory estimate's chunked term with the check that refuses a budget a GPU cannot hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.test_learner import _batch, _model
from tracerl.algos.batch import TrainBatch, micro_batch_groups
from tracerl.algos.losses import token_logprobs
from tracerl.config import LossConfig, OptimConfig, SamplerConfig, TrainerConfig
from tracerl.learner import PolicyLearner, denominator
from tracerl.models.hf import SetupError
from tracerl.models.logprob_head import scored_forward
from tracerl.workflows.ops import gpu_plan
from tracerl.workflows.train.memory_check import check_update_memory, estimate_kwargs, update_shape

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-math"


def _call(model: torch.nn.Module, **inputs: torch.Tensor) -> Any:
    return model(**inputs)


def _random_batch(vocab: int, lengths: tuple[int, ...], seed: int) -> TrainBatch:
    """Sequences of random tokens; the first third of each is prompt (no loss), a few later tokens are masked."""
    g = torch.Generator().manual_seed(seed)
    b = TrainBatch()
    for i, n in enumerate(lengths):
        mask = [j >= n // 3 and j % 5 != 0 for j in range(n)]
        b.input_ids.append(torch.randint(2, vocab, (n,), generator=g).tolist())
        b.loss_mask.append(mask)
        b.advantages.append([(0.8 if i % 2 else -0.6) if m else 0.0 for m in mask])
        b.sampler_logprobs.append([-1.0 if m else 0.0 for m in mask])
        b.prompt_ids.append(f"p{i}")
        b.rewards.append(float(i % 2))
    return b


def _scores_and_grads(
    model: torch.nn.Module, b: TrainBatch, pad_id: int, chunk: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs and entropy on the loss positions, and the gradients of a weighted sum of the log-probs."""
    mb = b.pad(pad_id)
    model.zero_grad(set_to_none=True)
    if chunk > 0:
        lp, ent = scored_forward(
            model, _call, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature, chunk
        )
    else:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        lp, ent = token_logprobs(logits, mb.input_ids, temperature)
    (lp * mb.advantages * mb.loss_mask).sum().backward()
    sel = mb.loss_mask.clone()
    sel[:, 0] = False
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp[sel].detach(), ent[sel].detach(), grads


def _assert_chunked_matches_full(model: torch.nn.Module, b: TrainBatch, pad_id: int) -> None:
    """fp32 throughout. Log-probs within 1e-6. The logits of a row differ from the full path's in the last bits
    (another matrix product's blocking), and the entropy sums a vocabulary of such terms: within 1e-5 relative
    (3e-6 seen). A gradient sums over positions in another order: within 1e-5 of its tensor's largest entry
    (2e-6 seen)."""
    for temperature in (1.0, 0.7):
        lp0, ent0, g0 = _scores_and_grads(model, b, pad_id, 0, temperature)
        for chunk in (1, 5, 4096):
            lp, ent, g = _scores_and_grads(model, b, pad_id, chunk, temperature)
            torch.testing.assert_close(lp, lp0, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ent, ent0, rtol=1e-5, atol=1e-6)
            assert sorted(g) == sorted(g0)  # every parameter gets a gradient on both paths
            for name, grad in g0.items():
                scale = float(grad.abs().max())
                assert scale > 0, name
                torch.testing.assert_close(g[name], grad, rtol=0, atol=1e-5 * scale)


def test_chunked_log_probs_entropy_and_gradients_match_full_logits_on_the_tiny_policy() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32, local_files_only=True)
    vocab = model.config.vocab_size
    _assert_chunked_matches_full(model, _random_batch(vocab, (40, 17, 29), seed=0), model.config.pad_token_id)


def test_chunked_log_probs_match_full_logits_on_the_gpu_kits_dry_architecture() -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    arch = gpu_plan.scaled(gpu_plan.load_arch())  # Qwen3-1.7B's shape scaled down as the GPU kit's dry run
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**arch)).float()
    assert model.config.tie_word_embeddings  # the head's gradient reaches the embeddings on both paths
    _assert_chunked_matches_full(model, _random_batch(arch["vocab_size"], (33, 12), seed=1), 0)


def test_a_micro_batch_without_loss_tokens_gives_zero_gradients_to_every_parameter() -> None:
    model = _model()
    b = _batch().select([0, 1])
    b.loss_mask = [[False] * len(x) for x in b.loss_mask]
    lp, ent, grads = _scores_and_grads(model, b, 0, 4, 1.0)
    assert lp.numel() == 0 and ent.numel() == 0
    assert len(grads) == len(list(model.parameters()))
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())


def test_micro_batch_groups_by_count_and_by_token_budget() -> None:
    assert micro_batch_groups([5, 9, 3, 7, 2], 2) == [[0, 1], [2, 3], [4]]
    # longest first; a group grows while its size x its longest stays within 12
    assert micro_batch_groups([5, 9, 3, 7, 2], 2, max_tokens=12) == [[1], [3], [0, 2], [4]]
    assert micro_batch_groups([20, 3, 3], 1, max_tokens=10) == [[0], [1, 2]]  # too long: alone
    assert micro_batch_groups([], 4, max_tokens=10) == []


def test_balanced_shards_split_the_batch_by_tokens() -> None:
    b = _random_batch(30, (40, 10, 12, 9, 30, 8), seed=0)
    shards = [b.balanced_shard(r, 2) for r in range(2)]
    assert sorted(shards[0].prompt_ids + shards[1].prompt_ids) == sorted(b.prompt_ids)
    tokens = [sum(len(x) for x in s.input_ids) for s in shards]
    assert tokens == [58, 51]  # 40 + 10 + 8 and 30 + 12 + 9; contiguous halves would be 62 and 47
    assert [sum(len(x) for x in b.shard(r, 2).input_ids) for r in range(2)] == [62, 47]


def _learner(model: torch.nn.Module, loss: LossConfig, importance_sampling: bool = False) -> PolicyLearner:
    return PolicyLearner(
        model,
        OptimConfig(lr=0.05, warmup_steps=0),
        loss,
        total_steps=1,
        pad_id=0,
        importance_sampling=importance_sampling,
    )


@pytest.mark.parametrize("importance_sampling", [False, True])
def test_a_token_budget_update_equals_the_count_update(importance_sampling: bool) -> None:
    """Chunked log-probs on token-budget micro-batches give the unchunked update on fixed counts: the same
    gradients (compared before Adam, whose first step divides each gradient by its own size and so turns a 1e-9
    difference of a near-zero gradient into a visible one) and the same statistics."""
    b = _batch()
    results = []
    for loss in (
        LossConfig(micro_batch_size=2, logit_chunk=0),
        LossConfig(micro_tokens=14, logit_chunk=3),
    ):
        model = _model()
        stats = _learner(model, loss, importance_sampling).update(b, denominator(b, "token_mean"))
        results.append(({n: p.grad for n, p in model.named_parameters()}, stats))
    (g0, s0), (g1, s1) = results
    for k, v in g0.items():
        torch.testing.assert_close(g1[k], v, rtol=1e-5, atol=1e-7)
    for key in ("train/loss", "train/entropy", "train/grad_norm", "train/approx_kl"):
        assert s1[key] == pytest.approx(s0[key], rel=1e-5, abs=1e-7), key
    if importance_sampling:
        assert s1["train/is_weight_mean"] == pytest.approx(s0["train/is_weight_mean"], rel=1e-6)


@pytest.mark.parametrize(("epochs", "forwards"), [(1, 3), (2, 9)])
def test_importance_sampling_at_one_epoch_runs_no_old_log_prob_forward(epochs: int, forwards: int) -> None:
    """3 micro-batches: one forward each at one epoch (the old policy is the current one); at 2 epochs the frozen
    old log-probs cost one more forward each."""
    model = _model()
    calls: list[int] = []
    model.model.register_forward_hook(lambda m, i, o: calls.append(1))
    b = _batch().select([0, 1, 2])
    loss = LossConfig(micro_batch_size=1, epochs=epochs)
    stats = _learner(model, loss, importance_sampling=True).update(b, denominator(b, "token_mean"))
    assert len(calls) == forwards
    assert stats["train/is_weight_mean"] > 0


# --- the memory estimate's chunked term and the start-up check ------------------------------------------------------


def test_the_chunked_term_of_the_memory_estimate() -> None:
    shape = dict(params=10**6, trainable=10**6, layers=2, hidden=64, intermediate=128, vocab=151936)
    full = gpu_plan.memory_estimate(**shape, micro_batch=1, seq_len=8192)
    chunked = gpu_plan.memory_estimate(
        **shape, micro_batch=1, seq_len=8192, logit_chunk=1024, loss_tokens=4096
    )
    assert full["logits"] == 20 * 8192 * 151936 and full["head_inputs"] == 0
    assert chunked["logits"] == 20 * 1024 * 151936 and chunked["head_inputs"] == 8 * 4096 * 64
    assert full["peak"] - chunked["peak"] == full["logits"] - chunked["logits"] - chunked["head_inputs"]
    sharded = gpu_plan.memory_estimate(**shape, micro_batch=1, seq_len=8, shards=4, unit_params=1000)
    assert sharded["weights"] == 10**6 and sharded["gathered"] == 4000
    budget = 3e9
    n = gpu_plan.largest_micro_tokens(budget, **shape, logit_chunk=1024)
    assert gpu_plan.memory_estimate(**shape, micro_batch=1, seq_len=n, logit_chunk=1024)["peak"] <= budget
    assert gpu_plan.memory_estimate(**shape, micro_batch=1, seq_len=n + 1, logit_chunk=1024)["peak"] > budget
    assert gpu_plan.largest_micro_tokens(1e3, **shape) == 0


def _qwen3_17b() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**gpu_plan.load_arch())


def test_the_memory_check_refuses_a_token_budget_the_gpu_cannot_hold() -> None:
    trainer = TrainerConfig(use_gpu=True, gpu_memory_gb=40)
    shape = update_shape(_qwen3_17b(), trainer)
    assert (
        shape.params == 1_720_574_976 and shape.unit_params == 151936 * 2048 + 2048
    )  # embeddings + final norm
    sampler = SamplerConfig(max_context_tokens=4096)
    est = check_update_memory(shape, trainer, LossConfig(micro_tokens=8192), sampler)
    assert est is not None and est["peak"] <= 0.9 * 40e9
    fits = gpu_plan.largest_micro_tokens(0.9 * 40e9, **estimate_kwargs(shape, trainer, LossConfig()))
    with pytest.raises(
        SetupError, match=rf"^loss.micro_tokens=200000 needs .* GB .*: set loss.micro_tokens <= {fits} "
    ):
        check_update_memory(shape, trainer, LossConfig(micro_tokens=200_000), sampler)
    # unchunked on 80 GB: one 4096-token sequence fits, four (16,384 tokens, 50 GB of logits) do not
    big = TrainerConfig(use_gpu=True, gpu_memory_gb=80)
    assert check_update_memory(shape, big, LossConfig(micro_batch_size=1, logit_chunk=0), sampler) is not None
    full = LossConfig(micro_batch_size=4, logit_chunk=0)
    with pytest.raises(
        SetupError, match=r"^loss.micro_batch_size=4 sequences of up to 4096 tokens needs 8\d.\d GB"
    ):
        check_update_memory(shape, big, full, sampler)
    with pytest.raises(SetupError, match=r"^one sequence of sampler.max_context_tokens=65536 tokens needs"):
        check_update_memory(shape, big, full, SamplerConfig(max_context_tokens=65536))
    assert (
        check_update_memory(shape, TrainerConfig(gpu_memory_gb=1), full, sampler) is None
    )  # no GPU: no check
