"""Hostile actions (issue 13, items 2 and 3): unencodable, deeply nested and oversized actions through both templates
and all three environments are error observations (or clean calls), never exceptions, and everything the engine
encodes is encodable by the real tokenizer.

The turns are replayed by the gold-replay ``ScriptedSampler`` (a real component) with the committed tiny model's
tokenizer; the environments are the real ones (math runs the sandbox, search the BM25 index, BFCL its backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.conftest import require_bfcl
from tracerl.config import SamplerConfig, env_config
from tracerl.engine.react import ActionKind, ChatTemplate, PlainTemplate, ToolSpec
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.engine.untrusted import MAX_ACTION_CHARS, MAX_ARGUMENT_DEPTH
from tracerl.envs.search.config import SearchEnvConfig
from tracerl.samplers.scripted import ScriptedSampler
from tracerl.types import Prompt, Status

TOK_DIR = Path(__file__).resolve().parents[1] / "models" / "tiny-math"
PY = [ToolSpec("python", "Run code.", ("code",))]
DEEP = "[" * 1000 + "]" * 1000
HUGE = "x" * (MAX_ACTION_CHARS + 10)
LONG_INT = "1" * 5000


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(TOK_DIR)


def _call(template: str, name: str, args_json: str) -> str:
    """A tool-call turn; ``args_json`` is the arguments object as JSON text (escapes kept verbatim)."""
    if template == "plain":
        return f"Thought: t\nAction: {name}{args_json}\n"
    return f'<tool_call>{{"name": "{name}", "arguments": {args_json}}}</tool_call>'


def _answer(template: str, text: str) -> str:
    return f"Thought: t\nFinal Answer: {text}\n" if template == "plain" else text


# (turn, error substring or None for a call that runs with its strings cleaned)
HOSTILE: dict[str, list[tuple[str, str | None]]] = {
    "plain": [
        ('Action: python{"code": "1", "\\ud800": 1}', "unknown argument(s) \ufffd"),
        ("Action: [python(code='\\udfff')]", None),
        ('Action: python{"code": ' + DEEP + "}", "nested too deeply"),
        ('Action: python{"code": ' + "[" * 100 + "]" * 100 + "}", f"more than {MAX_ARGUMENT_DEPTH} levels"),
        ("Action: [python(code=" + DEEP + ")]", "not valid Python call syntax"),
        ("Action: [python(code=" + "-" * 5000 + "1)]", "not valid Python call syntax"),
        ('Action: python{"code": "' + HUGE + '"}', f"the limit is {MAX_ACTION_CHARS}"),
        ('Action: python{"code": ' + LONG_INT + "}", "not valid JSON"),
        ("Action: [python(code=" + LONG_INT + ")]", "not valid Python call syntax"),
        ("Action: [python(code='\x00')]", "null bytes"),
    ],
    "chat": [
        ('<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>', "unknown tool '\ufffd'"),
        (
            '<tool_call>{"name": "python", "arguments": {"\\udc00": "x"}}</tool_call>',
            "needs argument(s) code",
        ),
        ('<tool_call>{"name": "python", "arguments": {"code": "\\ud800"}}</tool_call>', None),
        (
            '<tool_call>{"name": "python", "arguments": {"code": ' + DEEP + "}}</tool_call>",
            "nested too deeply",
        ),
        (
            '<tool_call>{"name": "python", "arguments": "' + "[" * 40 + "]" * 40 + '"}</tool_call>',
            "JSON object",
        ),
        ('<tool_call>{"name": ' + DEEP + "}</tool_call>", "nested too deeply"),
        ('<tool_call>{"name": ["python"], "arguments": {}}</tool_call>', '{"name": ..., "arguments"'),
        ('<tool_call>{"name": "python", "arguments": {"code": "' + HUGE + '"}}</tool_call>', "the limit is"),
        (
            '<tool_call>{"name": "python", "arguments": {"code": ' + LONG_INT + "}}</tool_call>",
            "not valid JSON",
        ),
    ],
}


def _encodes(tok: Any, text: str) -> bool:
    text.encode("utf-8")
    return len(tok(text, add_special_tokens=False)["input_ids"]) > 0


@pytest.mark.parametrize("name", ["plain", "chat"])
def test_hostile_actions_parse_to_encodable_error_observations(tok: Any, name: str) -> None:
    template = PlainTemplate() if name == "plain" else ChatTemplate(tok)
    for turn, error in HOSTILE[name]:
        action = template.parse(turn, PY)
        if error is None:
            assert action.kind is ActionKind.TOOL, (turn[:60], action.error)
            assert all(_encodes(tok, str(v)) for v in action.arguments.values())
        else:
            assert action.kind is ActionKind.INVALID and action.error is not None, turn[:60]
            assert error in action.error, (turn[:60], action.error)
            assert _encodes(tok, template.observation(action.error))
        assert _encodes(tok, action.text + (action.tool or ""))


def _bfcl_env() -> Any:
    require_bfcl()
    from tracerl.envs.bfcl.env import BfclEnv, task_prompt

    env = BfclEnv(("base",))
    task = next(t for t in env.tasks.values() if "GorillaFileSystem" in t.entry["involved_classes"])
    return env, task_prompt(task), "cd", "folder", len(task.user_turns)


def _env(kind: str) -> tuple[Any, Prompt, str, str, int]:
    """An environment, one of its prompts, a tool and its string argument, and the user turns of the prompt."""
    if kind == "math":
        from tracerl.envs.math.env import MathEnv

        return MathEnv(), Prompt("m", "What is 3?", "3"), "python", "code", 1
    if kind == "search":
        from tracerl.envs.search.env import SearchEnv

        env = SearchEnv.from_config(env_config(name="search", search=SearchEnvConfig(reward="em")))
        return env, Prompt("s", "Who?", "Ada"), "search", "query", 1
    return _bfcl_env()  # type: ignore[no-any-return]


@pytest.mark.parametrize("template_name", ["plain", "chat"])
@pytest.mark.parametrize("kind", ["math", "search", "bfcl"])
def test_hostile_turns_through_every_environment_end_in_a_leaf(
    tok: Any, kind: str, template_name: str
) -> None:
    env, prompt, tool, arg, user_turns = _env(kind)
    template = PlainTemplate() if template_name == "plain" else ChatTemplate(tok)
    hostile = [  # invalid: a surrogate key, too deep, oversized; valid: surrogates in the value (cleaned, run)
        _call(template_name, tool, '{"\\ud800": "x"}'),
        _call(template_name, tool, '{"' + arg + '": ' + DEEP + "}"),
        _call(template_name, tool, '{"' + arg + '": "' + HUGE + '"}'),
        _call(template_name, tool, '{"' + arg + '": "\\ud800\\udfff"}'),
        _call(template_name, "nope\\ud800" if template_name == "chat" else "nope", "{}"),
    ]
    turns = hostile + [_answer(template_name, "3")] * user_turns
    sampler = ScriptedSampler(tok)
    tools = getattr(env, "tools_for", lambda p, s: env.tools)(prompt, env.initial_state(prompt))
    sampler.add_script(template.prompt(prompt.text, tools), turns)
    big = 10**7
    engine = TreeRolloutEngine(
        sampler,
        env,
        template,
        tok,
        SamplerConfig(
            max_turns=len(turns), max_turn_tokens=big, max_episode_tokens=big, max_context_tokens=big
        ),
    )
    (tree,) = engine.rollout([prompt], [1])
    leaf = tree.leaves()[0]
    assert leaf.status is Status.ANSWERED and sampler.misses == 0
    assert engine.ledger.invalid_actions == 4 and engine.ledger.tool_calls >= 1
    for node in tree.nodes[1:]:
        node.content.encode("utf-8")  # stored and echoed text is encodable
    ran = tree.nodes[4].content  # the call whose surrogates were cleaned ran and its observation came back
    assert "\ud800" not in ran and "Error: the action" not in ran
