"""Config schemas of the experiment commands: ``bench allocation|rollout|env|train``, ``sweep``, ``study`` and
``bootstrap``. They compose the component configs the way ``tracerl.config``'s commands do.

``bench train``, ``bench pipeline`` and ``sweep`` run the training setup: each holds a ``TrainConfig`` as its
flattened field ``train`` (``tracerl.schema.flattened``), whose keys their YAML and overrides write at the top
level, beside the command's own keys. Holding it rather than subclassing it keeps a sweep from passing for a train
config: the code hands ``cfg.train`` (or a ``dataclasses.replace`` of it) to ``tracerl.workflows.train.run.train``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tracerl import metrics as M
from tracerl.actors.config import ClusterConfig, TrackingConfig
from tracerl.algos.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.config import LMRolloutFields, PipelineConfig, TrainConfig, TrainPipelineMode, lm_env
from tracerl.engine.config import PipelineMode, SamplerConfig
from tracerl.env_config import EnvConfig
from tracerl.models.config import ModelConfig
from tracerl.schema import check, check_choices, check_flat_keys, flattened


@dataclass(frozen=True)
class BenchEnvConfig:
    """``tracerl bench env``: gold replay, or the policy's pass@1, on an environment's held-out tasks."""

    tool_env_only: ClassVar[bool] = True
    """Runs a language model: ``env`` must be a ReAct tool environment (``Env.tool_env``)."""

    env: EnvConfig = field(default_factory=lm_env)
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy for the policy mode; its ``template`` is the format gold turns are written in."""
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(temperature=0.0))
    """Episode limits; ``temperature`` for the policy mode (0: greedy pass@1)."""
    gold: bool = False
    """Replay the environment's reference actions instead of running the policy."""
    tasks: int = 200
    """Held-out tasks to run (the first N of the environment's held-out prompts)."""
    workers: int = 8
    """Threads running each round's tool calls concurrently (1: one after another)."""
    seed: int = 0
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""

    def __post_init__(self) -> None:
        check(self.tasks >= 1, f"tasks must be >= 1 (got {self.tasks})")
        check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")


@dataclass(frozen=True)
class BenchRolloutConfig(LMRolloutFields):
    """``tracerl bench rollout``: allocators at equal leaves with the frozen tiny policy, predictor learning online."""

    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    allocators: list[str] = field(default_factory=lambda: ["grpo", "pcl", "treepo", "trace"])
    """Allocators to compare."""
    steps: int = 10
    """Steps per allocator."""
    seeds: int = 1
    """Seeds per allocator."""
    seed: int = 0
    warmup_fraction: float = 0.2
    """Leading share of steps left out of the averages."""
    out_dir: str = "bench_out/rollout"
    json_path: str | None = None

    def __post_init__(self) -> None:
        check(self.steps >= 1 and self.seeds >= 1, "steps and seeds must be >= 1")
        check(0.0 <= self.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)")


