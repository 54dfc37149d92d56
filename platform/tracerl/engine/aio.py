"""Samplers with an async engine (vLLM's ``AsyncLLM``): one event loop per process, on a thread of its own.

An async engine is bound to the loop it first ran on, and a sampler actor's Ray methods are plain calls on
Ray's thread; so every coroutine of a process runs on this one background loop (``run`` submits one and waits).
Between two calls the loop keeps going: a streaming step's paths (engine/paths.py) keep generating while the
actor waits for its next call.

``AsyncSampler`` is what the per-path driver needs: ``agenerate``, one turn of one context, awaited on this loop;
the engine's requests of all running paths then form one continuously batched stream (vLLM schedules per token).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from tracerl.engine.generation import Generation

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


@runtime_checkable
class AsyncSampler(Protocol):
    """A sampler that can generate one context's turn as a coroutine (on ``loop()``)."""

    async def agenerate(
        self,
        context: list[int],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seed: int,
        cache: object | None = None,
    ) -> Generation:
        """One turn of ``context``; ``seed`` alone decides its random draws (as ``Sampler.generate``'s seeds)."""
        ...


def loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop (started on first use, a daemon thread)."""
    global _loop
    with _lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            threading.Thread(target=new.run_forever, name="tracerl-aio", daemon=True).start()
            _loop = new
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and wait for its result (its exception is raised here)."""
    if _on_loop():
        coro.close()
        raise RuntimeError(
            "tracerl.engine.aio.run called from the background loop itself: await the coroutine"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop()).result()


def _on_loop() -> bool:
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False
