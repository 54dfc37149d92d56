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
  from the forged marker on is dropped and flagged). Several calls in one turn, python-style (BFCL's
  format): ``Action: [cd(folder='docs'), ls()]`` (literal values only; positional arguments bind in the
  tool's parameter order). Documented tools (``ToolSpec.schema``) are listed before the question.
* ``chat``: the model's own chat template with native tool calls (Qwen3: ``<think>...</think>`` then
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; observations as ``tool`` messages).
  Several ``<tool_call>`` blocks in one turn are several calls (any malformed block makes the turn invalid).

A TOOL action carries its calls in ``Action.calls`` (the first also in ``tool``/``arguments``). A multi-turn
environment's next user message is rendered by ``user_message`` (plain: a new ``Question:`` line).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from tracerl.engine.untrusted import (
    MAX_ARGUMENT_DEPTH,
    TooDeep,
    clean,
    encodable,
    json_error,
    oversized,
)
from tracerl.registry import Registry


@dataclass(frozen=True)
class ToolSpec:
    """A tool the agent may call."""

    name: str
    description: str
    parameters: tuple[str, ...]
    """Argument names; the first is the one ``NAME[...]`` fills."""
    required: tuple[str, ...] = ()
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    """The JSON schema of the parameters (typed, documented) where the environment has one; None: all strings.
    Tools with a schema are documented tools: the plain template lists them in the prompt."""
    listed: bool = True
    """Shown to the policy; an unlisted tool still parses and runs (BFCL's held-out functions before their turn
    can be called, as in BFCL's own executor, but are not documented yet)."""

    def as_json_schema(self) -> dict[str, Any]:
        """OpenAI/Qwen-style function schema for chat templates."""
        if self.schema is not None:
            return {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": dict(self.schema),
                },
            }
        props = {p: {"type": "string"} for p in self.parameters}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": props,
                    "required": list(self.required or self.parameters[:1]),
                },
            },
        }


class ActionKind(str, Enum):
    TOOL = "tool"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass(frozen=True)
