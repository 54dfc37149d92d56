"""LoRA adapter pushes (tracerl/models/buckets.py ``adapter_tensors``, ``LoraBase``; workflows/train/push.py): after a
LoRA run's first whole push, hf samplers get the adapters alone and merge them into their base copy, which gives
the weights a whole merged push gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.config import TrainerConfig
from tracerl.models.buckets import Bucket, LoraBase, adapter_tensors, pack, unpack
from tracerl.models.wrap import apply_lora
from tracerl.workflows.train.push import adapter_pushes, push_policy

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-math"
LORA = TrainerConfig(lora_rank=4, lora_alpha=8, lora_targets=["q_proj", "v_proj"], push_bucket_mb=1)


def _trainer() -> Any:
    from transformers import AutoModelForCausalLM

    return apply_lora(AutoModelForCausalLM.from_pretrained(TINY), LORA)


def _update(model: Any, seed: int) -> None:
    """New adapters, as an update would leave them (B no longer zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def _pool(lora_targets: tuple[str, ...]) -> Any:
    from tracerl.actors.local import LocalPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig

    spec = WorkerSpec(
        ModelConfig(path=str(TINY)),
        SamplerConfig(),
        EnvConfig(name="math"),
        PoolConfig(env_workers=0),
        lora_targets=lora_targets,
    )
    return LocalPool(spec, 1, seed=0)


class RecordingPool:
    """A fake sampler pool (test double): hands each push to a real in-process pool and records its buckets."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.pushes = pool, []

    def push(self, buckets: Any, bucket_bytes: int) -> None:
        seen: list[Bucket] = []

        def record() -> Any:
            for b in buckets:
                seen.append(b)
                yield b

        self.pool.push(record(), bucket_bytes)
        self.pushes.append(seen)


def test_an_adapter_push_gives_the_weights_of_a_whole_merged_push() -> None:
    trainer = _trainer()
    adapted = RecordingPool(_pool(("q_proj", "v_proj")))
    whole = _pool(())
    _update(trainer, 1)
    push_policy(trainer, LORA, adapted, "float32")  # the first push: whole, merged
    _update(trainer, 2)  # the next update moves the adapters
    push_policy(trainer, LORA, adapted, "float32", adapters=True)
    push_policy(trainer, LORA, whole, "float32")  # a sampler that gets the same weights whole
    first, second = adapted.pushes
    assert all(b.lora_scaling is None for b in first) and {b.lora_scaling for b in second} == {2.0}
    layers = 2 * sum(1 for n, _ in trainer.named_modules() if n.endswith("self_attn.q_proj"))
    names = [n for b in second for n in b.names]
    assert len(names) == layers and all(n.endswith(("q_proj.lora", "v_proj.lora")) for n in names)
    assert sum(b.nbytes for b in second) * 20 < sum(b.nbytes for b in first)  # the adapters are a small push
    got, want = adapted.pool.worker.model.state_dict(), whole.worker.model.state_dict()
    assert list(got) == list(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1.3e-6, atol=1e-6, msg=k)
    q = "model.layers.0.self_attn.q_proj.weight"  # the adapters moved it from the first push's value
    assert not torch.allclose(got[q], dict(kv for b in first for kv in unpack(b))[q])


def test_an_adapter_push_to_a_sampler_without_a_base_copy_is_refused() -> None:
    trainer = _trainer()
    _update(trainer, 1)
    pool = _pool(())
    with pytest.raises(
        RuntimeError, match="keeps no base copy to merge it into: adapter pushes need sampler.backend"
    ):
        push_policy(trainer, LORA, pool, "float32", adapters=True)
    other = _pool(("q_proj",))  # targets that differ from the trainer's
    with pytest.raises(
        KeyError, match="adapts 'model.layers.0.self_attn.v_proj', of which this sampler keeps no"
    ):
        push_policy(trainer, LORA, other, "float32", adapters=True)


def test_adapter_tensors_hold_each_layers_a_then_b() -> None:
    trainer = _trainer()
    _update(trainer, 3)
    state = trainer.state_dict()
    got = dict(adapter_tensors(trainer))
    stem = "base_model.model.model.layers.1.self_attn.v_proj"
    a, b = state[f"{stem}.lora_A.default.weight"], state[f"{stem}.lora_B.default.weight"]
    assert torch.equal(got["model.layers.1.self_attn.v_proj.lora"], torch.cat([a.reshape(-1), b.reshape(-1)]))
    base = LoraBase(trainer.get_base_model(), ["v_proj"])
    assert sorted(base.base) == sorted(
        n for n, _ in trainer.get_base_model().named_modules() if n.endswith("v_proj")
    )
    bucket = next(
        pack(iter([("model.layers.1.self_attn.v_proj.lora", torch.zeros(7))]), torch.float32, 64, 2.0)
    )
    with pytest.raises(ValueError, match="do not fit its"):
        base.load(trainer.get_base_model(), bucket)


@pytest.mark.parametrize(
    ("lora_rank", "backend", "adapters"), [(4, "hf", True), (0, "hf", False), (4, "vllm", False)]
)
def test_which_runs_push_adapters_after_the_first_push(lora_rank: int, backend: str, adapters: bool) -> None:
    """The Worker's pushes: the first whole, later ones adapters where the run is LoRA on hf samplers."""
    from tracerl.config import ModelConfig, SamplerConfig, TrainConfig
    from tracerl.workflows.train.setup import Worker

    trainer = TrainerConfig(lora_rank=lora_rank, lora_targets=["q_proj"])
    cfg = TrainConfig(
        model=ModelConfig(path=str(TINY)), sampler=SamplerConfig(backend=backend), trainer=trainer
    )
    assert adapter_pushes(cfg.trainer, backend) is adapters
    kinds: list[list[Any]] = []

    class KindPool:
        """A fake sampler pool (test double): records each push's bucket kinds."""

        def push(self, buckets: Any, bucket_bytes: int) -> None:
            kinds.append(sorted({b.lora_scaling is not None for b in buckets}))

    model = _trainer() if lora_rank else __import__("transformers").AutoModelForCausalLM.from_pretrained(TINY)
    w = Worker(cfg, 0, 1, None, model, None, None, None, Path("."), None)  # type: ignore[arg-type]
    for _ in range(3):
        w.push(KindPool())
    assert kinds == [[False], [adapters], [adapters]]
