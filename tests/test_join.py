"""Per-token join (``sampler.join``; samplers/hf_join.py, engine/join.py) on the shipped tiny policy.

A turn that joins a running decode batch must be the turn ``HFSampler.generate`` gives it (its seed decides it, not
its batch-mates or when it joined), cut at stop strings, with the log-probs a plain forward pass gives, re-using its
prefix's KV cache; the engine must roll out the trees rounds do (each path's turns alike; nodes may be numbered in
another order).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import TOOL_TIMEOUT_S
from tracerl.algos.allocators import Expansion
from tracerl.config import SamplerConfig
from tracerl.engine.react import PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.engine.seeds import SeedKey
from tracerl.envs.math.env import MathEnv
from tracerl.envs.math.tasks import generate as gen_tasks
from tracerl.envs.sandbox import SandboxConfig
from tracerl.samplers.hf import HFSampler
from tracerl.tree import RolloutTree
from tracerl.workflows.bootstrap.policy import task_prompt

POLICY = "models/tiny-math-habit"
STOP = ["Observation:"]


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(POLICY), AutoModelForCausalLM.from_pretrained(POLICY)


def enc(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def run_join(
    sampler: HFSampler, turns: list[tuple[list[int], int, object | None]], joins: dict[int, int]
) -> dict:
    """Turn k joins the batch before forward ``joins.get(k, 0)``; returns each turn's generation by index."""
    batch = sampler.join_batch(STOP, 1.0)
    out: dict[int, Any] = {}
    step = 0
    while len(out) < len(turns):
        for k, (ctx, seed, cache) in enumerate(turns):
            if joins.get(k, 0) == step:
                batch.add(k, ctx, 48, seed, cache)
        done, sampled = batch.step()
        out.update(dict(done))
        step += 1
    assert len(batch) == 0
    return out


def test_a_joined_turn_is_the_generate_turn_whenever_it_joins(policy: tuple[Any, Any]) -> None:
    """Turns joining at forwards 0, 3 and 9 (others decoding meanwhile) sample the tokens ``generate`` gives them,
    alone or with their batch-mates: the seed decides; stop strings cut the turn as in ``generate``."""
    tok, model = policy
    sampler = HFSampler(model, tok)
    questions = [
        "What is 12 * 7?",
        "A shop sells 3 apples for 5 dollars. How much do 12 apples cost?",
        "9 + 4?",
    ]
    ctxs = [enc(tok, f"Question: {q}\n") for q in questions]
    seeds = [SeedKey(0, 1, f"p{i}", (0,), 1).value() for i in range(3)]
    ref = sampler.generate(ctxs, 48, STOP, 1.0, seeds)
    joined = run_join(sampler, [(c, s, None) for c, s in zip(ctxs, seeds)], {1: 3, 2: 9})
    alone = run_join(sampler, [(ctxs[1], seeds[1], None)], {})[0]
    assert alone.token_ids == joined[1].token_ids
    for k, r in enumerate(ref):
        g = joined[k]
        assert g.token_ids == r.token_ids and len(g.token_ids) > 5
        assert (g.text, g.finish) == (r.text, r.finish)
        assert g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
        assert g.prefill_tokens == len(ctxs[k]) and g.reused_tokens == 0
    assert {g.finish for g in joined.values()} >= {
        "stop"
    }  # a turn that wrote "Observation:" was cut before it
    assert all("Observation:" not in g.text for g in joined.values())
    other = run_join(sampler, [(ctxs[0], seeds[0] + 1, None)], {})[0]
    assert other.token_ids != joined[0].token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_joined_next_turn_reuses_its_prefix_and_its_logprobs_are_a_forward_pass(
    policy: tuple[Any, Any], temperature: float
) -> None:
    """The next turn joins with the first turn's KV handle: it re-encodes only the observation, and its log-probs
    are those of one forward pass over the whole sequence at the temperature (what the trainer recomputes)."""
    tok, model = policy
    sampler = HFSampler(model, tok)
    ctxs = [enc(tok, "Question: What is 5 + 5?\n"), enc(tok, "Question: What is 40 * 7 + 3?\n")]
    batch = sampler.join_batch(STOP, temperature)
    for k, c in enumerate(ctxs):
        batch.add(k, c, 24, 11 + k, None)
    first: dict[int, Any] = {}
    while len(batch):
        first.update(dict(batch.step()[0]))
    nxt = [c + first[k].token_ids + enc(tok, "Observation: 10\nThought:") for k, c in enumerate(ctxs)]
    batch = sampler.join_batch(STOP, temperature)
    for k, c in enumerate(nxt):
        batch.add(k, c, 24, 21 + k, first[k].cache)
    second: dict[int, Any] = {}
    while len(batch):
        second.update(dict(batch.step()[0]))
    for k, c in enumerate(nxt):
        g = second[k]
        assert g.reused_tokens >= len(ctxs[k]) and g.prefill_tokens + g.reused_tokens == len(c)
        with torch.no_grad():
            logits = model(torch.tensor([c + g.token_ids])).logits[0, len(c) - 1 : -1]
        ref = torch.log_softmax(logits / temperature, -1)[
            torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)
        ]
        assert g.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
    plain = HFSampler(model, tok, reuse_prefix=False).generate(nxt, 24, STOP, temperature, [21, 22])
    assert [second[k].token_ids for k in range(2)] == [g.token_ids for g in plain]


