"""Property tests (issue 13, "Fuzzing"): arbitrary model text at both templates' parsers and every environment's
action handling, arbitrary dotted overrides at config loading. Nothing raises but the documented error types:
parsing and tool execution never raise, grading raises only ``GradeTimeout``, config loading only ``ConfigError``.

The text mixes hypothesis' own strings with the fragments that broke things (lone surrogates, deep nesting, long
numbers, NUL bytes, markers of both templates). ``deadline=None`` and few examples: these exercise real sandboxes,
indexes and BFCL backends on a shared 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import require_bfcl
from tracerl.config import TrainConfig, env_config
from tracerl.config_loader import ConfigError, compose, to_flat_dict
from tracerl.engine.react import Action, ActionKind, ChatTemplate, PlainTemplate, ToolCall, ToolSpec
from tracerl.envs.search.config import SearchEnvConfig
from tracerl.grading import GradeTimeout
from tracerl.types import Prompt

ROOT = Path(__file__).resolve().parents[1]
FRAGMENTS = [
    "Action:",
    "Action: python{",
    "Action: search[",
    "Action: [",
    "Final Answer:",
    "Observation:",
    "Thought: ",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|im_start|>",
    "<tool_response>",
    '{"name": "python", "arguments": ',
    '{"name": "search", "arguments": {"query": ',
    '"code": ',
    '"query": ',
    "cd(folder=",
    "ls(",
    "python(code=",
    "\\ud800",
    "\\udfff",
    '"\\ud83d"',
    "\\u00",
    "\\",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "'",
    '"',
    ",",
    "=",
    ":",
    "\n",
    "\x00",
    "1" * 5000,
    "-" * 300,
    "9^{9^{9^{9^9}}}",
    "\\boxed{",
    "nan",
    "1e999",
]
_SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
_NESTED = st.tuples(st.sampled_from("[{("), st.integers(0, 3000)).map(lambda t: t[0] * t[1])
PIECES = st.one_of(st.text(max_size=40), st.sampled_from(FRAGMENTS), _SURROGATE, _NESTED)
MODEL_TEXT = st.lists(PIECES, max_size=12).map("".join)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30), _SURROGATE),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
SCALE = float(os.environ.get("TRACERL_FUZZ_SCALE", "1"))
"""Multiplies every max_examples (a longer fuzzing session: TRACERL_FUZZ_SCALE=10)."""
FUZZ = settings(
    deadline=None,
    max_examples=int(60 * SCALE),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TOOLS = [
    ToolSpec("python", "Run code.", ("code",)),
    ToolSpec("search", "Search.", ("query",)),
    ToolSpec("cd", "Change folder.", ("folder",), schema={"type": "object", "properties": {"folder": {}}}),
]


def _encodable(*texts: Any) -> bool:
    for t in texts:
        if isinstance(t, str):
            t.encode("utf-8")
    return True


def _check_action(a: Action) -> None:
    assert isinstance(a.kind, ActionKind)
    assert _encodable(a.text, a.tool, a.answer, a.error)
    if a.kind is ActionKind.INVALID:
        assert a.error and a.error.startswith("Error:")
    for c in a.calls:
        assert _encodable(c.tool, *map(str, c.arguments), *map(repr, c.arguments.values()))


@FUZZ
@example(text='Action: python{"code": ' + "[" * 1000 + "]" * 1000 + "}", truncated=False)
@example(text='<tool_call>{"name": "\\ud800", "arguments": {"\\udfff": 1}}</tool_call>', truncated=False)
@example(text="Action: [python(code=" + "1" * 5000 + ")]", truncated=False)
@given(text=MODEL_TEXT, truncated=st.booleans())
def test_both_parsers_turn_any_text_into_an_action(text: str, truncated: bool) -> None:
    for template in (PlainTemplate(), ChatTemplate()):
        action = template.parse(text, TOOLS, truncated=truncated)
        _check_action(action)
        if action.kind is ActionKind.INVALID:
            _encodable(template.observation(action.error or ""))


def _math() -> Any:
    from tracerl.envs.math.env import MathEnv

    return MathEnv(reward_timeout_s=2.0), Prompt("m", "What is 3?", "3")


def _search() -> Any:
    from tracerl.envs.search.env import SearchEnv

    env = SearchEnv.from_config(
        env_config(name="search", search=SearchEnvConfig(reward="f1"), reward_timeout_s=2.0)
    )
    return env, Prompt("s", "Who?", '["Ada Lovelace"]')


def _bfcl() -> Any:
    require_bfcl()
    from tracerl.envs.bfcl.env import BfclEnv, task_prompt

    env = BfclEnv(("base",), reward_timeout_s=2.0)
    task = next(t for t in env.tasks.values() if "GorillaFileSystem" in t.entry["involved_classes"])
    return env, task_prompt(task)


ENVS = {"math": _math, "search": _search, "bfcl": _bfcl}
EXAMPLES = {"math": 12, "search": 60, "bfcl": 30}  # math runs a sandboxed process per call


@pytest.fixture(scope="module", params=sorted(ENVS))
def env_and_prompt(request: pytest.FixtureRequest) -> tuple[str, Any, Prompt]:
    env, prompt = ENVS[request.param]()
    return request.param, env, prompt


def _tools(env: Any, prompt: Prompt, state: Any) -> Any:
    hook = getattr(env, "tools_for", None)
    return env.tools if hook is None else hook(prompt, state)


def test_every_environment_handles_any_parsed_action_and_any_answer(
    env_and_prompt: tuple[str, Any, Prompt],
) -> None:
    name, env, prompt = env_and_prompt

    @settings(FUZZ, max_examples=int(EXAMPLES[name] * SCALE))
    @given(text=MODEL_TEXT, plain=st.booleans())
    def parsed(text: str, plain: bool) -> None:
        state = env.initial_state(prompt)
        template = PlainTemplate() if plain else ChatTemplate()
        action = template.parse(text, _tools(env, prompt, state))
        _check_action(action)
        if action.kind is ActionKind.TOOL:
            res = env.execute(prompt, state, action)
            assert isinstance(res.observation, str) and _encodable(res.observation)
        elif action.kind is ActionKind.ANSWER:
            _grade(env, prompt, state, action)

    @settings(FUZZ, max_examples=int(EXAMPLES[name] * SCALE))
    @given(
        tool=st.one_of(
            st.sampled_from([t.name for t in _tools(env, prompt, env.initial_state(prompt))]),
            st.text(max_size=10),
        ),
        arguments=st.dictionaries(st.one_of(st.text(max_size=10), _SURROGATE), VALUES, max_size=3),
    )
    def direct(tool: str, arguments: dict[str, Any]) -> None:
        # Any call another parser (or a user's template) could hand over, parsed or not.
        state = env.initial_state(prompt)
        action = Action(
            ActionKind.TOOL,
            "",
            tool=tool,
            arguments=arguments,
            more_calls=(ToolCall(tool, arguments),) if name == "bfcl" else (),
        )
        res = env.execute(prompt, state, action)
        assert isinstance(res.observation, str)

    parsed()
    direct()


def _grade(env: Any, prompt: Prompt, state: Any, action: Action) -> None:
    """An answer is graded to a reward in [0, 1], or the grade times out (``GradeTimeout``): nothing else."""
    try:
        hook = getattr(env, "on_answer", None)
        follow = hook(prompt, state, action) if hook is not None else None
        reward = (
            env.reward(prompt, action.answer) if follow is None or follow.reward is None else follow.reward
        )
    except GradeTimeout:
        return
    assert follow is not None and follow.observation is not None or 0.0 <= reward <= 1.0


_FLAT = sorted(to_flat_dict(TrainConfig()))
_KEYS = st.one_of(
    st.sampled_from(_FLAT),  # real keys with hostile values
    st.sampled_from(["allocator", "predictor", "budget", "sampler", "model", "env", "env.math", "tracking"]),
    st.lists(st.one_of(st.sampled_from(_FLAT), st.text(max_size=8)), min_size=1, max_size=4).map(".".join),
    st.text(max_size=20),
)
_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "null",
            "~",
            "true",
            "off",
            "-1",
            "0",
            "1e9",
            "nan",
            ".inf",
            "[1, 2]",
            "{a: 1}",
            "[",
            "{",
            "'",
            "&a [*a]",
            "*a",
            "!!python/object:os.system",
            "2001-12-14",
            "0x1F",
            "!!binary AAAA",
            "\ud800",
            "a: b: c",
            "- x",
            "grpo",
            "trace",
            "[" * 5000,
            "{a: " * 2000,
        ]
    ),
    _NESTED,
)


@settings(deadline=None, max_examples=int(60 * SCALE))
@example(items=["budget.num_roots=" + "[" * 5000])  # found by this test: RecursionError from PyYAML
@example(items=["budget.num_roots=" + "[" * 150 + "]" * 150])  # found by it: RecursionError in OmegaConf
@example(items=["allocator=" + "[" * 251])  # found by this test: OSError, file name too long
@example(items=["k" * 300 + "=1", "allocator=a/b", "allocator=\x00"])
@given(items=st.lists(st.tuples(_KEYS, st.sampled_from(["=", "", "=="]), _VALUES).map("".join), max_size=3))
def test_config_overrides_fail_only_with_config_error(items: list[str]) -> None:
    try:
        cfg = compose(TrainConfig, ROOT / "conf" / "train" / "smoke.yaml", items)
    except ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(cfg, TrainConfig)
