"""The BFCL v4 multi-turn environment with the real bfcl-eval backends and checker.

Ground truth replayed as model text (both turn templates) through the parser and the environment scores 1.0
on a seeded sample of each category (the full 4 x 200 is measured in the README); through the real rollout
engine with a fake sampler (named as such: the unit under test is the engine's multi-turn path) the same
holds for bare rollouts and continuations. Concurrent rollouts do not share backend state, forks replay
to the same state, malformed calls are error observations, and the split is seeded and disjoint.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

try:
    from tracerl.envs.bfcl.data import CATEGORIES, import_bfcl, load_tasks, split

    import_bfcl()
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(
        f"bfcl-eval is not installed ({exc}); pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0",
        allow_module_level=True,
    )

from tracerl.algos.allocators import Expansion
from tracerl.config import SamplerConfig, env_config
from tracerl.engine.protocol import AnswerResult
from tracerl.engine.react import TEMPLATES, Action, ActionKind, PlainTemplate, ToolCall
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.bfcl.config import BfclEnvConfig
from tracerl.envs.bfcl.env import BfclEnv, BfclState, bfcl_globals, task_prompt
from tracerl.envs.registry import env_class
from tracerl.samplers.base import Generation
from tracerl.types import Prompt, Status

SAMPLE_PER_CATEGORY = 25


@pytest.fixture(scope="module")
def env() -> BfclEnv:
    return BfclEnv()


def replay(
    env: BfclEnv, prompt: Prompt, turns: Sequence[str], template: Any
) -> tuple[float | None, BfclState]:
    """Run model turns through the template's parser and the environment (no engine); the final reward."""
    state = env.initial_state(prompt)
    for text in turns:
        action = template.parse(text, env.tools_for(prompt, state))
        if action.kind is ActionKind.TOOL:
            state = env.execute(prompt, state, action).state
        elif action.kind is ActionKind.ANSWER:
            result = env.on_answer(prompt, state, action)
            if result.observation is None:
                return result.reward, state
            state = result.state
        else:
            raise AssertionError(f"{prompt.prompt_id}: gold turn did not parse: {action.error}\n{text}")
    return None, state


@pytest.mark.parametrize("template", ["plain", "chat"])
@pytest.mark.parametrize("category", list(CATEGORIES))
def test_gold_replay_scores_full_marks(env: BfclEnv, category: str, template: str) -> None:
    tasks = random.Random(category).sample(list(load_tasks(category)), SAMPLE_PER_CATEGORY)
    tmpl = TEMPLATES.get(template)()
    scores = [replay(env, task_prompt(t), env.gold_turns(task_prompt(t), tmpl), tmpl)[0] for t in tasks]
    assert scores == [1.0] * len(tasks)
    assert bfcl_globals() == []  # every execution and check removed its backend instances


def test_wrong_or_missing_calls_score_zero(env: BfclEnv) -> None:
    task = load_tasks("base")[0]
    p, tmpl = task_prompt(task), PlainTemplate()
    gold = env.gold_turns(p, tmpl)
    without_last_calls = gold[:-2] + gold[-1:]  # the last user turn ends without its calls
    assert replay(env, p, without_last_calls, tmpl)[0] == 0.0
    skipped_turn = gold[1:]  # turn 1's calls made in turn 0's place: every turn is off by one
    assert replay(env, p, skipped_turn, tmpl)[0] == 0.0


def test_user_turns_come_from_the_environment_and_miss_func_adds_functions(env: BfclEnv) -> None:
    task = next(t for t in load_tasks("miss_func") if t.added)
    p = task_prompt(task)
    ((turn, names),) = task.added.items()
    state = BfclState(turn - 1, ((),) * turn)
    listed = {t.name for t in env.tools_for(p, state) if t.listed}
    assert not set(names) & listed
    follow = env.on_answer(p, state, Action(ActionKind.ANSWER, "x", answer="x"))
    assert follow.observation is not None and all(f'"name": "{n}"' in follow.observation for n in names)
    assert follow.state == BfclState(turn, ((),) * (turn + 1))
    assert set(names) <= {t.name for t in env.tools_for(p, follow.state) if t.listed}
    last = BfclState(len(task.user_turns) - 1, ((),) * len(task.user_turns))
    end = env.on_answer(p, last, Action(ActionKind.ANSWER, "x", answer="x"))
    assert end.observation is None and end.reward == 0.0


