"""Collation, the PPO-clip loss and the data-parallel policy update."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import WAIT_LIMIT_S, tiny_llama
from tests.test_push import FakePool
from tracerl.algos.batch import TrainBatch, collate
from tracerl.algos.losses import LossInputs, ppo_clip_loss, token_logprobs
from tracerl.config import LossConfig, OptimConfig, TrainerConfig
from tracerl.learner import PolicyLearner, denominator, lr_lambda
from tracerl.models.buckets import unpack
from tracerl.models.hf import SetupError
from tracerl.models.wrap import (
    adapter_weights,
    apply_lora,
    fill_from_rank0,
    fully_shard_model,
    gather_state,
    hf_weights,
)
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status
from tracerl.workflows.train.push import push_policy


def _tree_with_tokens() -> RolloutTree:
    """Prompt [1, 2]; bare path A: turn (model 3 4 | obs 5) then answer (model 6, r=1);
    continuation from A's first turn: answer (model 7 8, r=0)."""
    t = RolloutTree(Prompt("p"))
    t.prompt_token_ids = [1, 2]
    a = t.new_path(True)
    n1 = t.add_node(0, a, token_ids=[3, 4, 5], model_mask=[True, True, False], logprobs=[-0.1, -0.2])
    t.add_node(
        n1.node_id, a, token_ids=[6], model_mask=[True], logprobs=[-0.3], status=Status.ANSWERED, reward=1.0
    )
    c = t.new_path(False)
    t.add_node(
        n1.node_id,
        c,
        token_ids=[7, 8],
        model_mask=[True, True],
        logprobs=[-0.4, -0.5],
        status=Status.ANSWERED,
        reward=0.0,
    )
    return t


def test_collate_masks_tool_tokens_and_broadcasts_turn_advantages() -> None:
    b = collate([_tree_with_tokens()], "grpo")
    assert b.input_ids == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7, 8]]
    assert b.loss_mask[0] == [False, False, True, True, False, True]
    assert b.advantages[0] == [0, 0, 0.5, 0.5, 0, 0.5] and b.advantages[1] == [
        0,
        0,
        -0.5,
        -0.5,
        0,
        -0.5,
        -0.5,
    ]
    assert b.sampler_logprobs[1] == [0, 0, -0.1, -0.2, 0, -0.4, -0.5]
    assert b.num_tokens == 7 and b.rewards == [1.0, 0.0]
    # node_mc: the shared first turn gets V^(n1) - V^(root) = 0, the last turns +-0.5
    mc = collate([_tree_with_tokens()], "node_mc")
    assert mc.advantages[0] == [0, 0, 0, 0, 0, 0.5] and mc.advantages[1][-2:] == [-0.5, -0.5]


def test_collate_with_debiased_values() -> None:
    # Debiased targets: the root's one bare rollout succeeded, D(root) = 1 (the continuation samples V(n1), not the
    # root's value); D(n1) = mean(1, 0) = 0.5. grpo: r - D(root); node_mc: D(child) - D(parent).
    b = collate([_tree_with_tokens()], "grpo", debiased=True)
    assert b.advantages[0] == [0, 0, 0, 0, 0, 0] and b.advantages[1] == [0, 0, -1, -1, 0, -1, -1]
    mc = collate([_tree_with_tokens()], "node_mc", debiased=True)
    assert mc.advantages[0] == [0, 0, -0.5, -0.5, 0, 0.5] and mc.advantages[1] == [
        0,
        0,
        -0.5,
        -0.5,
        0,
        -0.5,
        -0.5,
    ]


def test_collate_rejects_log_probs_that_do_not_match_the_generated_tokens() -> None:
    """Zeros in their place once made the importance weight exp(log pi_old) silently."""
    t = _tree_with_tokens()
    t.nodes[1].logprobs = [-0.1]  # two generated tokens
    with pytest.raises(ValueError, match="node 1: the sampler returned 1 log-probs for 2 generated tokens"):
        collate([t], "grpo")


def test_collate_rejects_trees_without_tokens(small_tree: RolloutTree) -> None:
    with pytest.raises(ValueError, match="no prompt tokens"):
        collate([small_tree])


def test_ppo_clip_golden_numbers() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old = 0
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[True, True, False]])
    out = ppo_clip_loss(LossInputs(logp, old, adv, mask), eps_low=0.2, eps_high=0.28)
    # token 0: max(-1.5, -1.28) = -1.28 (clipped); token 1: max(0.5, 0.8) = 0.8 (clipped); token 2 masked
    assert out.total.item() == pytest.approx(-1.28 + 0.8)
    assert out.stats["clipped"].item() == 2
    w = torch.tensor([[0.5, 2.0, 1.0]])
    assert ppo_clip_loss(LossInputs(logp, old, adv, mask, is_weight=w)).total.item() == pytest.approx(
        -0.64 + 1.6
    )
    seq = ppo_clip_loss(LossInputs(logp, old, adv, mask), aggregation="seq_mean_token_mean")
    assert seq.total.item() == pytest.approx((-1.28 + 0.8) / 2)


