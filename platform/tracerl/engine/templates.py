"""Turn templates: how a policy's turns, the environment's observations and the next user message are written.

Registry ``TEMPLATES`` (a template is built from the policy's tokenizer and an optional system prompt:
``make_template(name, tokenizer, system_prompt)``, i.e. ``TEMPLATES.get(name)(tokenizer, system_prompt=...)``):

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

A multi-turn environment's next user message is rendered by ``user_message`` (plain: a new ``Question:`` line).
Each template also writes well-formed turns in its own format (``tool_turn``, ``calls_turn``, ``answer_turn``):
environments render their reference (gold) turns with them, and supervised traces are built from them, so a
replay goes through the same parser as the policy's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from tracerl.engine.actions import (
    Action,
    ActionKind,
    ToolCall,
    ToolSpec,
    check_tool,
    parse_call_list,
    runaway_error,
    safe_action,
    tool_action,
)
from tracerl.engine.untrusted import json_error, oversized
from tracerl.registry import Registry


class TurnTemplate(Protocol):
    name: str
    stop: tuple[str, ...]
    newline_before_observation: bool
    """True: an observation starts on a new line after the turn's text (plain). False: ``observation`` and
    ``user_message`` are the text that follows the turn's content verbatim, starting with the end-of-turn marker
    (chat); the engine drops that marker after a turn that already ended on it."""

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str: ...

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action: ...

    def observation(self, text: str) -> str: ...

    def user_message(self, text: str) -> str:
        """The next user message of a multi-turn task (delivered by the environment), as context text."""
        ...

    def tool_turn(self, thought: str, tool: str, arguments: Mapping[str, Any]) -> str:
        """A well-formed turn calling ``tool`` with ``arguments`` after ``thought``."""
        ...

    def calls_turn(self, thought: str, calls: Sequence[ToolCall]) -> str:
        """A well-formed turn making several ``calls`` (python-style literals) after ``thought``."""
        ...

    def answer_turn(self, thought: str, answer: str) -> str:
        """A well-formed final-answer turn."""
        ...


TEMPLATES: Registry[Callable[..., TurnTemplate]] = Registry("turn template")


def make_template(name: str, tokenizer: Any = None, system_prompt: str = "") -> TurnTemplate:
    """The registered template ``name`` for ``tokenizer``, with ``system_prompt`` (``model.system_prompt``) before
    every prompt. A registered template that takes no ``system_prompt`` works while none is set.

    Raises:
        ValueError: ``system_prompt`` is set and the template ``name`` takes none.
    """
    factory = TEMPLATES.get(name)
    if not system_prompt:
        return factory(tokenizer)
    try:
        return factory(tokenizer, system_prompt=system_prompt)
    except TypeError as exc:
        if "system_prompt" not in str(exc):
            raise
        raise ValueError(
            f"turn template {name!r} takes no system prompt: unset model.system_prompt or give the template's "
            "constructor a system_prompt keyword"
        ) from exc


def call_source(call: ToolCall) -> str:
    """``name(arg=value, ...)`` with ``repr`` of each (literal) value: the python-style call ``parse_call_list``
    reads back (and BFCL's executor evaluates)."""
    args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"{call.tool}({args})"


def _documented(tools: Sequence[ToolSpec]) -> bool:
    return any(t.schema is not None for t in tools)


@TEMPLATES.register("plain")
class PlainTemplate:
    """The documented plain ReAct format (see the module docstring)."""

    name = "plain"
    stop: tuple[str, ...] = ("Observation:",)
    newline_before_observation = True

    def __init__(self, tokenizer: Any = None, system_prompt: str = "") -> None:
        self.tokenizer = tokenizer  # unused: the plain format is fixed
        self.system = f"{system_prompt.strip()}\n" if system_prompt.strip() else ""

    _ACTION = re.compile(r"Action:\s*([A-Za-z_][\w\-]*)\s*([\[{])", re.S)
    _CALLS = re.compile(r"Action:\s*\[", re.S)
    _ANSWER = re.compile(r"Final Answer:(.*)", re.S)

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        """``Question: ...``; documented tools (with a schema) are listed before it with the call format."""
        if not _documented(tools):
            return f"{self.system}Question: {question.strip()}\n"
        specs = "\n".join(json.dumps(t.as_json_schema()["function"]) for t in tools if t.listed)
        return self.system + (
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

    def tool_turn(self, thought: str, tool: str, arguments: Mapping[str, Any]) -> str:
        """``Action: tool[value]`` for one string argument, else ``Action: tool{"k": v, ...}``."""
        values = list(arguments.values())
        if len(values) == 1 and isinstance(values[0], str):
            return f"Thought: {thought}\nAction: {tool}[{values[0]}]\n"
        return f"Thought: {thought}\nAction: {tool}{json.dumps(dict(arguments))}\n"

    def calls_turn(self, thought: str, calls: Sequence[ToolCall]) -> str:
        """``Action: [f(a=1), g()]``: python-style calls, in order."""
        return f"Thought: {thought}\nAction: [{', '.join(map(call_source, calls))}]\n"

    def answer_turn(self, thought: str, answer: str) -> str:
        return f"Thought: {thought}\nFinal Answer: {answer}\n"

    def parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool = False) -> Action:
        """The turn's action; anything malformed (also too long, too deep, unencodable) is INVALID, never raised."""
        return safe_action(self._parse(text, tools, truncated))

    def _parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool) -> Action:
        forged = text.find("Observation:")
        if forged >= 0:  # the sampler should have stopped here: drop what the model made up
            text = text[:forged]
        kept = text.rstrip() + "\n"
        if truncated:
            return Action(ActionKind.INVALID, kept, error=runaway_error("per-turn limit"))
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
            return tool_action(kept, calls)
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
        err = check_tool(name, args, tools)
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
    newline_before_observation = False
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", re.S)

    def __init__(self, tokenizer: Any = None, system_prompt: str = "") -> None:
        self.tokenizer = tokenizer if getattr(tokenizer, "chat_template", None) else None
        self.system_prompt = system_prompt.strip()

    def _render(
        self,
        messages: list[dict[str, str]],
        tools: Sequence[ToolSpec] = (),
        gen: bool = False,
        system: str = "",
    ) -> str:
        """``messages`` through the tokenizer's chat template; ``system`` (the system prompt) opens the
        conversation as a system message."""
        assert self.tokenizer is not None
        tools = [t for t in tools if t.listed]
        schemas = [t.as_json_schema() for t in tools] or None
        if schemas and "tools" not in str(self.tokenizer.chat_template):
            # A chat template without tool support (SmolLM2's) would drop the schemas: put them in a system message.
            system = "\n\n".join(s for s in (system, _tools_system_text(tools)) if s)
            schemas = None
        if system:
            messages = [{"role": "system", "content": system}, *messages]
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=schemas, add_generation_prompt=gen, tokenize=False
            )
        )

    def prompt(self, question: str, tools: Sequence[ToolSpec]) -> str:
        if self.tokenizer is not None:
            return self._render(
                [{"role": "user", "content": question.strip()}], tools, gen=True, system=self.system_prompt
            )
        text = "\n\n".join(s for s in (self.system_prompt, _tools_system_text(tools)) if s)
        system = f"<|im_start|>system\n{text}<|im_end|>\n"
        return system + f"<|im_start|>user\n{question.strip()}<|im_end|>\n<|im_start|>assistant\n"

    def _after_assistant(self, message: dict[str, str]) -> str | None:
        """The chat template's text between an assistant turn's content and the next assistant turn, with
        ``message`` in between (None without a tokenizer, or when the template does not render by appending).
        The text starts with the assistant's end-of-turn marker: a turn cut at a stop string (or at an end token
        other than the tokenizer's EOS) has none; after one that ended on it the engine drops it here."""
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
    def _think(thought: str) -> str:
        return f"<think>{thought}</think>\n" if thought else ""

    def tool_turn(self, thought: str, tool: str, arguments: Mapping[str, Any]) -> str:
        """``<think>thought</think>`` then one ``<tool_call>`` block."""
        call = json.dumps({"name": tool, "arguments": dict(arguments)})
        return f"{self._think(thought)}<tool_call>{call}</tool_call>"

    def calls_turn(self, thought: str, calls: Sequence[ToolCall]) -> str:
        """One ``<tool_call>`` block per call (no ``<think>`` block for an empty ``thought``)."""
        return self._think(thought) + "\n".join(
            f"<tool_call>\n{json.dumps({'name': c.tool, 'arguments': dict(c.arguments)})}\n</tool_call>"
            for c in calls
        )

    def answer_turn(self, thought: str, answer: str) -> str:
        """The answer as the visible text, after the ``<think>`` block."""
        return f"{self._think(thought)}{answer}"

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
        return safe_action(self._parse(text, tools, truncated))

    def _parse(self, text: str, tools: Sequence[ToolSpec], truncated: bool) -> Action:
        for marker in ("<tool_response>", "<|im_start|>"):
            cut = text.find(marker)
            if cut >= 0:
                text = text[:cut]
        kept = text.replace("<|im_end|>", "").rstrip()
        if truncated:
            return Action(ActionKind.INVALID, kept, error=runaway_error("per-turn limit"))
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
        return tool_action(kept, calls)

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
        err = check_tool(str(call["name"]), args, tools)
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
