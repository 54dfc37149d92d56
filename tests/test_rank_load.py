"""What a trainer rank loads at set-up (workflows/train/setup.py ``load_model``): the weights once, from the
checkpoint when there is one, or (an FSDP rank but 0) only the architecture on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tracerl.config import ModelConfig, TrainConfig, TrainerConfig
from tracerl.workflows.train.setup import load_model

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-math"


def _cfg(lora_rank: int = 0) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(path=str(TINY)), trainer=TrainerConfig(lora_rank=lora_rank, lora_targets=["q_proj"])
    )


def test_a_rank_without_weights_holds_the_architecture_on_the_meta_device_only() -> None:
    for lora_rank in (0, 4):
        tok, loaded = load_model(_cfg(lora_rank), None)
        tok2, empty = load_model(_cfg(lora_rank), None, weights=False)
        assert tok2.pad_token_id == tok.pad_token_id
        shapes = {k: (v.shape, v.dtype) for k, v in loaded.state_dict().items()}
        assert {k: (v.shape, v.dtype) for k, v in empty.state_dict().items()} == shapes
        assert all(t.is_meta for t in (*empty.parameters(), *empty.buffers()))  # no memory, no weights
        assert not any(t.is_meta for t in loaded.parameters())
        trainable = {n for n, p in loaded.named_parameters() if p.requires_grad}
        assert {n for n, p in empty.named_parameters() if p.requires_grad} == trainable
        if lora_rank:
            assert trainable and all(".lora_" in n for n in trainable)


def test_a_checkpoint_is_read_instead_of_the_initial_policy(tmp_path: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(TINY)
    with torch.no_grad():
        next(base.parameters()).add_(1.0)  # the checkpoint's policy differs from model.path's
    base.save_pretrained(tmp_path / "policy")
    _, model = load_model(_cfg(), str(tmp_path))
    for (name, want), got in zip(base.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(got, want), name


def test_an_engine_that_loads_its_own_weights_gets_no_hf_copy_in_the_stack() -> None:
    from tracerl.config import PredictorConfig, SamplerConfig, lm_env
    from tracerl.models.hf import SetupError
    from tracerl.workflows.lm.stack import build_stack, text_features

    backend = "tests.fake_seeded:FakeEngineSampler"
    stack = build_stack(ModelConfig(path=str(TINY)), SamplerConfig(backend=backend), lm_env(), seed=0)
    assert stack.model is None and stack.tokenizer.pad_token_id is not None
    hashed = text_features(PredictorConfig(features="hashed"), stack.model, stack.tokenizer, str)
    assert hashed() is not None
    policy = text_features(PredictorConfig(features="policy"), stack.model, stack.tokenizer, str)
    with pytest.raises(SetupError, match="use predictor.features=hashed"):
        policy()