def test_concurrent_rollouts_do_not_share_state(env: BfclEnv) -> None:
    """Eight threads run episodes of the same task (and of others) at once; each sees exactly what it sees alone."""
    tasks = list(load_tasks("base")[:4]) * 2
    tmpl = PlainTemplate()

    def episode(i: int) -> tuple[list[str], float | None]:
        p = task_prompt(tasks[i])
        turns = env.gold_turns(p, tmpl)
        if i % 2:  # half of them write a file first, which the others must not see
            turns = [tmpl.calls_turn("x", [ToolCall("touch", {"file_name": f"mine_{i}.txt"})]), *turns]
        observations, state = [], env.initial_state(p)
        for text in turns:
            action = tmpl.parse(text, env.tools_for(p, state))
            if action.kind is ActionKind.TOOL:
                res = env.execute(p, state, action)
                observations.append(res.observation)
                state = res.state
            else:
                follow = env.on_answer(p, state, action)
                if follow.observation is None:
                    return observations, follow.reward
                state = follow.state
        return observations, None

    alone = [episode(i) for i in range(len(tasks))]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(episode, range(len(tasks))))
    assert together == alone
    assert all(reward == 1.0 for i, (_, reward) in enumerate(alone) if i % 2 == 0)
    assert bfcl_globals() == []


def test_fork_replay_rebuilds_the_same_state(env: BfclEnv) -> None:
    task = load_tasks("base")[0]
    p, tmpl = task_prompt(task), PlainTemplate()
    s0 = env.initial_state(p)
    mk = env.execute(
        p,
        s0,
        tmpl.parse(tmpl.calls_turn("x", [ToolCall("mkdir", {"dir_name": "fork_a"})]), env.tools_for(p, s0)),
    )
    ls = tmpl.parse(tmpl.calls_turn("x", [ToolCall("ls", {})]), env.tools_for(p, s0))
    first, again = env.execute(p, mk.state, ls), env.execute(p, mk.state, ls)
    assert first == again and "fork_a" in first.observation and first.replayed == 1
    sibling = env.execute(p, s0, ls)  # a branch forked before the mkdir does not see it
    assert "fork_a" not in sibling.observation


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Action: [frobnicate(x=1)]", "unknown tool 'frobnicate'"),
        ("Action: [cd(folder='x', depth=2)]", "unknown argument(s) depth"),
        ("Action: [mv(source='a')]", "needs argument(s) destination"),
        ("Action: [cd(folder='x'), ls(]", "not valid Python call syntax"),
        ("Action: [cd(folder=__import__('os').getcwd())]", "must be literals"),
        ("Action: [cd('a', 'b', 'c')]", "takes at most 1 argument"),
        ("Action: [cd(folder='x')", "not closed with ']'"),
    ],
)
def test_malformed_calls_are_error_observations(env: BfclEnv, text: str, error: str) -> None:
    p = task_prompt(load_tasks("base")[0])
    action = PlainTemplate().parse(text, env.tools_for(p, env.initial_state(p)))
    assert action.kind is ActionKind.INVALID and error in (action.error or "")


def test_malformed_calls_reaching_the_environment_do_not_crash(env: BfclEnv) -> None:
    p = task_prompt(load_tasks("base")[0])
    s0 = env.initial_state(p)
    unknown = env.execute(p, s0, Action(ActionKind.TOOL, "", tool="rm_rf", arguments={}))
    assert unknown.observation.startswith("Error: unknown function 'rm_rf'") and unknown.state == s0
    wrong_type = env.execute(p, s0, Action(ActionKind.TOOL, "", tool="cd", arguments={"folder": 42}))
    assert "Error" in wrong_type.observation
    not_literal = env.execute(p, s0, Action(ActionKind.TOOL, "", tool="cd", arguments={"folder": object()}))
    assert "is not a literal" in not_literal.observation and not_literal.state == s0
    injected_key = env.execute(
        p, s0, Action(ActionKind.TOOL, "", tool="cd", arguments={"folder": "x", "y=__import__('os')": 1})
    )
    assert "unknown argument" in injected_key.observation
    chat = TEMPLATES.get("chat")()
    bad_second = chat.parse(
        '<tool_call>{"name": "ls", "arguments": {}}</tool_call><tool_call>{"name": "cd"', env.tools_for(p, s0)
    )
    assert bad_second.kind is ActionKind.INVALID and "not closed" in (bad_second.error or "")


def test_multi_call_turns_parse_in_both_templates(env: BfclEnv) -> None:
    p = task_prompt(load_tasks("base")[0])
    tools = env.tools_for(p, env.initial_state(p))
    calls = (ToolCall("cd", {"folder": "document"}), ToolCall("mkdir", {"dir_name": "temp"}))
    plain = PlainTemplate().parse("Thought: t\nAction: [cd('document'), mkdir(dir_name='temp')]\n", tools)
    chat = TEMPLATES.get("chat")(None).parse(TEMPLATES.get("chat")(None).calls_turn("", calls), tools)
    assert plain.calls == chat.calls == calls


