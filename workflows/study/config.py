"""Config schemas of ``sweep`` and ``study`` (the schemas of a room's commands live in its ``config.py``; the
platform holds only what the engine and the training step read: ``tracerl.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tracerl import metrics as M
from tracerl.actors.config import ClusterConfig, TrackingConfig
from tracerl.config import TrainConfig
from tracerl.schema import check, check_choices, check_flat_keys, flattened


@check_flat_keys
@dataclass(frozen=True)
class SweepConfig:
    """``tracerl sweep``: Ray Tune + Optuna over the budget shape; every trial a full ``train`` run.

    Leaf mode (default): the total leaf budget ``budget.num_leaves`` = L stays fixed, a trial's continuation
    multiplier N sets the bare-rollout budget M = L / (1 + N). Choices for N must divide L.
    Token mode (``budget.token_budget=T``): every trial spends about T generated tokens a step; its L is re-set
    each step from T and its own mean tokens per leaf (``BudgetConfig.for_tokens``), so a shape whose leaves
    are cheaper (continuations re-use prefixes) gets more of them; L = num_leaves on the first step.
    """

    train: TrainConfig = flattened(TrainConfig)
    """Every trial's training setup (its keys at the top level), the trial's sampled values set on top."""
    space: dict[str, Any] = field(
        default_factory=lambda: {"budget.continuations": [1, 2, 3], "allocator.m_max": [4, 8, 16]}
    )
    """Dotted config key -> a list of choices, or {low, high[, log]} for a float range; group keys such as
    'allocator' choose a conf/ file by name."""
    num_samples: int = 4
    """Trials."""
    max_concurrent_trials: int = 1
    metric: str = M.EFFECTIVE_RATIO
    """Reported every step; the scheduler and the best-trial choice use it."""
    mode: Literal["max", "min"] = "max"
    scope: Literal["last", "avg", "all"] = "avg"
    """Which of a trial's reports rank it: 'last', 'avg' (over its steps) or 'all' (its best)."""
    scheduler: Literal["fifo", "asha"] = "fifo"
    """'fifo' (every trial runs to the end) or 'asha' (stops trials that trail at the rungs)."""
    grace_period: int = 3
    """ASHA: steps before a trial can be stopped."""
    trial_cpus: float = 0.05
    """CPUs the trial's driver holds (its Ray Train workers and actor pools reserve their own)."""
    sweep_name: str | None = None
    """Names the Tune experiment under out_dir/sweeps/; running again with the same name resumes it."""
    first_trials: list[dict[str, Any]] = field(default_factory=list)
    """Configurations tried first, before Optuna samples (Optuna's points_to_evaluate), e.g. a known-good shape;
    each maps space keys to values and counts toward num_samples."""

    def __post_init__(self) -> None:
        check_choices(self, "")
        check(
            self.scheduler != "asha" or self.train.steps is not None,
            "scheduler=asha stops trials at rungs counted in steps: set steps",
        )
        check(
            self.num_samples >= 1 and self.max_concurrent_trials >= 1,
            "num_samples and max_concurrent_trials must be >= 1",
        )
        check(bool(self.space), "space must name at least one key to sweep")
        for key, dom in self.space.items():
            check(
                isinstance(dom, list)
                and len(dom) >= 1
                or isinstance(dom, dict)
                and {"low", "high"} <= set(dom),
                f"space.{key} must be a list of choices or {{low, high, log}} (got {dom!r})",
            )
        for point in self.first_trials:
            check(
                isinstance(point, dict) and set(point) <= set(self.space),
                f"first_trials entries must map keys of space ({sorted(self.space)}) to values (got {point!r})",
            )
        check(
            len(self.first_trials) <= self.num_samples,
            "first_trials must not hold more entries than num_samples",
        )
        leaves = self.train.budget.num_leaves
        for n in (
            self.space.get("budget.continuations", [])
            if isinstance(self.space.get("budget.continuations"), list)
            else []
        ):
            check(
                leaves is not None and leaves % (1 + int(n)) == 0,
                f"budget.continuations choice {n}: L = budget.num_leaves = {leaves} must be divisible by 1 + N",
            )