def test_token_logprobs_align_with_next_token() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 at position 1
    lp, ent = token_logprobs(logits, torch.tensor([[0, 2, 1]]))
    assert (
        lp[0, 0] == 0 and lp[0, 1] > -1e-3 and lp[0, 2] == pytest.approx(-torch.log(torch.tensor(4.0)).item())
    )
    assert ent[0, 2] == pytest.approx(torch.log(torch.tensor(4.0)).item())


def test_lr_schedule_warms_up_then_decays() -> None:
    f = lr_lambda(OptimConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1), total_steps=12)
    assert [round(f(s), 3) for s in (0, 1, 2)] == [0.333, 0.667, 1.0]
    assert f(12) == pytest.approx(0.1) and 0.1 < f(7) < 1.0


def _model(seed: int = 0):  # type: ignore[no-untyped-def]
    return tiny_llama(32, 16, num_layers=1, num_heads=2, max_positions=64, seed=seed, pad_token_id=0)


def _batch() -> TrainBatch:
    """Five sequences of different lengths and token counts (rank 0 of 2 gets 2 of them, rank 1 gets 3)."""
    g = torch.Generator().manual_seed(1)
    b = TrainBatch()
    for i, n in enumerate((9, 4, 12, 6, 7)):
        ids = torch.randint(1, 32, (n,), generator=g).tolist()
        mask = [j >= 2 and j % 3 != 0 for j in range(n)]
        b.input_ids.append(ids)
        b.loss_mask.append(mask)
        b.advantages.append([(1.0 if i % 2 else -0.7) if m else 0.0 for m in mask])
        b.sampler_logprobs.append([0.0] * n)
        b.prompt_ids.append(f"p{i}")
        b.rewards.append(float(i % 2))
    return b


def _update(model, batch: TrainBatch, world_batch: TrainBatch, loss: LossConfig):  # type: ignore[no-untyped-def]
    learner = PolicyLearner(model, OptimConfig(lr=0.05, warmup_steps=0), loss, total_steps=1, pad_id=0)
    return learner.update(batch, denominator(world_batch, loss.aggregation))


def _ddp_case(rank: int, aggregation: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(), broadcast_buffers=False)
    batch = _batch()
    loss = LossConfig(micro_batch_size=1, aggregation=aggregation)
    stats = _update(model, batch.shard(rank, 2), batch, loss)
    return {"params": model.module.state_dict(), "stats": stats}


def _fsdp_case(
    rank: int, lora: bool, compute: torch.dtype | None = None, from_rank0: bool = False
) -> dict[str, Any]:
    """``from_rank0``: as a run's set-up does it (workflows/train/setup.py), rank 1 builds the model on the meta
    device and receives its shards from rank 0's weights (rank 0's seed alone decides them)."""
    if from_rank0 and rank != 0:
        with torch.device("meta"):
            model = apply_lora(_model(), LORA) if lora else _model()
        whole = None
    else:
        model = _lora_model() if lora else _model()
        whole = model.state_dict() if from_rank0 else None
    model = fully_shard_model(model, compute_dtype=compute)
    if from_rank0:
        fill_from_rank0(model, whole, torch.device("cpu"))
    batch = _batch()
    stats = _update(model, batch.shard(rank, 2), batch, LossConfig(micro_batch_size=1))
    weights = hf_weights(
        gather_state(model), LORA if lora else TrainerConfig()
    )  # every rank joins the gather
    pool = FakePool() if rank == 0 else None  # every rank joins each parameter's gather of the bucketed push
    push_policy(model, LORA if lora else TrainerConfig(), pool, "float32")
    if rank != 0:
        assert weights == {}
        return {}
    assert pool is not None
    pushed = {k: v.clone() for b in pool.buckets for k, v in unpack(b)}
    return {"params": weights, "stats": stats, "pushed": pushed}


TWO_RANK_CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "ddp-token_mean": lambda rank: _ddp_case(rank, "token_mean"),
    "ddp-seq_mean_token_mean": lambda rank: _ddp_case(rank, "seq_mean_token_mean"),
    "fsdp-full": lambda rank: _fsdp_case(rank, False),
    "fsdp-lora": lambda rank: _fsdp_case(rank, True),
    "fsdp-bf16": lambda rank: _fsdp_case(rank, False, torch.bfloat16),
    "fsdp-full-from-rank0": lambda rank: _fsdp_case(rank, False, from_rank0=True),
    "fsdp-lora-from-rank0": lambda rank: _fsdp_case(rank, True, from_rank0=True),
}
"""The data-parallel updates the tests below check, each by two gloo ranks on unequal shards of ``_batch()``."""


