"""The ``model`` section's schema: the policy checkpoint, its dtype and its turn template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tracerl.schema import check_choices
from tracerl.shipped import shipped_model

Dtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class ModelConfig:
    """The policy checkpoint."""

    path: str = "models/tiny-math"
    """An HF checkpoint directory or a hub-style name available offline; a relative ``models/<name>`` missing here
    names the shipped tiny policy (``tracerl.shipped.shipped_model``: the shipped configs run from any directory)."""
    dtype: Dtype = "float32"
    """float32, bfloat16 or float16."""
    template: str = "plain"
    """Turn template: 'plain' (the tiny policy's format) or 'chat' (native tool calls in the chat template)."""
    system_prompt: str = ""
    """A system prompt before every task (chat: the system message, with the tool list where the model's chat
    template cannot render tools; plain: a line before the question). Empty: none (the chat template's default)."""

    def __post_init__(self) -> None:
        check_choices(self, "model")
        object.__setattr__(self, "path", shipped_model(self.path))
