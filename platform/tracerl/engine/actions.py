"""The action model of a ReAct turn and the checks every template's parser shares.

A turn parses to an ``Action``: a TOOL action with one or more ``ToolCall``s, a final ANSWER, or INVALID with the
error observation the agent sees instead (so a malformed turn never ends an episode). ``safe_action`` makes
every string of an action encodable and rejects arguments nested too deeply; ``check_tool`` checks a call
against the tool's ``ToolSpec``; ``parse_call_list`` reads python-style call lists (BFCL's format) without
evaluating anything.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tracerl.engine.untrusted import MAX_ARGUMENT_DEPTH, TooDeep, clean, encodable, oversized


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


def safe_action(action: Action) -> Action:
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


def check_tool(name: str, args: Mapping[str, Any], tools: Sequence[ToolSpec]) -> str | None:
    """The error observation for a call of an unknown tool, or with missing or unknown arguments (None: valid)."""
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
        err = check_tool(name, args, tools)
        if err:
            return calls, err
        calls.append(ToolCall(name, args))
    if not calls:
        return calls, "Error: the call list is empty; call a function or give the final answer."
    return calls, None


def tool_action(kept: str, calls: Sequence[ToolCall]) -> Action:
    """A TOOL action making ``calls`` (at least one), with ``kept`` as its text."""
    first, *rest = calls
    return Action(ActionKind.TOOL, kept, tool=first.tool, arguments=first.arguments, more_calls=tuple(rest))


def runaway_error(limit_note: str) -> str:
    """The error observation of a turn cut at its token limit."""
    return f"Error: the turn ran past its token limit ({limit_note}) without a complete action. Keep turns short."
