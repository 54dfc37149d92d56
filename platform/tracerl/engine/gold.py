"""Reference turns written as model text, for gold replay (``tracerl bench env --gold``) and supervised traces.

An environment's ``gold_turns(prompt, template)`` returns the turns a perfect policy would write. It writes
them with the template's own turn writers (``TurnTemplate.tool_turn``, ``calls_turn``, ``answer_turn``), so a
template registered by a user renders gold turns too, and the replay goes through the same parser as the
policy's text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracerl.engine.templates import TurnTemplate


def tool_turn_text(template: TurnTemplate, thought: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """One tool-call turn as ``template`` expects the model to write it."""
    return template.tool_turn(thought, tool, arguments)


def answer_turn_text(template: TurnTemplate, thought: str, answer: str) -> str:
    """One final-answer turn as ``template`` expects the model to write it."""
    return template.answer_turn(thought, answer)


def gold_turn_texts(
    template: TurnTemplate,
    calls: Sequence[tuple[str, str, Mapping[str, Any]]],
    final_thought: str,
    answer: str,
) -> list[str]:
    """A reference solution as ``template`` expects the model to write it: a tool-call turn per ``(thought, tool,
    arguments)`` of ``calls``, then the final-answer turn."""
    return [
        *(tool_turn_text(template, *call) for call in calls),
        answer_turn_text(template, final_thought, answer),
    ]


def no_gold(prompt_id: str, which: str) -> ValueError:
    """The error of a prompt without a reference solution: gold turns exist only for ``which`` prompts."""
    return ValueError(f"no reference solution for {prompt_id!r}: gold turns exist only for the {which}")