class ToolCall:
    """One function call of a turn."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """A parsed turn: a TOOL turn carries one or more calls (the first in ``tool``/``arguments``)."""

    kind: ActionKind
    text: str
    """The turn text as kept in the history (a forged observation is cut off)."""
    tool: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    answer: str | None = None
    error: str | None = None
    """For INVALID: the error observation shown to the agent."""
    more_calls: tuple[ToolCall, ...] = ()
    """Calls after the first one, in the order written (a turn may call several functions)."""

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """Every call of a TOOL turn, in order (empty for other kinds)."""
        if self.kind is not ActionKind.TOOL or self.tool is None:
            return ()
        return (ToolCall(self.tool, self.arguments), *self.more_calls)


class TurnTemplate(Protocol):
    name: str
    stop: tuple[str, ...]

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str: ...

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action: ...

    def observation(self, text: str) -> str: ...

    def user_message(self, text: str) -> str:
        """The next user message of a multi-turn task (delivered by the environment), as context text."""
        ...


TEMPLATES: Registry = Registry("turn template")


def _safe(action: Action) -> Action:
    """``action`` with every string encodable; a call whose arguments nest too deeply makes it INVALID."""
    try:
        calls = tuple(ToolCall(encodable(c.tool), clean(c.arguments)) for c in action.more_calls)
        arguments = clean(action.arguments)
    except TooDeep:
        return Action(
            ActionKind.INVALID,
            encodable(action.text),
            error=f"Error: the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep.",
        )
    return Action(
        action.kind,
        encodable(action.text),
        tool=None if action.tool is None else encodable(action.tool),
        arguments=arguments,
        answer=None if action.answer is None else encodable(action.answer),
        error=None if action.error is None else encodable(action.error),
        more_calls=calls,
    )


def _check_tool(name: str, args: Mapping[str, Any], tools: Sequence[ToolSpec]) -> str | None:
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        return f"Error: unknown tool '{name}'; available: {', '.join(t.name for t in tools if t.listed)}."
    # Undocumented tools require their first parameter unless told otherwise; documented ones say exactly.
    required = spec.required if spec.schema is not None else (spec.required or spec.parameters[:1])
    missing = [p for p in required if p not in args or (spec.schema is None and args[p] in (None, ""))]
    if missing:
        return f"Error: tool '{name}' needs argument(s) {', '.join(missing)}."
    unknown = [k for k in args if k not in spec.parameters]
    if unknown:
        return f"Error: tool '{name}' got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(spec.parameters)}."
    return None


def parse_call_list(source: str, tools: Sequence[ToolSpec]) -> tuple[list[ToolCall], str | None]:
    """Python-style calls ``[f(a=1, b='x'), g(2)]`` (BFCL's format; a single call needs no brackets).

    Argument values must be literals (strings, numbers, booleans, None, lists, dicts, tuples); positional
    arguments take the tool's parameter names in order. Nothing is evaluated.

    Returns:
        The calls, and None; or the calls parsed so far and the error observation for the first bad one.
    """
    too_long = oversized(source)
    if too_long:
        return [], too_long
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        return [], f"Error: the function calls are not valid Python call syntax ({exc.msg})."
    except (ValueError, MemoryError, RecursionError):  # NUL bytes, a too long int literal, too deep to parse
        return (
            [],
            "Error: the function calls are not valid Python call syntax (too deep, too long or NUL bytes).",
        )
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls: list[ToolCall] = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return calls, "Error: write each call as name(arg=value, ...) inside [...], separated by commas."
        name = node.func.id
        spec = next((t for t in tools if t.name == name), None)
        if spec is None:
            return (
                calls,
                f"Error: unknown tool '{name}'; available: {', '.join(t.name for t in tools if t.listed)}.",
            )
        if len(node.args) > len(spec.parameters):
            return (
                calls,
                f"Error: tool '{name}' takes at most {len(spec.parameters)} argument(s) ({', '.join(spec.parameters)}).",
            )
        try:
            args = {p: ast.literal_eval(v) for p, v in zip(spec.parameters, node.args)}
            for kw in node.keywords:
                if kw.arg is None:
                    return calls, f"Error: tool '{name}': write arguments as name=value (no **kwargs)."
                if kw.arg in args:
                    return calls, f"Error: tool '{name}' got argument '{kw.arg}' twice."
                args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return calls, (
                f"Error: tool '{name}': argument values must be literals "
                "(strings, numbers, True/False/None, lists, dicts)."
            )
        err = _check_tool(name, args, tools)
        if err:
            return calls, err
        calls.append(ToolCall(name, args))
    if not calls:
        return calls, "Error: the call list is empty; call a function or give the final answer."
    return calls, None


def _documented(tools: Sequence[ToolSpec]) -> bool:
    return any(t.schema is not None for t in tools)


def _tool_action(kept: str, calls: Sequence[ToolCall]) -> Action:
    first, *rest = calls
    return Action(ActionKind.TOOL, kept, tool=first.tool, arguments=first.arguments, more_calls=tuple(rest))


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
    _CALLS = re.compile(r"Action:\s*\[", re.S)
    _ANSWER = re.compile(r"Final Answer:(.*)", re.S)

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        """``Question: ...``; documented tools (with a schema) are listed before it with the call format."""
        if not _documented(tools):
            return f"Question: {question.strip()}\n"
        specs = "\n".join(json.dumps(t.as_json_schema()["function"]) for t in tools if t.listed)
        return (
            "Functions (JSON schemas, one a line):\n" + specs + "\n"
            "Call functions with 'Action: [name(arg=value, ...), name2(...)]'; the Observation shows the results. "
            "When the request is done (or cannot be done), write 'Final Answer: ' and a short reply.\n"
            f"Question: {question.strip()}\n"
        )

    def observation(self, text: str) -> str:
        return f"Observation: {text.strip()}\n"

    def user_message(self, text: str) -> str:
        """The next user message: a new ``Question:`` line."""
        return f"Question: {text.strip()}\n"

    @staticmethod
    def calls_turn(thought: str, calls: str) -> str:
        """A well-formed turn calling python-style ``calls`` (``f(a=1), g()``)."""
        return f"Thought: {thought}\nAction: [{calls}]\n"

    @staticmethod
    def tool_turn(thought: str, tool: str, argument: str) -> str:
        """A well-formed tool-call turn (for rendering supervised traces)."""
        return f"Thought: {thought}\nAction: {tool}[{argument}]\n"

    @staticmethod
    def answer_turn(thought: str, answer: str) -> str:
        """A well-formed final-answer turn."""
        return f"Thought: {thought}\nFinal Answer: {answer}\n"

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action:
        """The turn's action; anything malformed (also too long, too deep, unencodable) is INVALID, never raised."""
        return _safe(self._parse(text, tools, truncated))

    def _parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool) -> Action:
        forged = text.find("Observation:")
        if forged >= 0:  # the sampler should have stopped here: drop what the model made up
            text = text[:forged]
        kept = text.rstrip() + "\n"
        if truncated:
            return Action(ActionKind.INVALID, kept, error=_runaway("per-turn limit"))
        m = self._ACTION.search(text)
        a = self._ANSWER.search(text)
        c = self._CALLS.search(text)
        if c and (not m or c.start() < m.start()) and (not a or c.start() < a.start()):
            body = text[c.end() - 1 :]
            end = body.rfind("]")
            if end < 0:
                return Action(ActionKind.INVALID, kept, error="Error: the call list is not closed with ']'.")
            calls, err = parse_call_list(body[: end + 1], tools)
            if err:
                return Action(ActionKind.INVALID, kept, error=err)
            return _tool_action(kept, calls)
        if a and (not m or a.start() < m.start()):
            answer = a.group(1).strip().splitlines()[0].strip() if a.group(1).strip() else ""
            if not answer:
                return Action(
                    ActionKind.INVALID, kept, error="Error: 'Final Answer:' must be followed by the answer."
                )
            return Action(ActionKind.ANSWER, kept, answer=answer)
        if not m:
            return Action(
                ActionKind.INVALID,
                kept,
                error="Error: end the turn with 'Action: tool[input]' or 'Final Answer: ...'.",
            )
        name, opener = m.group(1), m.group(2)
        body = text[m.end() :]
        closer = "]" if opener == "[" else "}"
        end = body.rfind(closer)
        if end < 0:
            return Action(
                ActionKind.INVALID, kept, error=f"Error: the action's input is not closed with '{closer}'."
            )
        raw = body[:end]
        too_long = oversized(raw)
        if too_long:
            return Action(ActionKind.INVALID, kept, error=too_long)
        spec = next((t for t in tools if t.name == name), None)
        if opener == "[":
            args: dict[str, Any] = {spec.parameters[0]: raw.strip()} if spec else {"input": raw}
        else:
            try:
                parsed = json.loads("{" + raw + "}")
            except (
                ValueError,
                RecursionError,
            ) as exc:  # JSONDecodeError, a too long number, too deep nesting
                return Action(
                    ActionKind.INVALID,
                    kept,
                    error=f"Error: the arguments are not valid JSON ({json_error(exc)}).",
                )
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

    def _render(
        self, messages: list[dict[str, str]], tools: Sequence[ToolSpec] = (), gen: bool = False
    ) -> str:
        assert self.tokenizer is not None
        tools = [t for t in tools if t.listed]
        schemas = [t.as_json_schema() for t in tools] or None
        if schemas and "tools" not in str(self.tokenizer.chat_template):
            # A chat template without tool support (SmolLM2's) would drop the schemas: put them in a system message.
            messages = [{"role": "system", "content": _tools_system_text(tools)}, *messages]
            schemas = None
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=schemas, add_generation_prompt=gen, tokenize=False
            )
        )

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        if self.tokenizer is not None:
            return self._render([{"role": "user", "content": question.strip()}], tools, gen=True)
        system = f"<|im_start|>system\n{_tools_system_text(tools)}<|im_end|>\n"
        return system + f"<|im_start|>user\n{question.strip()}<|im_end|>\n<|im_start|>assistant\n"

    def _after_assistant(self, message: dict[str, str]) -> str | None:
        """The chat template's text between an assistant turn's content and the next assistant turn, with
        ``message`` in between (None without a tokenizer, or when the template does not render by appending).
        The sampler stops before the assistant's end-of-turn marker, so the text starts with it."""
        if self.tokenizer is None:
            return None
        marker = "\x00ASSISTANT\x00"
        conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        before = self._render(conv)
        after = self._render([*conv, message], gen=True)
        if not after.startswith(before):
            return None
        return before[before.index(marker) + len(marker) :] + after[len(before) :]

    def user_message(self, text: str) -> str:
        """The next user message, as the text between the assistant's turn and the next assistant turn."""
        delta = self._after_assistant({"role": "user", "content": text.strip()})
        if delta is not None:
            return delta
        return f"<|im_end|>\n<|im_start|>user\n{text.strip()}<|im_end|>\n<|im_start|>assistant\n"

    @staticmethod
    def calls_turn(calls: Sequence[ToolCall]) -> str:
        """A well-formed turn making ``calls`` (one ``<tool_call>`` block each)."""
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': c.tool, 'arguments': dict(c.arguments)})}\n</tool_call>"
            for c in calls
        )

    def observation(self, text: str) -> str:
        delta = self._after_assistant({"role": "tool", "content": text.strip()})
        if delta is not None:
            return delta
        return (
            f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text.strip()}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action:
        """The turn's action; anything malformed (also too long, too deep, unencodable) is INVALID, never raised."""
        return _safe(self._parse(text, tools, truncated))

    def _parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool) -> Action:
        for marker in ("<tool_response>", "<|im_start|>"):
            cut = text.find(marker)
            if cut >= 0:
                text = text[:cut]
        kept = text.replace("<|im_end|>", "").rstrip()
        if truncated:
            return Action(ActionKind.INVALID, kept, error=_runaway("per-turn limit"))
        visible = re.sub(r"<think>.*?(</think>|$)", "", kept, flags=re.S).strip()
        blocks = list(self._CALL.finditer(visible))
        if not blocks:
            if not visible:
                return Action(
                    ActionKind.INVALID,
                    kept,
                    error="Error: empty response; call a tool or give the final answer.",
                )
            from_boxed = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", visible)
            return Action(ActionKind.ANSWER, kept, answer=from_boxed[-1] if from_boxed else visible)
        # Several <tool_call> blocks are several calls of one turn; any malformed block makes the turn invalid.
        calls: list[ToolCall] = []
        for m in blocks:
            call, bad = self._parse_block(m, tools)
            if bad is not None:
                return replace(bad, text=kept)
            assert call is not None
            calls.append(call)
        return _tool_action(kept, calls)

    @staticmethod
    def _parse_block(m: re.Match[str], tools: Sequence[ToolSpec]) -> tuple[ToolCall | None, Action | None]:
        """One ``<tool_call>`` block: the call, or an INVALID action (text filled in by the caller)."""
        if not m.group(2):
            return None, Action(
                ActionKind.INVALID, "", error="Error: <tool_call> is not closed with </tool_call>."
            )
        too_long = oversized(m.group(1))
        if too_long:
            return None, Action(ActionKind.INVALID, "", error=too_long)
        try:
            call = json.loads(m.group(1))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, a too long number, too deep nesting
            return None, Action(
                ActionKind.INVALID, "", error=f"Error: the tool call is not valid JSON ({json_error(exc)})."
            )
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None, Action(
                ActionKind.INVALID, "", error='Error: a tool call must be {"name": ..., "arguments": {...}}.'
            )
        args = call.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None, Action(ActionKind.INVALID, "", error="Error: 'arguments' must be a JSON object.")
        if not isinstance(args, dict):
            return None, Action(ActionKind.INVALID, "", error="Error: 'arguments' must be a JSON object.")
        err = _check_tool(str(call["name"]), args, tools)
        if err:
            return None, Action(ActionKind.INVALID, "", tool=str(call["name"]), arguments=args, error=err)
        return ToolCall(str(call["name"]), args), None


def _tools_system_text(tools: Sequence[ToolSpec]) -> str:
    """The Qwen-style system text that lists tool schemas (for templates that cannot render tools)."""
    specs = "\n".join(json.dumps(t.as_json_schema()) for t in tools if t.listed)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"<tools>\n{specs}\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags."
    )
