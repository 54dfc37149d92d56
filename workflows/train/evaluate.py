"""``tracerl eval``: a checkpoint (directory, training run or registered model) on a task set.

Greedy pass@1 (one rollout at temperature 0), and with k samples at the sampling temperature pass@k
(share of tasks with at least one success) and avg@k (mean success over the k samples); accuracy by
source (generated level or file), well-formed turns, and per-task traces (JSONL).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

from tracerl.engine.ledger import BudgetLedger
from tracerl.envs.registry import check_data, env_section
from tracerl.tree import RolloutTree
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.tracking import store as trk


def leaf_score_means(trees: Sequence[RolloutTree]) -> dict[str, float]:
    """Mean of each answer score (``Node.scores``: em, f1 for search) over every leaf; leaves without an answer
    count 0. Empty when the environment reports no scores."""
    leaves = [leaf for t in trees for leaf in t.leaves()]
    keys = sorted({k for leaf in leaves for k in leaf.scores})
    return {k: sum(leaf.scores.get(k, 0.0) for leaf in leaves) / len(leaves) for k in keys}


class EvalSummary(TypedDict, total=False):
    """What ``summarize`` gives for one set of rollouts (an empty set has only ``tasks``: 0)."""

    tasks: int
    k: int
    """Rollouts per task."""
    pass_at_k: float
    avg_at_k: float
    by_source: dict[str, float]
    """Mean success per task source (generated level or file)."""
    well_formed_turns: float
    generated_tokens_per_rollout: float
    statuses: dict[str, int]
    """Leaves per ending status."""
    scores: dict[str, float]
    """Mean answer scores (em, f1 for search), ``leaf_score_means``."""


def summarize(trees: Sequence[RolloutTree], ledger: BudgetLedger) -> EvalSummary:
    """pass@k, avg@k (k = leaves per tree), per-source accuracy, well-formed turns and ending statuses."""
    if not trees:
        return {"tasks": 0}
    k = trees[0].num_leaves
    rewards = [t.rewards() for t in trees]
    by_source: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    for t, r in zip(trees, rewards):
        by_source.setdefault(t.prompt.source or "tasks", []).append(float(r.mean()) if r.size else 0.0)
        for leaf in t.leaves():
            statuses[leaf.status.value] = statuses.get(leaf.status.value, 0) + 1
    return {
        "tasks": len(trees),
        "k": k,
        "pass_at_k": sum(bool((r > 0.5).any()) for r in rewards) / len(trees),
        "avg_at_k": sum(float(r.mean()) for r in rewards if r.size) / len(trees),
        "by_source": {s: sum(v) / len(v) for s, v in sorted(by_source.items())},
        "well_formed_turns": 1 - ledger.invalid_actions / max(ledger.llm_calls, 1),
        "generated_tokens_per_rollout": ledger.generated_tokens / max(sum(len(r) for r in rewards), 1),
        "statuses": statuses,
        "scores": leaf_score_means(trees),
    }


def task_traces(trees: Sequence[RolloutTree], label: str) -> list[dict[str, Any]]:
    """One record per task: the question, reference answer, and each rollout's turns, status and reward."""
    out = []
    for t in trees:
        rollouts = []
        for leaf in t.leaves():
            path = t.path(leaf.node_id)[1:]
            rollouts.append(
                {
                    "turns": [t.nodes[i].content for i in path],
                    "status": leaf.status.value,
                    "reward": leaf.reward,
                    **({"scores": leaf.scores} if leaf.scores else {}),
                }
            )
        out.append(
            {
                "mode": label,
                "prompt_id": t.prompt.prompt_id,
                "source": t.prompt.source,
                "question": t.prompt.text,
                "answer": t.prompt.answer,
                "rollouts": rollouts,
            }
        )
    return out