def _two_rank_worker(rank: int, port: int, out: str) -> None:
    """Every case on one process group: one spawn of two ranks for the module, not one per test. Every rank
    passes a barrier before the teardown: a rank leaving while the other was still in its last collective once
    died of SIGABRT ("terminate called without an active exception", gloo). A collective a rank never joins
    fails after ``WAIT_LIMIT_S`` instead of gloo's 30 minutes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=WAIT_LIMIT_S)
    )
    for name, case in TWO_RANK_CASES.items():
        got = case(rank)
        if rank == 0:
            torch.save(got, Path(out) / f"{name}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What rank 0 of two gloo ranks returned for each of ``TWO_RANK_CASES`` (its weights and update stats)."""
    out = tmp_path_factory.mktemp("ranks")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_two_rank_worker, args=(port, str(out)), nprocs=2)
    return {name: torch.load(out / f"{name}.pt") for name in TWO_RANK_CASES}


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_two_ddp_workers_match_one_on_unequal_shards(
    two_ranks: dict[str, dict[str, Any]], aggregation: str
) -> None:
    batch = _batch()
    assert batch.shard(0, 2).num_tokens != batch.shard(1, 2).num_tokens
    single = _model()
    before = {k: v.clone() for k, v in single.state_dict().items()}
    stats1 = _update(single, batch, batch, LossConfig(micro_batch_size=2, aggregation=aggregation))
    got = two_ranks[f"ddp-{aggregation}"]
    changed = 0
    for k, v in single.state_dict().items():
        torch.testing.assert_close(got["params"][k], v, rtol=1e-5, atol=1e-6)
        changed += int(not torch.equal(v, before[k]))
    assert changed > 0  # the update moved the weights
    assert got["stats"]["train/loss"] == pytest.approx(stats1["train/loss"], rel=1e-5)
    assert got["stats"]["train/loss_tokens"] == batch.num_tokens


def test_update_raises_logprob_of_positive_advantage_tokens() -> None:
    model = _model()
    b = _batch().select([1])  # one sequence with advantage +1
    mb = b.pad(0)

    def seq_logp() -> float:
        with torch.no_grad():
            lp, _ = token_logprobs(model(input_ids=mb.input_ids).logits, mb.input_ids)
        return float((lp * mb.loss_mask).sum())

    before = seq_logp()
    stats = _update(model, b, b, LossConfig())
    assert seq_logp() > before
    assert stats["train/clip_fraction"] == 0.0 and stats["train/grad_norm"] > 0


def test_a_batch_without_signal_leaves_the_weights_alone() -> None:
    model = _model()
    learner = PolicyLearner(
        model, OptimConfig(lr=0.05, warmup_steps=0), LossConfig(), total_steps=3, pad_id=0
    )
    b = _batch()
    learner.update(b, denominator(b, "token_mean"))  # a real step leaves Adam momentum behind
    flat = b.select(range(len(b)))
    flat.advantages = [[0.0] * len(x) for x in flat.advantages]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learner.update(flat, denominator(flat, "token_mean"))
    assert stats["train/update_skipped"] == 1.0 and stats["train/signal_tokens"] == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# --- LoRA (peft) and FSDP2: the update and the full weights the samplers and checkpoints get ----------------------

LORA = TrainerConfig(lora_rank=4, lora_alpha=8, strategy="fsdp")


def _lora_model():  # type: ignore[no-untyped-def]
    """The small model with rank-4 adapters whose B is non-zero (a fresh adapter is the identity)."""
    model = apply_lora(_model(), LORA)
    g = torch.Generator().manual_seed(3)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=g) * 0.1
    return model


