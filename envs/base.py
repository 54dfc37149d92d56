"""What an environment author derives from: ``Env`` (any environment) and ``ToolEnv`` (a ReAct tool environment).

They are defined with the engine's contracts (``tracerl.engine.protocol``: the engine may not import this
package) and re-exported here with the records their hooks return, so an environment imports one module::

    from tracerl.envs.base import ToolEnv, ToolResult
    from tracerl.envs.registry import ENVS

Every optional hook has a documented default in the base class; docs/design.md, "Adding an environment",
walks through a complete one.
"""

from tracerl.engine.protocol import AnswerResult, Env, ToolEnv, ToolResult
from tracerl.engine.react import Action, ActionKind, ToolSpec
from tracerl.types import Prompt

__all__ = ["Action", "ActionKind", "AnswerResult", "Env", "Prompt", "ToolEnv", "ToolResult", "ToolSpec"]