@dataclass(frozen=True)
class BenchAllocationConfig:
    """``tracerl bench allocation``: every allocator at equal leaf budget on the simulator."""

    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    """Allocator settings shared by every compared allocator (its name is replaced by each in turn)."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The predictor learning online (oracle_trace always uses the oracle)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment; must be the simulator."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """Per-step budget."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray, used to run seeds in parallel when workers > 1."""
    workers: int = 2
    """Parallel runs (Ray tasks); 1 runs everything in this process without Ray."""
    allocators: list[str] = field(
        default_factory=lambda: [
            "grpo",
            "pcl",
            "dapo",
            "treepo",
            "trace_root_only",
            "trace_prefix_only",
            "trace",
            "oracle_trace",
        ]
    )
    """Allocators to compare."""
    steps: int = 150
    """RL steps per run."""
    seeds: int = 5
    """Independent seeds per allocator (CIs are over seeds)."""
    seed: int = 0
    """First seed; runs use seed, seed+1, ..."""
    warmup_fraction: float = 0.2
    """Leading share of steps left out of the averages (the predictor's warm-up)."""
    noise_scales: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    """Feature-noise multipliers for the informativeness sweep (empty: skip the sweep)."""
    noise_allocators: list[str] = field(
        default_factory=lambda: ["grpo", "pcl", "treepo", "trace", "oracle_trace"]
    )
    """Allocators in the informativeness sweep."""
    noise_seeds: int = 2
    """Seeds per point of the informativeness sweep."""
    out_dir: str = "bench_out/allocation"
    """Where the table, PNGs and JSON go."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
        check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(
            0.0 <= self.warmup_fraction < 1.0,
            f"warmup_fraction must be in [0, 1) (got {self.warmup_fraction})",
        )
        check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        check(all(s > 0 for s in self.noise_scales), "noise_scales must be > 0")
        check(self.noise_seeds >= 1, "noise_seeds must be >= 1")
        check(
            self.env.name == "simulator",
            f"bench allocation runs on the simulator; got env.name={self.env.name!r}",
        )


@check_flat_keys
@dataclass(frozen=True)
class BenchTrainConfig:
    """``tracerl bench train``: full training runs of several allocators at equal leaf budget, several seeds."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup every run shares (its keys at the top level); each run sets its allocator and seed."""
    allocators: list[str] = field(default_factory=lambda: ["trace", "grpo"])
    """Allocators to train with (each with the same budget, steps and optimiser)."""
    seeds: int = 3
    """Seeds per allocator (seed, seed + 1, ...)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/train"
    """Where results.json goes."""

    def __post_init__(self) -> None:
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        check(self.train.resume is None, "bench train starts fresh runs; resume is not allowed")


@check_flat_keys
@dataclass(frozen=True)
class BenchPipelineConfig:
    """``tracerl bench pipeline``: barrier vs streaming steps (``pipeline.mode``) on the training setup, frozen
    policy, seeds interleaved (seed s: every mode, then seed s + 1)."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup (its keys at the top level): ``steps`` steps per (seed, mode), seeds from ``seed``."""
    modes: list[PipelineMode] = field(default_factory=lambda: ["barrier", "streaming"])
    """Pipeline modes to compare in allocation-and-rollout steps with the policy frozen ([]: none)."""
    batchings: list[Literal["rounds", "join"]] = field(default_factory=lambda: ["rounds"])
    """How the samplers batch turns in the frozen steps: 'rounds' (one turn of every path per round), 'join'
    (``sampler.join``: per-token join); each mode runs with each (``--batching rounds,join``), seeds interleaved."""
    train_modes: list[TrainPipelineMode] = field(default_factory=lambda: ["barrier", "overlap"])
    """Modes to compare in ``tracerl train`` runs, with the update (overlap needs one; workflows/pipeline/bench_train.py)."""
    train_steps: int = 0
    """Steps of each train run (steps 2 .. train_steps - 1 are measured); 0: no train runs."""
    seeds: int = 3
    """Seeds (seed, seed + 1, ...); each runs ``steps`` steps per mode, the modes' order alternating by seed."""
    warmup_steps: int = 1
    """Steps run first and not measured (actor start-up, the samplers' first forwards)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/pipeline"
    """Where results.json goes."""

    def __post_init__(self) -> None:
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(len(self.modes) + self.train_steps > 0, "modes must name a pipeline mode, or set train_steps")
        check(
            not self.modes or self.train.steps is not None,
            "bench pipeline: set steps (frozen steps per mode)",
        )
        check(len(self.batchings) > 0, "batchings must name 'rounds', 'join' or both")
        check(
            self.train_steps == 0 or (self.train_steps >= 3 and len(self.train_modes) > 0),
            f"train_steps must be 0 or >= 3 with train_modes set (got {self.train_steps}, {self.train_modes})",
        )
        check_choices(self, "")


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


@dataclass(frozen=True)
class BootstrapConfig:
    """``tracerl bootstrap``: build the tiny policy (tokenizer + small LM, supervised warm start)."""

    family: Literal["math", "search"] = "math"
    """Task family the policy is built for: 'math' (generated math tasks, Python tool) or 'search' (the generated
    multi-hop world, search tool; its world is the one of env.search.task_seed = seed)."""
    out_dir: str = "models/tiny-math"
    """Where the HF checkpoint directory goes."""
    seed: int = 0
    """Seeds tasks, initialisation and training (search: also the generated world)."""
    train_tasks: int = 6000
    """Generated training tasks (deduplicated, disjoint from the held-out split)."""
    eval_tasks: int = 200
    """Held-out generated tasks for pass@1."""
    vocab_size: int = 1024
    """BPE vocabulary size."""
    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 6
    intermediate_size: int = 512
    max_positions: int = 1024
    steps: int = 750
    """Optimiser steps (the schedule's length); fixed, so the policy is reproducible from the seed."""
    batch_size: int = 32
    lr: float = 3e-3
    time_budget_s: float | None = 900.0
    """Safety cap: stop training after this many seconds even if steps remain (then the result depends on speed);
    null: no cap (the recipe always runs its fixed number of steps)."""
    habit_steps: int = 0
    """Steps of a second supervised phase on traces where direct_answer_fraction of the answers come without the
    tool (the habit of answering from memory that RL then unlearns); 0 skips it."""
    habit_lr: float = 1e-3
    """Peak learning rate of the habit phase."""
    direct_answer_fraction: float = 0.0
    """Share of the habit phase's traces that answer at once without calling the tool (chosen by a hash of the
    question)."""
    late_answer_fraction: float = 0.0
    """Share of the habit phase's multi-step traces (math: two or more tool calls; search: three or more hops) that
    answer prematurely after an earlier step (math: the first tool output; search: the entity of the penultimate
    hop) instead of finishing, chosen by a hash of the question: the -late testbeds (workflows/bootstrap/habit.py)."""
    init_from: str | None = None
    """A tiny-policy checkpoint directory to start from (its tokenizer and weights) instead of building and
    supervised-training a new one: only the habit phase and the evaluation run (e.g. models/tiny-search, itself
    rebuilt from its seed by its own config)."""
    query_space: bool = False
    """search family: the traces write each query with a leading space (``search[ Name]``; the parser strips it), so
    a name is the same tokens in the query as in the question and the passages (byte-level BPE tokenizes ``" Name"``
    and ``"Name"`` differently, and a tiny model then slips when it copies the name into the query)."""
    eval_temperature: float = 1.0
    """Sampling temperature for sampled pass@1 (greedy accuracy is reported too)."""
    force: bool = False
    """Rebuild even if out_dir already holds a checkpoint."""
    top_k: int = 3
    """search family: passages per search in the rendered traces and the evaluation (match env.search.top_k)."""

    def __post_init__(self) -> None:
        check_choices(self, "")
        check(self.top_k >= 1, f"top_k must be >= 1 (got {self.top_k})")
        check(
            self.train_tasks >= 10 and self.eval_tasks >= 1,
            "bootstrap needs train_tasks >= 10 and eval_tasks >= 1",
        )
        check(self.hidden_size % self.num_heads == 0, "hidden_size must be a multiple of num_heads")
        check(
            self.steps >= 1 and self.batch_size >= 1 and self.lr > 0,
            "steps, batch_size and lr must be positive",
        )
        check(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s must be > 0 or null")
        check(self.habit_steps >= 0 and self.habit_lr > 0, "habit_steps must be >= 0 and habit_lr > 0")
        check(
            self.init_from is None or self.habit_steps > 0,
            "init_from re-uses a trained checkpoint: set habit_steps > 0 (otherwise there is nothing to train)",
        )
        check(
            0.0 <= self.direct_answer_fraction <= 1.0,
            f"direct_answer_fraction must be in [0, 1] (got {self.direct_answer_fraction})",
        )
        check(
            0.0 <= self.late_answer_fraction <= 1.0,
            f"late_answer_fraction must be in [0, 1] (got {self.late_answer_fraction})",
        )
