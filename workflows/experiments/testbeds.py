"""``tracerl bench testbeds``: the acceptance of the study's testbeds, measured on the frozen policy before any RL.

A testbed is a tiny-policy checkpoint and its task family. On the study's held-out tasks (the train runs' eval set:
``generate(eval_tasks, seed=task_seed, held_out=True)``) it measures:

- **greedy accuracy**: one greedy rollout per task through the real engine, environment and verifier;
- **the depth profile**: for each greedy failure, the turn where it first goes wrong: the first tool turn whose
  observation differs from the reference solution's (math: a different value; search: different passages, i.e. a
  query that is not the hop's entity), or the turn that answers (or acts invalidly) where the reference makes another
  call, or a wrong final answer after a reference-exact path; the profile is the share of failures per turn;
- **the choices**: at each decision point, with the reference solution teacher-forced up to it, the policy's
  probability (temperature 1) of the habit's branch at the first token where the habit's turn and the reference's
  next turn differ (the two trained behaviours share their words up to there: ``Thought: I can ...`` against
  ``Thought: I will ...``). ``p_direct``: answering at once at turn 1 (the -habit testbeds' choice); ``p_late``: the
  premature answer after the step where the late habit answers (math: after the first of two or more calls; search:
  after the penultimate hop of a 3- or 4-hop question), over the tasks that have that point.

Acceptance (fixed before any study cell ran, issue 15): greedy accuracy in ``accuracy_range``; on the -late testbeds at
least ``min_late_failures`` of the greedy failures first go wrong at turn 2 or later, and the median ``p_late`` in
``late_range``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.workflows.experiments.config import BenchTestbedsConfig

MARKER = "Observation:"


@dataclass(frozen=True)
class Probe:
    """One held-out task with what the measurement needs from its reference solution."""

    prompt: Any
    """The task's ``Prompt`` (source: its level, e.g. generated-L3)."""
    reference: list[Any]
    """The reference trace as ``Segment``s: prompt, (tool turn, observation) pairs, answer turn."""
    direct_turn: str
    """The -habit branch's turn: the final answer given at once."""
    late_steps: int | None = None
    """Tool turns after which the late habit answers (None: the task has no such point)."""
    late_turn: str | None = None
    """The -late branch's turn: the premature answer."""

    def observations(self) -> list[str]:
        return [s.text.strip() for s in self.reference[2:-1:2]]


def first_wrong_turn(contents: Sequence[str], reference_obs: Sequence[str]) -> int:
    """The 1-based turn where a failed path first leaves the reference solution: the first tool turn whose
    observation is not the reference's at that turn, or a turn without an observation (an answer) before the
    reference answers, or the answer turn after a reference-exact path; a path that stops early on a limit goes
    wrong at its last turn."""
    for k, text in enumerate(contents, start=1):
        if k > len(reference_obs) or MARKER not in text:
            return k
        if text.rsplit(MARKER, 1)[1].strip() != reference_obs[k - 1]:
            return k
    return max(len(contents), 1)


def path_contents(tree: Any) -> list[str]:
    """The turn texts of a tree's first leaf's path (the greedy rollout), root excluded."""
    leaf = tree.leaves()[0]
    return [tree.nodes[i].content for i in tree.path(leaf.node_id)[1:]]


def final_answer(text: str) -> str | None:
    """The answer a turn gives (``Final Answer: ...``), stripped; None for a turn without one."""
    return text.split("Final Answer:", 1)[1].strip() if "Final Answer:" in text else None


def is_premature(contents: Sequence[str], first_wrong: int, late_steps: int | None) -> bool:
    """Whether a failed path went wrong by the late habit: it followed the reference through ``late_steps`` tool
    turns and then answered (whatever value it wrote: the tiny policies also slip when they copy one)."""
    return (
        late_steps is not None
        and first_wrong == late_steps + 1
        and final_answer(contents[first_wrong - 1]) is not None
    )


def depth_profile(turns: Sequence[int]) -> dict[int, float]:
    """Share of failures per first-wrong turn."""
    return {k: turns.count(k) / len(turns) for k in sorted(set(turns))} if turns else {}


