"""The bucketed weight push (tracerl/models/buckets.py, RolloutPool.push, workflows/train/push.py): bounded buckets,
the same weights as the whole-state gather, and a replaced sampler that catches up from a live peer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.config import TrainerConfig
from tracerl.models.buckets import Bucket, load_bucket, pack, policy_tensors, unpack
from tracerl.models.wrap import apply_lora, gather_state, hf_weights
from tracerl.workflows.train.push import push_policy

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-math"


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    shapes = [(10, 8), (3,), (40, 8), (8, 8), (2, 2)]
    out = [(f"t{i}", torch.randn(s, generator=g)) for i, s in enumerate(shapes)]
    return [*out, ("steps", torch.tensor([7, 8, 9]))]  # an integer buffer keeps its dtype


def test_buckets_stay_within_the_bound_and_give_back_every_tensor_cast() -> None:
    tensors = _tensors()
    buckets = list(pack(iter(tensors), torch.bfloat16, 256))
    # 160 B and 6 B, 640 B alone (larger than the bound), 128 B, 8 B and the 24 B int64 buffer; each tensor starts
    # at a multiple of 64 B
    assert [b.names for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4", "steps"]]
    assert [b.index for b in buckets] == [0, 1, 2] and [b.offsets for b in buckets][2] == [0, 128, 192]
    assert [b.nbytes for b in buckets] == [256, 640, 256]
    got = dict(kv for b in buckets for kv in unpack(b))
    for name, t in tensors:
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].dtype == want.dtype and torch.equal(got[name], want)


def test_the_pushed_tensors_are_the_merged_lora_weights_of_the_whole_state_gather() -> None:
    from transformers import AutoModelForCausalLM

    lora = TrainerConfig(lora_rank=4, lora_alpha=8, lora_targets=["q_proj", "v_proj"])
    model = apply_lora(AutoModelForCausalLM.from_pretrained(TINY), lora)
    g = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter is the identity
            p.data = torch.randn(p.shape, generator=g) * 0.1
    want = hf_weights(gather_state(model), lora)
    got = dict(policy_tensors(model, lora))
    assert list(got) == list(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-7)


class FakePool:
    """A fake sampler pool (test double): records the buckets a push hands it."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self.bucket_bytes = 0

    def push(self, buckets: Any, bucket_bytes: int) -> None:
        self.buckets = list(buckets)
        self.bucket_bytes = bucket_bytes


def test_push_policy_packs_in_the_samplers_dtype_and_loads_into_an_hf_model() -> None:
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(TINY)
    with torch.no_grad():
        trainer.model.norm.weight.add_(0.5)
    pool = FakePool()
    push_policy(trainer, TrainerConfig(push_bucket_mb=1), pool, "bfloat16")
    assert pool.bucket_bytes == 1 << 20 and len(pool.buckets) > 1
    assert all(b.nbytes <= 1 << 20 or len(b.names) == 1 for b in pool.buckets)
    sampler = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16)
    for b in pool.buckets:
        load_bucket(sampler, b)
    for k, v in trainer.state_dict().items():
        assert torch.equal(sampler.state_dict()[k], v.to(torch.bfloat16)), k
    with pytest.raises(KeyError, match=r"\['model.nope'\] which this sampler's model does not have"):
        load_bucket(sampler, next(pack(iter([("model.nope", torch.zeros(2))]), torch.bfloat16, 64)))


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


@pytest.mark.e2e
def test_a_replaced_sampler_copies_a_live_peers_pushed_weights(ray_local: Any) -> None:
    """Two real hf sampler actors: a push in several buckets lands in both; a sampler killed afterwards is
    replaced by one that loaded model.path and then copies its peer's weights bucket by bucket."""
    from transformers import AutoModelForCausalLM

    from tracerl.actors.pools import RolloutPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig

    pools = PoolConfig(rollout_workers=2, rollout_cpus=0.05, env_workers=0)
    spec = WorkerSpec(ModelConfig(path=str(TINY)), SamplerConfig(), EnvConfig(name="math"), pools)
    pool = RolloutPool(spec, 2, 0.05, 0.0, 1, seed=0)
    try:
        trainer = AutoModelForCausalLM.from_pretrained(TINY)
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(1.5)
        push_policy(trainer, TrainerConfig(push_bucket_mb=1), pool, "float32")
        want = dict(trainer.state_dict())

        def weights(w: int) -> dict[str, torch.Tensor]:
            b = ray_local.get(pool.workers[w].export_bucket.remote(0, 1 << 30))  # everything in one bucket
            return dict(unpack(b))

        for w in (0, 1):
            got = weights(w)
            assert all(torch.equal(got[k], v) for k, v in want.items())
        ray_local.kill(pool.workers[1])
        pool._replace(1)
        got = weights(1)
        assert all(torch.equal(got[k], v) for k, v in want.items())
    finally:
        pool.shutdown()


class FakeEngine:
    """A fake vLLM engine (test double): refuses in-place loads after ``takes`` of them, as the CPU build refuses
    every one; counts the calls."""

    def __init__(self, takes: int) -> None:
        self.takes, self.calls = takes, 0

    async def collective_rpc(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls > self.takes:
            raise NotImplementedError("repacked linear weights")

    async def reset_prefix_cache(self) -> None:
        return None


def _vllm_sampler(engine: FakeEngine, restarts: list[list[str]]) -> Any:
    from transformers import AutoTokenizer

    from tracerl.samplers.vllm import VLLMSampler

    s = VLLMSampler(engine, AutoTokenizer.from_pretrained(TINY), path=str(TINY))
    s._restart_with = lambda items: restarts.append([n for n, _ in items])  # type: ignore[method-assign]
    return s


def test_a_vllm_engine_that_cannot_reload_in_place_restarts_once_per_push_on_every_bucket() -> None:
    restarts: list[list[str]] = []
    engine = FakeEngine(takes=0)
    s = _vllm_sampler(engine, restarts)
    buckets = list(pack(iter(_tensors()), torch.bfloat16, 256))
    for push in range(2):
        for b in buckets:
            s.load_bucket(b)
        assert restarts == [["t0", "t1", "t2", "t3", "t4", "steps"]] * push  # nothing until the push ends
        s.end_push()
    assert restarts == [["t0", "t1", "t2", "t3", "t4", "steps"]] * 2 and not s.in_place
    assert engine.calls == 1  # once refused, later pushes go straight to the restart


def test_a_vllm_engine_that_refuses_part_of_a_push_says_its_weights_are_mixed() -> None:
    restarts: list[list[str]] = []
    s = _vllm_sampler(FakeEngine(takes=1), restarts)
    b0, b1, _ = pack(iter(_tensors()), torch.bfloat16, 256)
    s.load_bucket(b0)
    with pytest.raises(
        RuntimeError, match="refused part of a weight push after taking the rest.*its weights are mixed"
    ):
        s.load_bucket(b1)
    assert restarts == [] and s.in_place