STUDY_BUDGETS = ("leaves", "tokens")


@dataclass(frozen=True)
class StudyConfig:
    """``tracerl study``: a grid of ``train`` runs under one MLflow parent run, resumable (workflows/study/grid.py)."""

    name: str = "study"
    """The study's MLflow parent run name; running again with the same name resumes it."""
    testbeds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> {base: train config YAML (relative to conf/), model_path, token_budget: T or null, overrides: [...]},
    and for a learning-curve study stop_tokens (each cell's ``stop.tokens``) and eval_every_tokens."""
    groups: list[dict[str, Any]] = field(default_factory=list)
    """Grid groups, each {testbeds, budgets (leaves/tokens), allocators, seeds}: the cells are their products."""
    steps: int | None = 20
    """RL steps per cell; with stop_tokens an upper bound (null: none)."""
    eval_tasks: int = 200
    """Held-out tasks per full evaluation (before the first and after the last step)."""
    eval_subset: int = 0
    """A curve study's held-out tasks at its intermediate evaluations (train's ``eval_subset``; 0: all)."""
    hypotheses: list[dict[str, Any]] = field(default_factory=list)
    """A curve study's hypotheses, {claim, allocator, vs, testbeds, expect: win/loss/tie}, checked by its report."""
    parallel_cells: int = 1
    """Cells running at once (each a Ray task); 1 on the embedded Ray and with cluster.address=inprocess."""
    cell_cpus: float = 0.05
    """CPUs a cell's driver task holds (its Train workers and actor pools reserve their own)."""
    bootstrap_samples: int = 2000
    """Resamples of the hierarchical bootstrap (seeds, then held-out tasks within seeds)."""
    out_dir: str = "docs/results"
    """Where study.md, study.json and the plots go (``--out``)."""
    runs_dir: str = "runs/study"
    """Checkpoint storage of the cells' training runs."""
    archive_dir: str | None = None
    """Every finished cell and baseline run kept as a file here, restored into a fresh store (null: none)."""
    json_path: str | None = None
    """Write study.json here as well (``--json``)."""
    only: str | None = None
    """Select cells, e.g. 'testbed=math-habit,allocator=grpo,seed=0' (``--only``)."""
    fresh: bool = False
    """Re-run the selected cells even if they finished (``--fresh``)."""
    report_only: bool = False
    """Rebuild the report from MLflow without running cells (``--report-only``)."""
    fill_tokens: bool = False
    """Write each testbed's T (mean generated tokens per step of its leaves-mode grpo cells) into the config file."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        check((self.steps or 1) >= 1 and self.eval_tasks >= 1, "steps and eval_tasks must be >= 1")
        check(self.parallel_cells >= 1, f"parallel_cells must be >= 1 (got {self.parallel_cells})")
        check(
            self.bootstrap_samples >= 100, f"bootstrap_samples must be >= 100 (got {self.bootstrap_samples})"
        )
        check(bool(self.testbeds), "testbeds must name at least one testbed")
        for name, tb in self.testbeds.items():
            check(
                isinstance(tb, dict) and {"base", "model_path"} <= set(tb),
                f"testbeds.{name} needs base (a train config under conf/) and model_path (got {tb!r})",
            )
            t = tb.get("token_budget")
            check(t is None or int(t) >= 1, f"testbeds.{name}.token_budget must be >= 1 or null (got {t!r})")
        check(bool(self.groups), "groups must hold at least one grid group")
        for i, g in enumerate(self.groups):
            check(
                isinstance(g, dict) and {"testbeds", "budgets", "allocators", "seeds"} <= set(g),
                f"groups[{i}] needs testbeds, budgets, allocators and seeds (got {g!r})",
            )
            for tb in g["testbeds"]:
                check(
                    tb in self.testbeds,
                    f"groups[{i}] names testbed {tb!r}, not one of {sorted(self.testbeds)}",
                )
            for b in g["budgets"]:
                check(b in STUDY_BUDGETS, f"groups[{i}] budget {b!r} must be one of {STUDY_BUDGETS}")
