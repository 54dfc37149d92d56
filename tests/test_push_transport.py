"""``trainer.push_transport``: 'nccl' is refused where it cannot run (one line), and the collective push's protocol
(tracerl/actors/collective.py) carries the policy into fake engines (tests/fake_collective.py) over a gloo group on
the CPU, standing in for NCCL (never run on a GPU here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fake_collective import FakeCollectiveSampler
from tracerl.actors.collective import CollectivePush, GlooGroup
from tracerl.config import TrainerConfig
from tracerl.models.buckets import batched, policy_tensors, unpack
from tracerl.workflows.cli.app import main

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-math"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["trainer.push_transport=nccl"],
            "trainer.push_transport=nccl broadcasts the weights into a sampler engine's GPUs (vLLM's weight "
            "transfer), which sampler.backend=hf does not take: set sampler=vllm, or trainer.push_transport=ray",
        ),
        (
            ["trainer.push_transport=nccl", "sampler=vllm"],
            "trainer.push_transport=nccl needs CUDA on the trainer and on the samplers: set trainer.use_gpu=true "
            "and pools.rollout_gpus > 0 (GPU machines), or trainer.push_transport=ray",
        ),
        (["trainer.push_transport=tcp"], "trainer.push_transport must be one of"),
    ],
)
def test_nccl_is_refused_in_one_line_where_it_cannot_run(
    overrides: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "train", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_nccl_with_vllm_on_gpus_is_a_valid_config(capsys: pytest.CaptureFixture[str]) -> None:
    over = ["trainer.push_transport=nccl", "sampler=vllm", "trainer.use_gpu=true", "pools.rollout_gpus=1"]
    assert main(["config", "train", *over]) == 0
    assert "push_transport: nccl" in capsys.readouterr().out


class Threads:
    """The control plane over in-process fake samplers: each call runs on its own thread (as Ray actor calls run
    beside the caller)."""

    def __init__(self, samplers: list[Any]) -> None:
        self.samplers, self.pool = samplers, ThreadPoolExecutor(8)

    def start(self, method: str, args: Any) -> list[Any]:
        return [self.pool.submit(getattr(s, method), *a) for s, a in zip(self.samplers, args)]

    @staticmethod
    def wait(handles: list[Any]) -> list[Any]:
        return [h.result(timeout=300) for h in handles]


def _policy(scale: float) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return list(policy_tensors(model, TrainerConfig()))


def test_a_collective_push_lands_every_tensor_in_every_engine_rank() -> None:
    """Two fake engines, one of two ranks (tensor parallel): a group of 4 with trainer rank 0, formed once; two
    pushes in 1 MB batches of bfloat16 land in every rank."""
    samplers = [FakeCollectiveSampler(None, ranks=2), FakeCollectiveSampler(None)]
    calls = Threads(samplers)
    push = CollectivePush(calls.start, calls.wait, 2, "127.0.0.1", GlooGroup)
    for scale in (1.5, 2.0):
        tensors = _policy(scale)
        batches = list(batched(iter(tensors), torch.bfloat16, 1 << 20))
        assert len(batches) > 1 and all(
            len(b) == 1 or sum(t.nbytes for _, t in b) <= 1 << 20 for b in batches
        )
        group = push.group
        assert push.push(iter(batches)) == [None, None]  # each sampler's end_push
        assert push.world == 4 and (group is None or push.group is group)  # formed at the first push only
        for s in samplers:
            assert list(s.weights) == [n for n, _ in tensors]
            assert all(torch.equal(s.weights[n], t.to(torch.bfloat16)) for n, t in tensors)
    assert [s.ended for s in samplers] == [2, 2]


class ShortSampler(FakeCollectiveSampler):
    """A fake engine sampler (test double) that says it took a byte less than it did."""

    def receive_weights(self, *args: Any) -> int:
        return super().receive_weights(*args) - 1


def test_a_sampler_that_took_other_bytes_fails_the_push() -> None:
    calls = Threads([ShortSampler(None)])
    push = CollectivePush(calls.start, calls.wait, 1, "127.0.0.1", GlooGroup)
    with pytest.raises(
        RuntimeError, match=r"sent 24 bytes but the samplers took \[23\]: their weights are mixed"
    ):
        push.push(iter([[("w", torch.ones(2, 3))]]))


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


def test_the_pool_pushes_through_the_group_and_refuses_to_catch_up(ray_local: Any) -> None:
    """Two Ray sampler actors running the fake engine: ``push_policy`` with push_transport=nccl broadcasts from this
    process (rank 0) into both; a replaced sampler cannot be caught up over the group, and says so."""
    from transformers import AutoModelForCausalLM

    from tracerl.actors.pools import RolloutPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig
    from tracerl.workflows.train.push import push_policy

    pools = PoolConfig(rollout_workers=2, rollout_cpus=0.05, env_workers=0)
    sampler = SamplerConfig(backend="tests.fake_collective:FakeCollectiveSampler")
    spec = WorkerSpec(
        ModelConfig(path=str(TINY)), sampler, EnvConfig(name="math"), pools, push_transport="nccl"
    )
    pool = RolloutPool(spec, 2, 0.05, 0.0, 1, seed=0)
    pool.push_group = GlooGroup  # NCCL's stand-in on the CPU, as the fake engines'
    try:
        trainer = AutoModelForCausalLM.from_pretrained(TINY)
        with torch.no_grad():
            trainer.model.norm.weight.add_(0.5)
        push_policy(trainer, TrainerConfig(push_transport="nccl", push_bucket_mb=1), pool, "bfloat16")
        want = {k: v.to(torch.bfloat16) for k, v in trainer.state_dict().items()}
        for w in (0, 1):
            got = dict(unpack(ray_local.get(pool.workers[w].export_bucket.remote(0, 1 << 30))))
            assert int(got.pop("ended")) == 1 and list(got) == list(want)
            assert all(torch.equal(got[k], v) for k, v in want.items())
        assert pool.engine_restarts == 0 and pool._kept == []  # nothing went through the object store
        ray_local.kill(pool.workers[1])
        with pytest.raises(
            RuntimeError, match="replaced after a collective weight push .* cannot catch it up"
        ):
            pool._replace(1)
    finally:
        pool.shutdown()