def nodes(tree: RolloutTree) -> list[tuple[object, ...]]:
    """The whole tree, node by node: ids, parents, children, path, tokens, log-probs (to 1e-3), status, reward, text."""
    return [
        (
            n.node_id,
            n.parent,
            n.children,
            n.path_id,
            n.token_ids,
            [round(x, 3) for x in n.logprobs],
            n.status,
            n.reward,
            n.content,
        )
        for n in tree.nodes
    ]


def test_the_engine_joined_rolls_out_the_rounds_trees(policy: tuple[Any, Any]) -> None:
    """Bare rollouts with tool calls, then continuations from their prefixes: with ``sampler.join`` the trees are
    the rounds' trees node for node, numbering included, although turns end in another order (in process, the real
    sandbox), and the ledger counts the same work."""
    tok, model = policy
    prompts = [task_prompt(t) for t in gen_tasks(12, seed=5)[:4]]

    def step(join: bool) -> tuple[list[RolloutTree], Any, TreeRolloutEngine]:
        env = MathEnv(SandboxConfig(timeout_s=TOOL_TIMEOUT_S))
        eng = TreeRolloutEngine(
            HFSampler(model, tok), env, PlainTemplate(), tok, SamplerConfig(join=join), seed=0
        )
        trees = eng.rollout(prompts, [2] * len(prompts))
        pre = [t.bare_prefixes()[:1] for t in trees]
        eng.expand(trees, [Expansion(np.array(p, dtype=np.int64), np.array([2] * len(p)), 0) for p in pre])
        return trees, eng.ledger, eng

    rounds, led_r, _ = step(False)
    joined, led_j, eng = step(True)
    assert [nodes(t) for t in joined] == [nodes(t) for t in rounds]
    assert led_j.tool_calls == led_r.tool_calls > 0 and led_j.generated_tokens == led_r.generated_tokens
    assert led_j.llm_calls == led_r.llm_calls and sum(t.num_leaves for t in joined) == 4 * 2 + 2 * 4
    assert led_j.prefill_tokens_reused > 0
    # Evaluation changes the temperature between calls: the join follows it (greedy: the seed changes nothing).
    eng.limits = replace(eng.limits, temperature=0.0, max_turns=1)
    greedy = [nodes(eng.rollout(prompts[:1], [1])[0]) for eng.seed in (1, 2)]
    assert greedy[0] == greedy[1]


def test_join_needs_a_backend_with_a_decode_loop() -> None:
    from tests.fake_seeded import FakeSeededSampler

    with pytest.raises(ValueError, match="sampler.join=true needs a backend with a per-token join"):
        TreeRolloutEngine(
            FakeSeededSampler(None),
            MathEnv(),
            PlainTemplate(),
            None,
            SamplerConfig(backend="tests.fake_seeded:FakeSeededSampler", join=True),
        )


def test_the_pipeline_bench_compares_join_with_rounds() -> None:
    """``--batching rounds,join`` runs every mode both ways; the summary pairs them by seed: the join's mean gain
    against the spread of the per-seed gains (barrier: 1.0 and 1.5 s, faster; streaming: +0.1 and -0.1 s, not)."""
    from tracerl.workflows.cli.app import build_parser, load
    from tracerl.workflows.pipeline.bench import format_table, summarize

    cfg = load(
        "bench pipeline", build_parser().parse_args(["bench", "pipeline", "--batching", "rounds,join"])
    )
    assert cfg.batchings == ["rounds", "join"] and cfg.modes == ["barrier", "streaming"]

    def run(mode: str, seed: int, s: float) -> dict[str, Any]:
        step = {"step_s": s, "rollout_s": s, "busy": 0.5, "occupancy": 2.0, "generated_tokens": 10}
        return {"mode": mode, "seed": seed, "steps": [{**step, "same_allocation": True}]}

    runs = [run("barrier", 0, 4.0), run("barrier+join", 0, 3.0), run("streaming", 0, 3.0)]
    runs += [run("streaming+join", 0, 2.9), run("barrier", 1, 5.0), run("barrier+join", 1, 3.5)]
    runs += [run("streaming", 1, 3.4), run("streaming+join", 1, 3.5)]
    summary = summarize(cfg, runs)
    join = summary["cpu"]["join"]
    assert join["barrier"]["gain_s"] == pytest.approx(1.25) and join["barrier"]["spread_s"] == pytest.approx(
        0.5
    )
    assert join["barrier"]["faster"] and not join["streaming"]["faster"]
    assert summary["cpu"]["streaming+join"]["step_s"] == pytest.approx(3.2)
    assert "barrier: join / rounds step time 0.722" in format_table(summary)
    with pytest.raises(ValueError, match="batchings"):
        load(
            "bench pipeline", build_parser().parse_args(["bench", "pipeline", "--batching", "rounds,tokens"])
        )
