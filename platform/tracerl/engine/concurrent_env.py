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

from tracerl.engine.protocol import ToolEnv, ToolResult, WrappedEnv
from tracerl.engine.react import Action
from tracerl.types import Prompt


class ConcurrentEnv(WrappedEnv):
    """``local`` with each round's tool calls on up to ``workers`` threads."""

    def __init__(self, local: ToolEnv, workers: int) -> None:
        super().__init__(local)
        self.workers = workers

    def execute_batch(self, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
        if self.workers <= 1 or len(calls) <= 1:
            return self.local.execute_batch(calls)
        with ThreadPoolExecutor(min(self.workers, len(calls))) as pool:
            return list(pool.map(lambda c: self.local.execute(*c), calls))
