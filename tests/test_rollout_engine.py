"""The LM tree-rollout engine with the real math environment and sandbox.

`ScriptedSampler` is a fake sampler (the unit under test is the engine): it answers each context with
the reference solution's next turn, so trees, statuses, masks, forks and the ledger can be checked
exactly. A real tiny transformers model covers the sampler and limits.
"""

from collections.abc import Sequence

import numpy as np
import pytest

from tests.conftest import TOOL_TIMEOUT_S
from tracerl.algos.allocators import Expansion
from tracerl.config import SamplerConfig
from tracerl.engine.react import PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.math.env import MathEnv
from tracerl.envs.math.tasks import MathTask, generate
from tracerl.envs.sandbox import SandboxConfig
from tracerl.models.tiny import build_model, build_tokenizer
from tracerl.samplers.base import Generation
from tracerl.samplers.hf import HFSampler
from tracerl.types import Status
from tracerl.workflows.bootstrap.config import BootstrapConfig
from tracerl.workflows.bootstrap.policy import task_prompt, trace_segments

TASKS = generate(6, seed=11)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    texts = ["".join(s.text for s in trace_segments(t)) for t in generate(200, seed=3)]
    return build_tokenizer(texts, vocab_size=400)


class ScriptedSampler:
    """Fake sampler: replies with the reference solution's next turn for the task in the context."""

    def __init__(self, tokenizer, tasks: Sequence[MathTask], wrong: bool = False) -> None:  # type: ignore[no-untyped-def]
        self.tok, self.tasks, self.wrong = tokenizer, tasks, wrong

    def generate(self, contexts, max_new_tokens, stop, temperature, seeds, caches=None):  # type: ignore[no-untyped-def]
        out = []
        t = PlainTemplate()
        for ctx in contexts:
            text = self.tok.decode(ctx)
            task = next(k for k in self.tasks if k.question in text)
            done = text.count("Observation:")
            if done < len(task.steps):
                turn = t.tool_turn(task.steps[done].thought, "python", {"code": task.steps[done].code})
            else:
                turn = t.answer_turn(task.final_thought, "-1" if self.wrong else task.answer)
            ids = self.tok(turn, add_special_tokens=False)["input_ids"][:max_new_tokens]
            out.append(
                Generation(ids, [-0.1] * len(ids), self.tok.decode(ids), "stop", prefill_tokens=len(ctx))
            )
        return out


def engine(tokenizer, sampler, **limits):  # type: ignore[no-untyped-def]
    return TreeRolloutEngine(
        sampler,
        MathEnv(SandboxConfig(timeout_s=TOOL_TIMEOUT_S)),
        PlainTemplate(),
        tokenizer,
        SamplerConfig(**limits),
        seed=0,
    )


def test_bare_rollouts_follow_the_reference_and_are_rewarded(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer, ScriptedSampler(tokenizer, TASKS))
    trees = eng.rollout([task_prompt(t) for t in TASKS], [2] * len(TASKS))
    for tree, task in zip(trees, TASKS):
        assert tree.num_leaves == 2 and tree.rewards().tolist() == [1.0, 1.0]
        leaf = tree.leaves()[0]
        assert leaf.status is Status.ANSWERED and leaf.depth == len(task.steps) + 1
        turn = tree.nodes[1]
        assert task.steps[0].output in turn.content  # the observation came from the sandbox
        n_model = sum(turn.model_mask)
        assert (
            0 < n_model < len(turn.token_ids)
            and all(turn.model_mask[:n_model])
            and not any(turn.model_mask[n_model:])
        )
    led = eng.ledger
    assert led.tool_calls == 2 * sum(len(t.steps) for t in TASKS)
    assert led.llm_calls == 2 * sum(len(t.steps) + 1 for t in TASKS) and led.invalid_actions == 0


def test_continuations_reuse_the_prefix_and_its_tool_state(tokenizer) -> None:  # type: ignore[no-untyped-def]
    task = next(t for t in TASKS if len(t.steps) == 3)
    eng = engine(tokenizer, ScriptedSampler(tokenizer, TASKS))
    (tree,) = eng.rollout([task_prompt(task)], [1])
    prefix = tree.bare_prefixes()[1]  # after two tool calls
    calls_before = eng.ledger.tool_calls
    eng.expand([tree], [Expansion(np.array([prefix]), np.array([2]), extra_bare=1)])
    assert tree.num_paths == 4 and tree.num_bare == 2
    new = [c for c in tree.nodes[prefix].children if tree.nodes[c].path_id >= 2]
    assert len(new) == 2 and all(tree.nodes[c].depth == tree.nodes[prefix].depth + 1 for c in new)
    # the two continuations each ran one remaining tool call (replaying 2 earlier cells); the extra bare ran all 3
    assert eng.ledger.tool_calls - calls_before == 2 * 1 + 3
    assert tree.rewards().tolist() == [1.0, 1.0, 1.0, 1.0]


