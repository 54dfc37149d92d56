"""Reference turns written as model text, for gold replay (``tracerl bench env --gold``) and supervised traces.

An environment's ``gold_turns(prompt, template)`` returns the turns a perfect policy would write; these
helpers render one tool call or one final answer in a template's own format, so the replay goes through
the same parser as the policy's text:

* ``plain``: ``Thought: ...`` then ``Action: tool[arg]`` (one argument) or ``Action: tool{"k": v}``
  (several), or ``Final Answer: ...``;
* ``chat``: ``<think>...</think>`` then ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, or the
  answer as the visible text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def tool_turn_text(template: Any, thought: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """One tool-call turn as ``template`` (plain or chat) expects the model to write it.

    Raises:
        ValueError: a template other than plain or chat (give the environment its own rendering).
    """
    name = getattr(template, "name", "")
    if name == "plain":
        if len(arguments) == 1 and isinstance(next(iter(arguments.values())), str):
            return f"Thought: {thought}\nAction: {tool}[{next(iter(arguments.values()))}]\n"
        return f"Thought: {thought}\nAction: {tool}{json.dumps(dict(arguments))}\n"
    if name == "chat":
        call = json.dumps({"name": tool, "arguments": dict(arguments)})
        return f"<think>{thought}</think>\n<tool_call>{call}</tool_call>"
    raise ValueError(f"no gold rendering for turn template {name!r}; known: plain, chat")


def answer_turn_text(template: Any, thought: str, answer: str) -> str:
    """One final-answer turn as ``template`` (plain or chat) expects the model to write it.

    Raises:
        ValueError: a template other than plain or chat.
    """
    name = getattr(template, "name", "")
    if name == "plain":
        return f"Thought: {thought}\nFinal Answer: {answer}\n"
    if name == "chat":
        return f"<think>{thought}</think>\n{answer}"
    raise ValueError(f"no gold rendering for turn template {name!r}; known: plain, chat")
