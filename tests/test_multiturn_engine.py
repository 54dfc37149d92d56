"""The engine's multi-turn and multi-call extensions without any real environment package.

``EchoDesk`` is a fake environment (the unit under test is the engine and the templates): two user turns, a
per-task tool list that grows at the second turn, calls recorded in the state, reward 1 when the recorded calls
are the expected ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tracerl.algos.allocators import Expansion
from tracerl.config import SamplerConfig
from tracerl.engine.protocol import AnswerResult, ToolEnv, ToolResult
from tracerl.engine.react import TEMPLATES, Action, ActionKind, PlainTemplate, ToolCall, ToolSpec
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.samplers.scripted import ByteTokenizer, ScriptedSampler
from tracerl.types import Prompt, Status

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
ECHO = ToolSpec("echo", "Echo a text.", ("text",), ("text",), schema=SCHEMA)
SHOUT = ToolSpec("shout", "Echo a text in capitals.", ("text",), ("text",), schema=SCHEMA)


class EchoDesk(ToolEnv):
    """Fake two-turn environment: turn 0 offers echo, turn 1 adds shout."""

    fork_mode = "replay"
    tools = (ECHO,)

    def tools_for(self, prompt: Prompt, state: Any) -> list[ToolSpec]:
        turn = state[0] if state else 0
        return [ECHO, SHOUT if turn else replace(SHOUT, listed=False)]

    def initial_state(self, prompt: Prompt) -> tuple[int, tuple[str, ...]]:
        return (0, ())

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        out = [
            str(c.arguments["text"]).upper() if c.tool == "shout" else str(c.arguments["text"])
            for c in action.calls
        ]
        return ToolResult(
            " | ".join(out), (state[0], (*state[1], *(c.tool for c in action.calls))), calls=len(out)
        )

    def on_answer(self, prompt: Prompt, state: Any, action: Action) -> AnswerResult:
        if state[0] == 0:
            return AnswerResult(observation="Now shout it.", state=(1, state[1]))
        return AnswerResult(reward=1.0 if state[1] == ("echo", "echo", "shout") else 0.0)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        raise AssertionError("a multi-turn episode is scored by on_answer")


SCRIPT = [
    "Thought: two echoes\nAction: [echo('a'), echo(text='b')]\n",
    "Thought: ok\nFinal Answer: done\n",
    "Thought: now shout\nAction: [shout(text='c')]\n",
    "Thought: ok\nFinal Answer: done\n",
]


def _engine(script: list[str]) -> tuple[TreeRolloutEngine, Prompt]:
    env, tok, tmpl = EchoDesk(), ByteTokenizer(), PlainTemplate()
    prompt = Prompt("t0", "Echo a and b.")
    sampler = ScriptedSampler(tok)
    sampler.add_script(tmpl.prompt(prompt.text, env.tools_for(prompt, None)), script)
    limits = SamplerConfig(
        max_turns=10, max_turn_tokens=10_000, max_episode_tokens=100_000, max_context_tokens=1_000_000
    )
    return TreeRolloutEngine(sampler, env, tmpl, tok, limits), prompt


def test_user_turns_come_from_on_answer_and_the_last_one_is_scored() -> None:
    engine, prompt = _engine(SCRIPT)
    (tree,) = engine.rollout([prompt], [1])
    (leaf,) = tree.leaves()
    assert leaf.status is Status.ANSWERED and leaf.reward == 1.0
    contents = [tree.nodes[i].content for i in tree.path(leaf.node_id)[1:]]
    assert contents[0].endswith("Observation: a | b\n") and contents[1].endswith("Question: Now shout it.\n")
    assert engine.ledger.tool_calls == 3 and engine.ledger.invalid_actions == 0
    # a continuation from the user-message node resumes in the second turn with its state and tools
    engine.expand(
        [tree],
        [Expansion(node_ids=np.array([tree.path(leaf.node_id)[2]]), counts=np.array([1]), extra_bare=0)],
    )
    assert [lf.reward for lf in tree.leaves()] == [1.0, 1.0]


def test_unlisted_tools_run_but_are_not_shown() -> None:
    env, tmpl = EchoDesk(), PlainTemplate()
    prompt = Prompt("t0", "Echo.")
    shown = tmpl.prompt(prompt.text, env.tools_for(prompt, None))
    assert '"name": "echo"' in shown and "shout" not in shown
    early = tmpl.parse("Action: [shout(text='x')]", env.tools_for(prompt, None))
    assert early.kind is ActionKind.TOOL and early.calls == (ToolCall("shout", {"text": "x"}),)
    bad = tmpl.parse("Action: [whisper(text='x')]", env.tools_for(prompt, None))
    assert bad.kind is ActionKind.INVALID and "available: echo." in (bad.error or "")


def test_templates_render_user_messages_and_multi_call_turns() -> None:
    chat = TEMPLATES.get("chat")()
    assert (
        chat.user_message("next") == "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )
    assert PlainTemplate().user_message(" next ") == "Question: next\n"
    calls = (ToolCall("echo", {"text": "a"}), ToolCall("shout", {"text": "b"}))
    parsed = chat.parse(chat.calls_turn("", calls), [ECHO, SHOUT])
    assert parsed.kind is ActionKind.TOOL and parsed.calls == calls and parsed.tool == "echo"
    # a single call is the same Action as before the multi-call extension
    single = chat.parse('<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>', [ECHO])
    assert single == Action(ActionKind.TOOL, single.text, tool="echo", arguments={"text": "a"})
    # undocumented tools keep the plain prompt unchanged
    assert PlainTemplate().prompt("Q?", [ToolSpec("python", "Run code.", ("code",))]) == "Question: Q?\n"