def test_wrong_answers_get_zero_and_limits_end_episodes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    trees = engine(tokenizer, ScriptedSampler(tokenizer, TASKS, wrong=True)).rollout(
        [task_prompt(TASKS[0])], [1]
    )
    assert trees[0].rewards().tolist() == [0.0]
    task = next(t for t in TASKS if len(t.steps) >= 2)
    short = engine(tokenizer, ScriptedSampler(tokenizer, TASKS), max_turns=1).rollout(
        [task_prompt(task)], [1]
    )
    assert short[0].leaves()[0].status is Status.MAX_TURNS and short[0].rewards().tolist() == [0.0]


def test_real_tiny_model_runs_and_same_seed_gives_same_trees(tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = build_model(
        tokenizer, BootstrapConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    )

    def run():  # type: ignore[no-untyped-def]
        eng = engine(
            tokenizer, HFSampler(model, tokenizer), max_turns=3, max_turn_tokens=12, max_episode_tokens=30
        )
        trees = eng.rollout([task_prompt(t) for t in TASKS[:3]], [2, 2, 2])
        return eng, trees

    eng, trees = run()
    for tree in trees:
        assert tree.num_leaves == 2
        for leaf in tree.leaves():
            assert leaf.status in (Status.MAX_TURNS, Status.MAX_TOKENS, Status.ANSWERED) and leaf.reward in (
                0.0,
                1.0,
            )
        for node in tree.nodes[1:]:
            assert len(node.logprobs) == sum(node.model_mask) and all(lp <= 0 for lp in node.logprobs)
    assert eng.ledger.invalid_actions > 0  # an untrained model's turns become error observations, not crashes
    assert eng.ledger.generated_tokens <= 6 * 30
    _, again = run()
    assert [[n.token_ids for n in t.nodes] for t in trees] == [[n.token_ids for n in t.nodes] for t in again]


def tree_record(tree):  # type: ignore[no-untyped-def]
    """Everything sampled into a tree, node by node (node ids included)."""
    return [
        (n.node_id, n.parent, n.path_id, n.token_ids, n.logprobs, n.status, n.reward, n.content)
        for n in tree.nodes
    ]


def test_trees_depend_on_seed_keys_not_on_batching_sharding_or_order(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """FakeSeededSampler's turns depend on their seed alone: a tree must come out the same whether its paths share
    sampler calls with other prompts' paths (batch 64) or run one by one, in any prompt order and sharding, with the
    expansion phase run per shard; an extra bare rollout of the expansion is the one a larger first phase draws."""
    from tests.fake_seeded import FakeSeededSampler

    prompts = [task_prompt(t) for t in TASKS[:4]]
    counts = [2, 3, 1, 2]

    def step(shards, batch_size):  # type: ignore[no-untyped-def]
        out = {}
        for shard in shards:
            eng = engine(tokenizer, FakeSeededSampler(tokenizer), max_turns=4, batch_size=batch_size)
            eng.seed, eng.step = 7, 2
            trees = eng.rollout([prompts[i] for i in shard], [counts[i] for i in shard])
            exps = []
            for t in trees:
                pre = t.bare_prefixes()[:1]
                exps.append(Expansion(np.array(pre, dtype=np.int64), np.array([2] * len(pre)), extra_bare=1))
            eng.expand(trees, exps)
            out.update({t.prompt.prompt_id: tree_record(t) for t in trees})
        return out

    one_call = step([[0, 1, 2, 3]], batch_size=64)
    assert step([[3], [1, 0], [2]], batch_size=1) == one_call
    assert step([[2, 0], [3, 1]], batch_size=3) == one_call
    assert sum(len(r) for r in one_call.values()) > 4 * 3  # multi-turn trees with continuations
    # The expansion's extra bare rollout (path 2 of prompt 2) is the rollout a first phase of 2 would draw.
    eng = engine(tokenizer, FakeSeededSampler(tokenizer), max_turns=4)
    eng.seed, eng.step = 7, 2
    (two,) = eng.rollout([prompts[2]], [2])
    extra = [r[2:] for r in one_call[prompts[2].prompt_id] if r[2] == 1]  # path 1: the extra bare one
    assert extra == [r[2:] for r in tree_record(two) if r[2] == 1]
    eng.step = 3  # another step draws other trees
    assert tree_record(eng.rollout([prompts[2]], [2])[0]) != tree_record(two)