def task_outcomes(traces: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per task 1.0 if any of its rollouts succeeded (reward > 0.5), else 0.0: the study's bootstrap resamples these."""
    return {str(t["prompt_id"]): float(any(r["reward"] > 0.5 for r in t["rollouts"])) for t in traces}


Runner = Callable[[Sequence[Any], int, float, int], tuple[list[RolloutTree], BudgetLedger]]


def evaluate_prompts(
    run: Runner, prompts: Sequence[Any], samples: int, temperature: float, seed: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy pass@1 and, if ``samples`` > 0, pass@k / avg@k at ``temperature``; returns (metrics, traces)."""
    trees, led = run(prompts, 1, 0.0, seed)
    greedy = summarize(trees, led)
    metrics: dict[str, Any] = {"greedy": greedy, "accuracy": greedy["pass_at_k"]}
    traces = task_traces(trees, "greedy")
    if samples > 0:
        trees, led = run(prompts, samples, temperature, seed + 1)
        metrics["sampled"] = summarize(trees, led)
        metrics[f"pass@{samples}"] = metrics["sampled"]["pass_at_k"]
        metrics[f"avg@{samples}"] = metrics["sampled"]["avg_at_k"]
        traces += task_traces(trees, f"sampled_t{temperature:g}")
    return metrics, traces


def local_runner(model_cfg: Any, sampler_cfg: Any, env_cfg: Any) -> Runner:
    """Rollouts in this process (no Ray): the real engine, sampler, sandbox and verifier."""
    from tracerl.workflows.lm.stack import build_stack  # slow to import: torch, transformers

    stack = build_stack(model_cfg, sampler_cfg, env_cfg, seed=0)

    def run(
        prompts: Sequence[Any], k: int, temperature: float, seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        eng = stack.engine
        eng.seed, eng.step, eng.ledger = seed, None, BudgetLedger()  # evaluation keys: no step
        base = eng.limits
        eng.limits = replace(base, temperature=temperature)
        try:
            trees = eng.rollout(list(prompts), [k] * len(prompts))
        finally:
            eng.limits = base
        return trees, eng.ledger

    return run


@dataclass(frozen=True)
class EvalResult:
    """What ``tracerl eval`` measured (``summary``, as written to summary.json) and where it wrote it."""

    summary: dict[str, Any]
    """``model``, ``task_set``, ``accuracy`` (greedy pass@1), ``greedy`` (and ``sampled``) summaries,
    ``pass@k`` and ``avg@k`` with samples."""
    samples: int
    temperature: float
    out_dir: Path

    @property
    def accuracy(self) -> float:
        return float(self.summary["accuracy"])

    def format(self) -> str:
        s, g, k = self.summary, self.summary["greedy"], self.samples
        line = f"{s['model']} on {g['tasks']} tasks: greedy pass@1 {self.accuracy:.3f}"
        if k:
            line += f", pass@{k} {s[f'pass@{k}']:.3f}, avg@{k} {s[f'avg@{k}']:.3f} (T={self.temperature:g})"
        return "\n".join(
            [
                line,
                "  greedy by source: " + ", ".join(f"{src} {v:.2f}" for src, v in g["by_source"].items()),
                f"wrote {self.out_dir / 'summary.json'} and {self.out_dir / 'traces.jsonl'}",
            ]
        )


def run_eval(cfg: Any, progress: Callable[[str], None] = lambda s: None) -> EvalResult:
    """``tracerl eval``: resolve the model, evaluate, write summary.json and traces.jsonl under ``cfg.out_dir``."""
    check_data(cfg.env)  # first: before the model is resolved (which may read MLflow) or loaded
    # slow to import: torch, transformers (lm.stack), mlflow (model_registry); after check_data, which fails fast
    from tracerl.workflows.lm.stack import task_prompts
    from tracerl.workflows.tracking.model_registry import resolve_model_path

    progress(trk.where(cfg.tracking))  # where runs:/ and models:/ paths are looked up
    path = resolve_model_path(cfg.model.path, trk.resolved(cfg.tracking), progress)
    model_cfg = replace(cfg.model, path=path)
    prompts = task_prompts(cfg.env, held_out=cfg.split == "held_out")
    task_set = f"{cfg.env.name}:{getattr(env_section(cfg.env), 'tasks', 'tasks')}"
    progress(
        f"evaluating {path} on {len(prompts)} {cfg.split.replace('_', '-')} tasks ({task_set}): greedy"
        + (f", then {cfg.samples} samples at T={cfg.temperature:g}" if cfg.samples else "")
    )
    passes = bar(progress, 2 if cfg.samples else 1, f"eval on {len(prompts)} tasks", "pass")
    runner = local_runner(model_cfg, cfg.sampler, cfg.env)

    def run(*args: Any) -> Any:  # one rollout call per pass (greedy, then sampled): the bar counts them
        try:
            return runner(*args)
        finally:
            passes.update()

    with passes:
        metrics, traces = evaluate_prompts(run, prompts, cfg.samples, cfg.temperature, cfg.seed)
    metrics["model"] = path
    metrics["task_set"] = task_set
    metrics["split"] = cfg.split
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(metrics, indent=2))
    with open(out / "traces.jsonl", "w") as f:
        for r in traces:
            f.write(json.dumps(r) + "\n")
    return EvalResult(metrics, cfg.samples, cfg.temperature, out)
