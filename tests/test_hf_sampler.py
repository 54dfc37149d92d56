"""The transformers sampler on a real tiny Llama: stop strings, log-probs, and prefix KV re-use."""

from typing import Any

import pytest
import torch

from tracerl.engine.seeds import SeedKey
from tracerl.samplers.hf import HFSampler


def enc(tok, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_logprobs_match_a_forward_pass(parts) -> None:  # type: ignore[no-untyped-def]
    tok, model = parts
    ctx = enc(tok, "Question: What is 12 * 7?\n")
    (g,) = HFSampler(model, tok, reuse_prefix=False).generate([ctx], 12, [], temperature=1.0, seeds=[3])
    full = torch.tensor([ctx + g.token_ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(ctx) - 1 : -1]
    ref = torch.log_softmax(logits, -1)[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)]
    assert g.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
    assert g.prefill_tokens == len(ctx) and g.reused_tokens == 0


def test_stop_strings_cut_the_turn(parts) -> None:  # type: ignore[no-untyped-def]
    tok, model = parts
    sampler = HFSampler(model, tok)
    ctx = enc(tok, "Question: x\n")
    gens = sampler.generate([ctx] * 4, 40, ["Thought"], temperature=1.5, seeds=range(4))
    for g in gens:
        assert "Thought" not in g.text and g.finish in ("stop", "eos", "length")
        assert len(g.token_ids) == len(g.logprobs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_reuse_equals_reencoding(parts, temperature: float) -> None:  # type: ignore[no-untyped-def]
    """Continuations from cached prefixes (different lengths in one batch) give the same tokens and log-probs."""
    tok, model = parts
    cached, fresh = HFSampler(model, tok, reuse_prefix=True), HFSampler(model, tok, reuse_prefix=False)
    prompts = [
        enc(tok, "Question: What is 5 + 5?\n"),
        enc(tok, "Question: A shop has 40 boxes with 7 coins each. How many coins?\n"),
    ]
    first = cached.generate(prompts, 10, [], temperature=temperature, seeds=range(len(prompts)))
    obs = [enc(tok, "Observation: 10\n"), enc(tok, "Observation: 280\nThought:")]
    nxt = [p + g.token_ids + o for p, g, o in zip(prompts, first, obs)]
    a = cached.generate(
        nxt, 8, [], temperature=temperature, seeds=range(7, 7 + len(nxt)), caches=[g.cache for g in first]
    )
    b = fresh.generate(nxt, 8, [], temperature=temperature, seeds=range(7, 7 + len(nxt)))
    for x, y, n in zip(a, b, nxt):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=2e-4)
        assert x.reused_tokens > 0.7 * len(n) and x.prefill_tokens + x.reused_tokens == len(n)
    # A handle from another sequence is used only up to the prefix they share, and changes nothing.
    other = prompts[1] + obs[1]
    shared = next(i for i, (x, y) in enumerate(zip(other, prompts[0])) if x != y)
    mixed = cached.generate([other], 6, [], temperature=0.0, seeds=[0], caches=[first[0].cache])[0]
    plain = fresh.generate([other], 6, [], temperature=0.0, seeds=[0])[0]
    assert mixed.reused_tokens == shared and mixed.token_ids == plain.token_ids
    assert mixed.logprobs == pytest.approx(plain.logprobs, abs=2e-4)


def test_a_sequence_samples_the_same_tokens_alone_and_in_a_batch() -> None:
    """Each row samples from its own seed: the shipped tiny policy gives a context the same turn alone as in a
    batch of three (left padding moves its logits by float rounding only, measured below 1e-5 in log-prob)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained("models/tiny-math")
    sampler = HFSampler(AutoModelForCausalLM.from_pretrained("models/tiny-math"), tok, reuse_prefix=False)
    ctxs = [
        enc(tok, "Question: What is 12 * 7?\n"),
        enc(tok, "Question: A shop sells 3 apples for 5 dollars. How much do 12 apples cost?\n"),
        enc(tok, "Question: 9 + 4?\n"),
    ]
    seeds = [SeedKey(0, 1, f"p{i}", (0,), 1).value() for i in range(3)]
    batch = sampler.generate(ctxs, 48, ["Observation:"], 1.0, seeds)
    for ctx, seed, b in zip(ctxs, seeds, batch):
        (alone,) = sampler.generate([ctx], 48, ["Observation:"], 1.0, [seed])
        assert alone.token_ids == b.token_ids and len(alone.token_ids) > 5
        assert alone.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    (other,) = sampler.generate(ctxs[:1], 48, ["Observation:"], 1.0, [seeds[0] + 1])
    assert other.token_ids != batch[0].token_ids  # the seed, not the context alone, decides the draw
    with pytest.raises(ValueError, match="one seed each"):
        sampler.generate(ctxs, 8, [], 1.0, seeds[:2])


@pytest.mark.gpu
def test_prefix_reuse_on_cuda(parts) -> None:  # type: ignore[no-untyped-def]
    """The same equivalence on a GPU (``pytest -m gpu`` on a machine with CUDA)."""
    tok, model = parts
    cached = HFSampler(model, tok, device="cuda", reuse_prefix=True)
    prompt = enc(tok, "Question: What is 5 + 5?\n")
    (first,) = cached.generate([prompt], 10, [], temperature=0.0, seeds=[1])
    nxt = prompt + first.token_ids + enc(tok, "Observation: 10\n")
    (a,) = cached.generate([nxt], 8, [], temperature=0.0, seeds=[7], caches=[first.cache])
    (b,) = HFSampler(model, tok, device="cuda", reuse_prefix=False).generate(
        [nxt], 8, [], temperature=0.0, seeds=[7]
    )
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    model.to("cpu")


def test_every_backend_is_built_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine backend (the vLLM class, with a fake engine start that records its arguments) is sized from
    the sampler config; hf wraps the loaded model; an unknown backend's error lists the registered ones."""
    from tracerl.config import ModelConfig, SamplerConfig
    from tracerl.registry import RegistryError
    from tracerl.samplers import SAMPLERS, HFSampler, ScriptedSampler, VLLMSampler, make_sampler

    class FakeEngineSampler(VLLMSampler):
        """vLLM's sizing, without starting vLLM (the real engine: tests/test_vllm.py)."""

        started: dict[str, object] = {}

        @classmethod
        def from_pretrained(
            cls, path: str, dtype: str = "float32", seed: int = 0, **engine: object
        ) -> VLLMSampler:
            cls.started = {"path": path, "dtype": dtype, **engine}
            return cls(None, None, path)

    monkeypatch.setitem(SAMPLERS._items, "fake_engine", FakeEngineSampler)
    cfg = SamplerConfig(backend="fake_engine", max_context_tokens=24576)
    sampler = make_sampler(ModelConfig(path="/m", dtype="bfloat16"), cfg, None, None, gpus=0.5)
    assert isinstance(sampler, FakeEngineSampler)
    assert FakeEngineSampler.started == {
        "path": "/m",
        "dtype": "bfloat16",
        "max_model_len": 24576,
        "gpu_memory_utilization": 0.45,
    }  # half a GPU: half its memory
    make_sampler(ModelConfig(path="/m"), cfg, None, None, gpus=1.0)
    assert "gpu_memory_utilization" not in FakeEngineSampler.started

    model = torch.nn.Linear(2, 2)
    hf = make_sampler(ModelConfig(path="/m"), SamplerConfig(backend="hf", reuse_prefix=False), model, "tok")
    assert isinstance(hf, HFSampler) and hf.model is model and hf.tokenizer == "tok" and not hf.reuse_prefix
    scripted = make_sampler(ModelConfig(path="/m"), SamplerConfig(backend="scripted"), None, "tok")
    assert isinstance(scripted, ScriptedSampler) and scripted.tok == "tok"
    with pytest.raises(RegistryError, match="unknown sampler 'nope'; known: fake_engine, hf, scripted, vllm"):
        make_sampler(ModelConfig(path="/m"), SamplerConfig(backend="nope"), None, None)


def test_an_engine_backend_must_fit_the_model_window(tiny_policy) -> None:  # type: ignore[no-untyped-def]
    from tracerl.config import SamplerConfig
    from tracerl.models.hf import SetupError, check_window

    check_window(str(tiny_policy), SamplerConfig(backend="hf", max_context_tokens=16384))  # hf runs past it
    with pytest.raises(
        SetupError,
        match=r"sampler.max_context_tokens=16384 is beyond the position window .*"
        r"\(max_position_embeddings=1024\).*set sampler.max_context_tokens=1024",
    ):
        check_window(str(tiny_policy), SamplerConfig(backend="vllm", max_context_tokens=16384))


def test_step_logprobs_are_the_stacked_logits_log_softmax_bitwise(parts: tuple[Any, Any]) -> None:
    """The sampler's per-step log-probs (``_StepLogprobs``: one (rows, vocab) block at a time) are, bit for bit, what
    a log-softmax over all of a turn's logits kept by ``output_logits`` gives for the same draws."""
    from tracerl.samplers.hf import CACHE, _RowGumbel

    tok, model = parts
    sampler = HFSampler(model, tok, reuse_prefix=False)
    ctxs = [enc(tok, "Question: What is 5 + 5?\n"), enc(tok, "Question: A shop has 40 boxes. How many?\n")]
    gens = sampler.generate(ctxs, 14, ["Observation"], temperature=0.7, seeds=[5, 6])
    width = max(len(c) for c in ctxs)
    ids = torch.full((2, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, c in enumerate(ctxs):
        ids[r, width - len(c) :], mask[r, width - len(c) :] = torch.tensor(c), 1
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            **{CACHE: sampler._batch_cache([None, None], 0, width + 14)},
            max_new_tokens=14,
            do_sample=False,
            logits_processor=[_RowGumbel([5, 6], 0.7, "cpu")],
            temperature=None,
            top_p=None,
            top_k=None,
            stop_strings=["Observation"],
            tokenizer=tok,
            pad_token_id=tok.pad_token_id,
            eos_token_id=sampler.ends or None,
            return_dict_in_generate=True,
            output_logits=True,
        )
    logp = torch.log_softmax(torch.stack(out.logits, dim=1).float() / 0.7, dim=-1)
    for r, g in enumerate(gens):
        assert g.token_ids == out.sequences[r, width : width + len(g.token_ids)].tolist()
        assert g.logprobs == logp[r, torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].tolist()
    # a row's log-softmax alone is the same as within a stacked (rows, tokens, vocab) tensor
    x = torch.randn(4, 9, 50_000, generator=torch.Generator().manual_seed(0)) * 5
    whole = torch.log_softmax(x / 0.7, dim=-1)
    assert all(torch.equal(torch.log_softmax(x[:, t] / 0.7, dim=-1), whole[:, t]) for t in range(9))


def test_a_model_whose_generate_skips_its_forward_is_refused(parts: tuple[Any, Any]) -> None:
    """A wrapper whose ``generate`` runs an inner model never calls its own forward: no log-probs can be taken."""
    tok, model = parts

    class FakeWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def generate(self, **kw: Any) -> Any:
            return self.inner.generate(**kw)

    sampler = HFSampler(FakeWrapper(), tok, reuse_prefix=False)
    with pytest.raises(RuntimeError, match="must run the model itself"):
        sampler.generate([enc(tok, "Question: x\n")], 4, [], temperature=1.0, seeds=[0])
