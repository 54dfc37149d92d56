"""ReAct turns: pluggable turn templates and a parser that never lets a malformed action end an episode.

A *turn* is one model response: a thought and either a tool call or a final answer. The environment
answers a tool call with an observation, which the template renders into the context before the
next turn. Every malformed action (no action, bad JSON, unknown tool, missing arguments, a runaway
turn, a forged observation) parses to an ``INVALID`` action whose ``error`` becomes the observation,
so the episode goes on and the policy can learn from its mistake.

Templates (registry ``TEMPLATES``):

* ``plain``: the documented format of the built-in tiny policy::

      Question: <task>
      Thought: <reasoning>
      Action: python[<code>]            (or  Action: <tool>{"arg": ...}  for keyword arguments)
      Observation: <tool output>
      Thought: ...
      Final Answer: <answer>

  Generation stops at ``Observation:`` (the model never writes observations; if it tries, the text
  from the forged marker on is dropped and flagged).
* ``chat``: the model's own chat template with native tool calls (Qwen3: ``<think>...</think>`` then
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; observations as ``tool`` messages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from tracerl.registry import Registry


@dataclass(frozen=True)
class ToolSpec:
    """A tool the agent may call."""

    name: str
    description: str
    parameters: tuple[str, ...]
    """Argument names; the first is the one ``NAME[...]`` fills."""
    required: tuple[str, ...] = ()

    def as_json_schema(self) -> dict[str, Any]:
        """OpenAI/Qwen-style function schema for chat templates."""
        props = {p: {"type": "string"} for p in self.parameters}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": {"type": "object", "properties": props,
                                                                "required": list(self.required or self.parameters[:1])}}}


class ActionKind(str, Enum):
    TOOL = "tool"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass(frozen=True)
class Action:
    """A parsed turn."""

    kind: ActionKind
    text: str
    """The turn text as kept in the history (a forged observation is cut off)."""
    tool: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    answer: str | None = None
    error: str | None = None
    """For INVALID: the error observation shown to the agent."""


class TurnTemplate(Protocol):
    name: str
    stop: tuple[str, ...]

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str: ...

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action: ...

    def observation(self, text: str) -> str: ...


TEMPLATES: Registry = Registry("turn template")


def _check_tool(name: str, args: Mapping[str, Any], tools: Sequence[ToolSpec]) -> str | None:
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        return f"Error: unknown tool '{name}'; available: {', '.join(t.name for t in tools)}."
    missing = [p for p in (spec.required or spec.parameters[:1]) if p not in args or args[p] in (None, "")]
    if missing:
        return f"Error: tool '{name}' needs argument(s) {', '.join(missing)}."
    unknown = [k for k in args if k not in spec.parameters]
    if unknown:
        return f"Error: tool '{name}' got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(spec.parameters)}."
    return None


def _runaway(limit_note: str) -> str:
    return f"Error: the turn ran past its token limit ({limit_note}) without a complete action. Keep turns short."


@TEMPLATES.register("plain")
class PlainTemplate:
    """The documented plain ReAct format (see the module docstring)."""

    name = "plain"
    stop: tuple[str, ...] = ("Observation:",)

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer  # unused: the plain format is fixed
    _ACTION = re.compile(r"Action:\s*([A-Za-z_][\w\-]*)\s*([\[{])", re.S)
    _ANSWER = re.compile(r"Final Answer:(.*)", re.S)

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        return f"Question: {question.strip()}\n"

    def observation(self, text: str) -> str:
        return f"Observation: {text.strip()}\n"

    @staticmethod
    def tool_turn(thought: str, tool: str, argument: str) -> str:
        """A well-formed tool-call turn (for rendering supervised traces)."""
        return f"Thought: {thought}\nAction: {tool}[{argument}]\n"

    @staticmethod
    def answer_turn(thought: str, answer: str) -> str:
        """A well-formed final-answer turn."""
        return f"Thought: {thought}\nFinal Answer: {answer}\n"

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action:
        forged = text.find("Observation:")
        if forged >= 0:  # the sampler should have stopped here: drop what the model made up
            text = text[:forged]
        kept = text.rstrip() + "\n"
        if truncated:
            return Action(ActionKind.INVALID, kept, error=_runaway("per-turn limit"))
        m = self._ACTION.search(text)
        a = self._ANSWER.search(text)
        if a and (not m or a.start() < m.start()):
            answer = a.group(1).strip().splitlines()[0].strip() if a.group(1).strip() else ""
            if not answer:
                return Action(ActionKind.INVALID, kept, error="Error: 'Final Answer:' must be followed by the answer.")
            return Action(ActionKind.ANSWER, kept, answer=answer)
        if not m:
            return Action(ActionKind.INVALID, kept, error="Error: end the turn with 'Action: tool[input]' or 'Final Answer: ...'.")
        name, opener = m.group(1), m.group(2)
        body = text[m.end():]
        closer = "]" if opener == "[" else "}"
        end = body.rfind(closer)
        if end < 0:
            return Action(ActionKind.INVALID, kept, error=f"Error: the action's input is not closed with '{closer}'.")
        raw = body[:end]
        spec = next((t for t in tools if t.name == name), None)
        if opener == "[":
            args: dict[str, Any] = {spec.parameters[0]: raw.strip()} if spec else {"input": raw}
        else:
            try:
                parsed = json.loads("{" + raw + "}")
            except json.JSONDecodeError as exc:
                return Action(ActionKind.INVALID, kept, error=f"Error: the arguments are not valid JSON ({exc.msg}).")
            if not isinstance(parsed, dict):
                return Action(ActionKind.INVALID, kept, error="Error: the arguments must be a JSON object.")
            args = parsed
        err = _check_tool(name, args, tools)
        if err:
            return Action(ActionKind.INVALID, kept, tool=name, arguments=args, error=err)
        return Action(ActionKind.TOOL, kept, tool=name, arguments=args)


@TEMPLATES.register("chat")
class ChatTemplate:
    """Native tool calls in the model's own chat template (Qwen3 ``<tool_call>`` JSON, ``<think>`` blocks).

    With a tokenizer that has a chat template, the prompt is that template's rendering of the user
    message with the tool schemas, and an observation is the text the template puts between the end
    of an assistant turn and the start of the next one around a ``tool`` message (a rendered delta).
    Without one, the ChatML text Qwen-family templates produce is written directly.
    """

    name = "chat"
    stop: tuple[str, ...] = ("<tool_response>", "<|im_end|>", "<|im_start|>")
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", re.S)

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer if getattr(tokenizer, "chat_template", None) else None

    def _render(self, messages: list[dict[str, str]], tools: Sequence[ToolSpec] = (), gen: bool = False) -> str:
        assert self.tokenizer is not None
        schemas = [t.as_json_schema() for t in tools] or None
        return str(self.tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=gen, tokenize=False))

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        if self.tokenizer is not None:
            return self._render([{"role": "user", "content": question.strip()}], tools, gen=True)
        specs = "\n".join(json.dumps(t.as_json_schema()) for t in tools)
        system = ("<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  f"<tools>\n{specs}\n</tools>\n\nFor each function call, return a json object with function name and "
                  "arguments within <tool_call></tool_call> XML tags.<|im_end|>\n")
        return system + f"<|im_start|>user\n{question.strip()}<|im_end|>\n<|im_start|>assistant\n"

    def observation(self, text: str) -> str:
        if self.tokenizer is not None:
            marker = "\x00ASSISTANT\x00"
            conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
            before = self._render(conv)
            after = self._render([*conv, {"role": "tool", "content": text.strip()}], gen=True)
            if after.startswith(before):
                # The sampler stops before the assistant's end-of-turn marker, so the delta starts with it.
                return before[before.index(marker) + len(marker):] + after[len(before):]
        return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text.strip()}\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n")

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action:
        for marker in ("<tool_response>", "<|im_start|>"):
            cut = text.find(marker)
            if cut >= 0:
                text = text[:cut]
        kept = text.replace("<|im_end|>", "").rstrip()
        if truncated:
            return Action(ActionKind.INVALID, kept, error=_runaway("per-turn limit"))
        visible = re.sub(r"<think>.*?(</think>|$)", "", kept, flags=re.S).strip()
        m = self._CALL.search(visible)
        if not m:
            if not visible:
                return Action(ActionKind.INVALID, kept, error="Error: empty response; call a tool or give the final answer.")
            from_boxed = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", visible)
            return Action(ActionKind.ANSWER, kept, answer=from_boxed[-1] if from_boxed else visible)
        if not m.group(2):
            return Action(ActionKind.INVALID, kept, error="Error: <tool_call> is not closed with </tool_call>.")
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError as exc:
            return Action(ActionKind.INVALID, kept, error=f"Error: the tool call is not valid JSON ({exc.msg}).")
        if not isinstance(call, dict) or "name" not in call:
            return Action(ActionKind.INVALID, kept, error='Error: a tool call must be {"name": ..., "arguments": {...}}.')
        args = call.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return Action(ActionKind.INVALID, kept, error="Error: 'arguments' must be a JSON object.")
        if not isinstance(args, dict):
            return Action(ActionKind.INVALID, kept, error="Error: 'arguments' must be a JSON object.")
        err = _check_tool(str(call["name"]), args, tools)
        if err:
            return Action(ActionKind.INVALID, kept, tool=str(call["name"]), arguments=args, error=err)
        return Action(ActionKind.TOOL, kept, tool=str(call["name"]), arguments=args)
