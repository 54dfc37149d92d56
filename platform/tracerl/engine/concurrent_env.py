"""``ConcurrentEnv``: an environment whose round of tool calls runs on threads, every other hook the wrapped one's.

The engine hands a round's tool calls to ``execute_batch`` at once; the default runs them one by one. On Ray a
sampler actor's calls go to its environment actors in parallel (actors/envpool.py); in one process
(``cluster.address=inprocess``, the bench's environment runs, TRL's side of ``tracerl bench peer``) this wrapper
runs them on ``workers`` threads instead (the sandbox and search calls wait on subprocesses or native code, so
threads overlap them). Results come back in call order, so the trees are the same as with one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tracerl.engine.protocol import AnswerResult, ToolEnv, ToolResult
from tracerl.engine.react import Action, ToolSpec
from tracerl.types import Prompt


class ConcurrentEnv(ToolEnv):
    """``env`` with each round's tool calls on up to ``workers`` threads."""

    def __init__(self, env: ToolEnv, workers: int) -> None:
        self.env, self.workers = env, workers
        self.tools, self.fork_mode = env.tools, env.fork_mode

    def initial_state(self, prompt: Prompt) -> Any:
        return self.env.initial_state(prompt)

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        return self.env.execute(prompt, state, action)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        return self.env.reward(prompt, answer)

    def tools_for(self, prompt: Prompt, state: Any) -> Sequence[ToolSpec]:
        return self.env.tools_for(prompt, state)

    def on_answer(self, prompt: Prompt, state: Any, action: Action) -> AnswerResult | None:
        return self.env.on_answer(prompt, state, action)

    def scores(self, prompt: Prompt, answer: str | None) -> dict[str, float]:
        return self.env.scores(prompt, answer)

    def gold_turns(self, prompt: Prompt, template: Any) -> list[str]:
        return self.env.gold_turns(prompt, template)

    @property
    def warnings(self) -> list[str]:
        return self.env.warnings

    def execute_batch(self, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
        if self.workers <= 1 or len(calls) <= 1:
            return self.env.execute_batch(calls)
        with ThreadPoolExecutor(min(self.workers, len(calls))) as pool:
            return list(pool.map(lambda c: self.env.execute(*c), calls))