def branch_probability(
    score: Callable[[list[int]], list[list[float]]],
    tokenizer: Any,
    context: Sequence[str],
    branch: str,
    other: str,
) -> float:
    """The policy's probability of ``branch`` against ``other`` after ``context`` (segment texts, tokenized one by
    one as in training): the softmax probability (temperature 1) of ``branch``'s token at the first token where the
    two turns' tokens differ, given everything before it. ``score(ids)`` returns next-token log-probabilities per
    position of ``ids``."""
    ctx: list[int] = []
    for text in context:
        ctx += tokenizer(text, add_special_tokens=False)["input_ids"]
    a = tokenizer(branch, add_special_tokens=False)["input_ids"]
    b = tokenizer(other, add_special_tokens=False)["input_ids"]
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        raise ValueError(f"the two turns do not differ in a token: {branch!r} vs {other!r}")
    ids = ctx + a[:i]
    logp = score(ids)[len(ids) - 1]
    return math.exp(logp[a[i]])


def summarize(
    rewards: Sequence[float],
    first_wrong: Sequence[int],
    p_direct: Sequence[float],
    p_late: Sequence[float],
    late: bool,
    cfg: BenchTestbedsConfig,
    premature: int = 0,
) -> dict[str, Any]:
    """The acceptance numbers of one testbed from its per-task measurements (``first_wrong``: the failures;
    ``premature``: greedy failures that went wrong by answering at the late habit's point, :func:`is_premature`)."""
    failures = len(first_wrong)
    late_share = sum(t >= 2 for t in first_wrong) / failures if failures else float("nan")
    out: dict[str, Any] = {
        "tasks": len(rewards),
        "accuracy": sum(rewards) / len(rewards),
        "failures": failures,
        "failures_turn2_or_later": late_share,
        "failures_premature": premature / failures if failures else float("nan"),
        "depth_profile": depth_profile(list(first_wrong)),
        "p_direct_median": statistics.median(p_direct) if p_direct else None,
        "p_late_median": statistics.median(p_late) if p_late else None,
        "late_tasks": len(p_late),
    }
    lo, hi = cfg.accuracy_range
    checks = {"accuracy": lo <= out["accuracy"] <= hi}
    if late:
        checks["failures_turn2_or_later"] = failures > 0 and late_share >= cfg.min_late_failures
        lo, hi = cfg.late_range
        checks["p_late_median"] = out["p_late_median"] is not None and lo <= out["p_late_median"] <= hi
    out["checks"] = checks
    out["accepted"] = all(checks.values())
    return out


def _f(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


def format_table(summary: dict[str, Any]) -> str:
    """The acceptance table and the depth profiles, as markdown."""
    rows = [
        "| testbed | accuracy | failures | first wrong at turn >= 2 | premature answers | median p_direct "
        "| median p_late (tasks) | accepted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["testbeds"].items():
        bad = [k for k, ok in r["checks"].items() if not ok]
        rows.append(
            f"| {name} | {_f(r['accuracy'])} | {r['failures']} | {_f(r['failures_turn2_or_later'])} "
            f"| {_f(r['failures_premature'])} "
            f"| {_f(r['p_direct_median'])} | {_f(r['p_late_median'])} ({r['late_tasks']}) "
            f"| {'yes' if r['accepted'] else 'no: ' + ', '.join(bad)} |"
        )
    turns = sorted({int(k) for r in summary["testbeds"].values() for k in r["depth_profile"]})
    rows += [
        "",
        "Depth profile: share of greedy failures by the turn where they first go wrong.",
        "",
        "| testbed | " + " | ".join(f"turn {k}" for k in turns) + " |",
        "|---|" + "---|" * len(turns),
    ]
    for name, r in summary["testbeds"].items():
        prof = {int(k): v for k, v in r["depth_profile"].items()}
        rows.append(f"| {name} | " + " | ".join(_f(prof.get(k, 0.0)) for k in turns) + " |")
    return "\n".join(rows)
