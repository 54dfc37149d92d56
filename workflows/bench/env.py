"""``tracerl bench env [math|search|bfcl] [--gold]``: an environment's score on its held-out tasks.

* ``--gold``: the environment's reference actions (``gold_turns(prompt, template)``: the generated math
  tasks' code cells, the multi-hop world's correct queries and answers, BFCL's ground-truth calls) are
  written as model text and replayed through the real ``TreeRolloutEngine`` by the ``scripted`` sampler:
  the same template parser, environment and reward as a policy's rollouts, all rollouts advancing together
  and each round's tool calls running concurrently (``workers`` threads). A byte tokenizer stands in for a
  model's, so no model is needed. A correct environment scores 1.0.
* without it: the configured policy (the tiny policy of the family) on the same tasks: pass@1 at the
  sampler's temperature (0: greedy).

JSON: ``{"env", "mode", "n", "score", "by_category", "scores", "time_s"}``; ``by_category`` is the mean
reward per ``Prompt.source`` (level, hop count, BFCL category); ``scores`` the mean of each answer score
the environment reports (search: em, f1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tracerl.engine.concurrent_env import ConcurrentEnv
from tracerl.engine.protocol import ToolEnv
from tracerl.engine.react import TEMPLATES
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.registry import tool_env_class
from tracerl.samplers.scripted import ByteTokenizer, ScriptedSampler, prompt_text, replay_engine
from tracerl.tree import RolloutTree
from tracerl.types import Prompt
from tracerl.workflows.bench.config import BenchEnvConfig
from tracerl.workflows.lm.stack import build_stack


def gold_engine(
    env: ToolEnv, prompts: Sequence[Prompt], template_name: str, limits: Any
) -> TreeRolloutEngine:
    """An engine whose scripted sampler replays each prompt's ``gold_turns`` (``replay_engine``) on a byte tokenizer:
    no model needed, token counts are bytes.

    Raises:
        ValueError: the environment has no ``gold_turns`` (``Env.gold_turns``'s default).
    """
    return replay_engine(env, prompts, TEMPLATES.get(template_name)(None), ByteTokenizer(), limits)


def summarize(trees: Sequence[RolloutTree]) -> dict[str, Any]:
    """Mean reward overall and per category, and the mean of each answer score (0 for unanswered)."""
    rewards = [float(t.rewards()[0]) for t in trees]
    by_cat: dict[str, list[float]] = {}
    scores: dict[str, float] = {}
    for t, r in zip(trees, rewards):
        by_cat.setdefault(t.prompt.source or "all", []).append(r)
        for k, v in t.leaves()[0].scores.items():
            scores[k] = scores.get(k, 0.0) + v
    n = max(len(trees), 1)
    return {
        "n": len(trees),
        "score": sum(rewards) / n,
        "by_category": {k: sum(v) / len(v) for k, v in sorted(by_cat.items())},
        "scores": {k: v / n for k, v in sorted(scores.items())},
    }


def _distinct_prompt_rounds(env: ToolEnv, template: Any, prompts: Sequence[Prompt]) -> list[list[Prompt]]:
    """``prompts`` in rounds within which no two render the same prompt text (first fit, order kept)."""
    rounds: list[tuple[set[str], list[Prompt]]] = []
    for p in prompts:
        text = prompt_text(env, template, p)
        slot = next((r for r in rounds if text not in r[0]), None)
        if slot is None:
            slot = (set(), [])
            rounds.append(slot)
        slot[0].add(text)
        slot[1].append(p)
    return [r[1] for r in rounds]


@dataclass(frozen=True)
class BenchEnvResult:
    """An environment's score on its held-out tasks (the JSON summary of ``tracerl bench env``)."""

    env: str
    mode: str
    """'gold' (reference replay) or 'policy'."""
    n: int
    score: float
    by_category: dict[str, float]
    scores: dict[str, float]
    time_s: float
    tool_calls: int
    invalid_actions: int
    unscripted_contexts: int | None = None
    """Gold mode: contexts that matched no script (0 in a sound replay)."""
    temperature: float | None = None
    """Policy mode: the sampling temperature (0: greedy)."""

    def as_json(self) -> dict[str, Any]:
        """The summary without the fields of the other mode."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def format(self) -> str:
        extra = ", ".join(f"{k} {v:.3f}" for k, v in self.scores.items())
        cats = ", ".join(f"{k} {v:.3f}" for k, v in self.by_category.items())
        return (
            f"{self.env} ({self.mode}): score {self.score:.3f} on {self.n} held-out tasks"
            + (f" ({extra})" if extra else "")
            + f" in {self.time_s:.1f} s\n  by category: {cats}"
        )


def run_env_bench(cfg: BenchEnvConfig, progress: Callable[[str], None] = lambda s: None) -> BenchEnvResult:
    """Gold replay or policy pass@1 on the first ``cfg.tasks`` held-out tasks of ``cfg.env``."""
    t0 = time.perf_counter()
    cls = tool_env_class(cfg.env.name)
    prompts = list(cls.prompts(cfg.env, held_out=True))[: cfg.tasks]
    env = ConcurrentEnv(cls.from_config(cfg.env), cfg.workers)
    if cfg.gold:
        engine = gold_engine(env, prompts, cfg.model.template, cfg.sampler)
        mode = "gold"
    else:
        stack = build_stack(cfg.model, cfg.sampler, cfg.env, cfg.seed)
        engine = stack.engine
        engine.env = env
        mode = "policy"
    progress(f"bench env {cfg.env.name} ({mode}): {len(prompts)} held-out tasks")
    trees: list[RolloutTree] = []
    if mode == "gold":
        # The scripted sampler tells scripts apart by prompt text: tasks that render the same prompt (BFCL's
        # miss_param and long_context variants of a base task) replay in separate rounds, one engine each.
        rounds = _distinct_prompt_rounds(env, engine.template, prompts)
        batches = [
            (engine if len(rounds) == 1 else gold_engine(env, r, cfg.model.template, cfg.sampler), r)
            for r in rounds
        ]
    else:
        batches = [(engine, prompts[i : i + 50]) for i in range(0, len(prompts), 50)]
    for eng, batch in batches:
        trees += eng.rollout(batch, [1] * len(batch))
        progress(f"  {len(trees)}/{len(prompts)} rolled out ({time.perf_counter() - t0:.0f} s)")
    engines = list({id(e): e for e, _ in batches}.values())
    gold = mode == "gold"
    return BenchEnvResult(
        env=cfg.env.name,
        mode=mode,
        **summarize(trees),
        time_s=time.perf_counter() - t0,
        tool_calls=sum(e.ledger.tool_calls for e in engines),
        invalid_actions=sum(e.ledger.invalid_actions for e in engines),
        unscripted_contexts=sum(e.sampler.misses for e in engines if isinstance(e.sampler, ScriptedSampler))
        if gold
        else None,
        temperature=None if gold else cfg.sampler.temperature,
    )