def test_lora_trains_only_adapters_and_merges_into_plain_weights() -> None:
    model = _lora_model()
    base = {k: v.clone() for k, v in _model().state_dict().items()}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    _update(model, _batch(), _batch(), LossConfig(micro_batch_size=2))
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    merged = hf_weights(gather_state(model), LORA)
    assert sorted(merged) == sorted(
        base
    )  # the architecture's own names: samplers and from_pretrained read them
    plain = _model()
    plain.load_state_dict(merged)
    ids = torch.randint(1, 32, (2, 9), generator=torch.Generator().manual_seed(5))
    model.eval()
    torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(merged["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
    assert len(adapter_weights(gather_state(model))) == 8  # A and B for q, k, v, o


def test_lora_rejects_targets_the_model_lacks() -> None:
    with pytest.raises(SetupError, match=r"lora_targets \['c_attn'\] name no linear layer.*q_proj"):
        apply_lora(_model(), TrainerConfig(lora_rank=4, lora_targets=["q_proj", "c_attn"]))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_fsdp_workers_match_one_on_unequal_shards(
    two_ranks: dict[str, dict[str, Any]], lora: bool
) -> None:
    batch = _batch()
    single = _lora_model() if lora else _model()
    stats1 = _update(single, batch, batch, LossConfig(micro_batch_size=2))
    want = hf_weights(gather_state(single), LORA if lora else TrainerConfig())
    got = two_ranks["fsdp-lora" if lora else "fsdp-full"]
    assert sorted(got["params"]) == sorted(want)
    assert list(got["pushed"]) == list(got["params"])  # the bucketed push: the same tensors, one at a time
    for k, v in want.items():
        torch.testing.assert_close(got["params"][k], v, rtol=1e-5, atol=1e-6)
        assert torch.equal(got["pushed"][k], got["params"][k]), k
    assert got["stats"]["train/loss"] == pytest.approx(stats1["train/loss"], rel=1e-5)
    assert got["stats"]["train/grad_norm"] == pytest.approx(stats1["train/grad_norm"], rel=1e-4)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp_ranks_filled_from_rank0_train_exactly_as_ranks_that_load_the_weights(
    two_ranks: dict[str, dict[str, Any]], lora: bool
) -> None:
    """Rank 1 never loads the model: it starts on the meta device and receives its shards from rank 0; the update,
    its statistics and the pushed weights are those of two ranks that each built the same weights."""
    loaded = two_ranks["fsdp-lora" if lora else "fsdp-full"]
    filled = two_ranks["fsdp-lora-from-rank0" if lora else "fsdp-full-from-rank0"]
    assert filled["stats"] == loaded["stats"]
    assert sorted(filled["params"]) == sorted(loaded["params"])
    for k, v in loaded["params"].items():
        assert torch.equal(filled["params"][k], v), k
        assert torch.equal(filled["pushed"][k], v), k


def test_mixed_precision_keeps_small_updates_that_bf16_weights_round_away() -> None:
    """float32 master weights with bfloat16 compute (autocast): an update at an 8B model's learning rate lands
    on nearly every weight; the same update on bfloat16 weights is mostly rounded away."""
    changed = {}
    for master in ("float32", "bfloat16"):
        model = _model().to(getattr(torch, master))
        seen: list[torch.dtype] = []
        model.model.layers[0].mlp.up_proj.register_forward_hook(
            lambda m, i, o, seen=seen: seen.append(o.dtype)
        )
        before = {k: v.clone() for k, v in model.state_dict().items()}
        learner = PolicyLearner(
            model,
            OptimConfig(lr=1e-6, warmup_steps=0),
            LossConfig(),
            total_steps=1,
            pad_id=0,
            autocast=torch.bfloat16 if master == "float32" else None,
        )
        b = _batch()
        learner.update(b, denominator(b, "token_mean"))
        assert set(seen) == {torch.bfloat16} and next(model.parameters()).dtype == getattr(torch, master)
        n = sum(int((v != before[k]).sum()) for k, v in model.state_dict().items())
        changed[master] = n / sum(v.numel() for v in before.values())
    print(f"weights changed by one update at lr 1e-6: {changed}")  # pytest -s shows the README's numbers
    assert changed["float32"] > 0.9 and changed["bfloat16"] < 0.1, changed


def test_two_fsdp_workers_in_mixed_precision_keep_float32_weights(
    two_ranks: dict[str, dict[str, Any]],
) -> None:
    """FSDP2's MixedPrecisionPolicy (bfloat16 compute, float32 master weights and reductions) gives one
    autocast worker's update on the whole batch, to bfloat16 accuracy."""
    batch = _batch()
    single = _model()
    learner = PolicyLearner(
        single,
        OptimConfig(lr=0.05, warmup_steps=0),
        LossConfig(micro_batch_size=2),
        total_steps=1,
        pad_id=0,
        autocast=torch.bfloat16,
    )
    stats1 = learner.update(batch, denominator(batch, "token_mean"))
    got = two_ranks["fsdp-bf16"]
    assert {v.dtype for v in got["params"].values()} == {torch.float32}
    total = sum(v.numel() for v in single.state_dict().values())
    close = {
        atol: sum(
            int(torch.isclose(got["params"][k], v, rtol=0, atol=atol).sum())
            for k, v in single.state_dict().items()
        )
        / total
        for atol in (1e-4, 1e-3)
    }
    print(
        f"share of weights within atol of one worker: {close}; grad norm {got['stats']['train/grad_norm']} vs "
        f"{stats1['train/grad_norm']}"
    )  # pytest -s shows the README's numbers
    assert close[1e-3] > 0.95
    assert got["stats"]["train/grad_norm"] == pytest.approx(stats1["train/grad_norm"], rel=2e-2)