def test_split_is_seeded_disjoint_and_sized() -> None:
    tasks = [t for c in CATEGORIES for t in load_tasks(c)]
    train, test = split(tasks, seed=0, test_fraction=0.2)
    again = split(tasks, seed=0, test_fraction=0.2)
    other = split(tasks, seed=1, test_fraction=0.2)
    ids = lambda ts: [t.task_id for t in ts]  # noqa: E731
    assert (ids(train), ids(test)) == (ids(again[0]), ids(again[1]))
    assert set(ids(test)) != set(ids(other[1]))
    assert not set(ids(train)) & set(ids(test)) and len(train) + len(test) == len(tasks) == 800
    assert all(sum(t.category == c for t in test) == 40 for c in CATEGORIES)
    cfg = env_config(name="bfcl", bfcl=BfclEnvConfig(num_tasks=1000, eval_tasks=1000))
    cls = env_class("bfcl")
    train_ids = {p.prompt_id for p in cls.prompts(cfg)}
    held = cls.prompts(cfg, held_out=True)
    assert train_ids == set(ids(train)) and {p.prompt_id for p in held} == set(ids(test))
    assert [p.source for p in held[:4]] == [f"bfcl-{c}" for c in sorted(CATEGORIES)]  # categories interleaved


def test_config_rejects_unknown_categories() -> None:
    with pytest.raises(ValueError, match="env.bfcl.categories must be"):
        BfclEnvConfig(categories=["base", "parallel"])


class FakeGoldSampler:
    """Fake sampler: replies to each context with the next gold turn of the task whose prompt it starts with."""

    def __init__(self, tok: Any, scripts: dict[str, list[str]], prompts: dict[str, str]) -> None:
        self.tok, self.scripts, self.prompts = tok, scripts, prompts

    def generate(self, contexts, max_new_tokens, stop, temperature, seeds, caches=None):  # type: ignore[no-untyped-def]
        out = []
        for ctx in contexts:
            text = self.tok.decode(ctx)
            task = next(k for k, start in self.prompts.items() if text.startswith(start))
            turn = self.scripts[task][text.count("Thought:")]
            ids = self.tok(turn, add_special_tokens=False)["input_ids"]
            out.append(
                Generation(ids, [-0.1] * len(ids), self.tok.decode(ids), "stop", prefill_tokens=len(ctx))
            )
        return out


def test_engine_runs_multi_turn_episodes_and_continuations(env: BfclEnv) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained("models/tiny-math", local_files_only=True)
    tmpl = PlainTemplate()
    prompts = [task_prompt(load_tasks(c)[3]) for c in ("base", "miss_func")]
    scripts = {p.prompt_id: env.gold_turns(p, tmpl) for p in prompts}
    starts = {p.prompt_id: tmpl.prompt(p.text, env.tools_for(p, None)) for p in prompts}
    limits = SamplerConfig(
        max_turns=64, max_turn_tokens=4096, max_episode_tokens=100_000, max_context_tokens=1_000_000
    )
    engine = TreeRolloutEngine(FakeGoldSampler(tok, scripts, starts), env, tmpl, tok, limits)
    trees = engine.rollout(prompts, [1, 1])
    for tree, p in zip(trees, prompts):
        (leaf,) = tree.leaves()
        assert leaf.status is Status.ANSWERED and leaf.reward == 1.0
        assert len(tree.path(leaf.node_id)) - 1 == len(scripts[p.prompt_id])
        user_turns = [tree.nodes[i].content for i in tree.path(leaf.node_id)[1:]]
        assert sum("Question:" in c for c in user_turns) == len(env.task(p).user_turns) - 1
    # continue from the middle of the first tree: the replayed state leads to the same reward
    mid = trees[0].path(trees[0].leaves()[0].node_id)[len(scripts[prompts[0].prompt_id]) // 2]
    engine.expand(trees[:1], [Expansion(node_ids=np.array([mid]), counts=np.array([2]), extra_bare=0)])
    assert [leaf.reward for leaf in trees[0].leaves()] == [1.0, 1.0, 1.0]
    assert engine.ledger.tool_calls_replayed > 0 and bfcl_globals() == []


def test_env_is_registered_and_answers_without_state_earn_nothing(env: BfclEnv) -> None:
    assert env_class("bfcl") is BfclEnv and BfclEnv.fork_mode == "replay"
    p = task_prompt(load_tasks("base")[0])
    assert env.reward(p, "anything") == 0.0
    assert isinstance(
        env.on_answer(p, env.initial_state(p), Action(ActionKind.ANSWER, "x", answer="x")), AnswerResult
    )
