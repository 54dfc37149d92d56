"""ReAct turns: pluggable turn templates and a parser that never lets a malformed action end an episode.

A *turn* is one model response: a thought and either a tool call or a final answer. The environment
answers a tool call with an observation, which the template renders into the context before the
next turn. Every malformed action (no action, bad JSON, unknown tool, missing arguments, a runaway
turn, a forged observation) parses to an ``INVALID`` action whose ``error`` becomes the observation,
so the episode goes on and the policy can learn from its mistake.

The action model and the checks parsers share live in ``tracerl.engine.actions``; the templates (``plain``,
``chat``; registry ``TEMPLATES``) in ``tracerl.engine.templates``. This module is the one import for both.
"""

from tracerl.engine.actions import (
    Action,
    ActionKind,
    ToolCall,
    ToolSpec,
    parse_call_list,
)
from tracerl.engine.templates import (
    TEMPLATES,
    ChatTemplate,
    PlainTemplate,
    TurnTemplate,
    call_source,
    make_template,
)

__all__ = [
    "TEMPLATES",
    "Action",
    "ActionKind",
    "ChatTemplate",
    "PlainTemplate",
    "ToolCall",
    "ToolSpec",
    "TurnTemplate",
    "call_source",
    "make_template",
    "parse_call_list",
]
