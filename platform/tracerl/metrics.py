"""Metric names: namespaced constants, each defined once in docs/metrics.md (a test checks both ways).

Every module logs and reads metrics through these names, never through string literals, so a renamed metric is
one edit here and one in the docs (MLflow comparisons across runs depend on the names staying put). Names that
carry a part (a phase, a depth, a calibration group) are built by the functions below. This module imports no
project module, so anything may import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# -- rollout/ (per step; tracerl.engine.step_stats.step_metrics) -----------------------------------------------------
EFFECTIVE_RATIO = "rollout/effective_ratio"
EFFECTIVE_RATIO_CANDIDATES = "rollout/effective_ratio_candidates"
EFFECTIVE_RATIO_SAMPLED = "rollout/effective_ratio_sampled"
LEAF_EFFECTIVE_RATIO = "rollout/leaf_effective_ratio"
MIXED_GROUPS = "rollout/mixed_groups"
ACTIVE_PROMPTS = "rollout/active_prompts"
CONTRAST_PAIRS_PER_100 = "rollout/contrast_pairs_per_100_leaves"
STEP_CONTRAST_PAIRS_PER_100 = "rollout/step_contrast_pairs_per_100_leaves"
SUCCESS_RATE = "rollout/success_rate"
PREFIX_GROUP_ER = "rollout/prefix_group_effective_ratio"
EXPANDED_PREFIXES = "rollout/expanded_prefixes"
KV_HIT_RATE = "rollout/kv_hit_rate"
ROLLOUT_EM = "rollout/em"
ROLLOUT_F1 = "rollout/f1"

# -- budget/ (per step; the fields of tracerl.engine.ledger.BudgetLedger) ----------------------------------------
BUDGET = "budget/"
"""Prefix of the ledger's counts: ``BudgetLedger.as_metrics`` makes ``budget/<field>`` (one constant each below)."""
LEAVES = "budget/leaves"
LEAF_BUDGET = "budget/leaf_budget"
SAMPLED_LEAVES = "budget/sampled_leaves"
BARE_ROLLOUTS = "budget/bare_rollouts"
CONTINUATIONS = "budget/continuations"
EXTRA_BARE = "budget/extra_bare"
TURNS = "budget/turns"
GENERATED_TOKENS = "budget/generated_tokens"
PREFILL_COMPUTED = "budget/prefill_tokens_computed"
PREFILL_REUSED = "budget/prefill_tokens_reused"
LLM_CALLS = "budget/llm_calls"
TOOL_CALLS = "budget/tool_calls"
TOOL_CALLS_REPLAYED = "budget/tool_calls_replayed"
TOOL_TIMEOUTS = "budget/tool_timeouts"
INVALID_ACTIONS = "budget/invalid_actions"
GRADE_TIMEOUTS = "budget/grade_timeouts"
RETRIED = "budget/retried"
CONTINUATION_PREFILL_COMPUTED = "budget/continuation_prefill_computed"
CONTINUATION_PREFILL_REENCODE = "budget/continuation_prefill_reencode"
KV_LOCAL_CONTINUATIONS = "budget/kv_local_continuations"
KV_REENCODED_CONTINUATIONS = "budget/kv_reencoded_continuations"
DECODE_STEPS = "budget/decode_steps"
DECODE_ROWS = "budget/decode_rows"
SAMPLER_BUSY_S = "budget/sampler_busy_s"

# -- mc/ (per step of trace_mc; tracerl.engine.mc_scorer: Monte-Carlo rollouts, not charged to budget/) ------------
MC_ROLLOUTS = "mc/rollouts"
MC_GENERATED_TOKENS = "mc/generated_tokens"
MC_LLM_CALLS = "mc/llm_calls"
MC_TOOL_CALLS = "mc/tool_calls"
MC_SECONDS = "mc/seconds"

# -- time/ (per step) --------------------------------------------------------------------------------------------
STEP_PHASES = ("score", "allocate_roots", "rollout", "expand_prefixes")
"""Phases of the step driver (tracerl.engine.step)."""
ENGINE_PHASES = ("generate", "tools", "grade")
"""Phases of a language-model rollout engine (tracerl.engine.rollout)."""
TRAIN_PHASES = (
    "select",
    "fit_predictor",
    "collate",
    "broadcast",
    "update_policy",
    "wait_rollouts",
    "sync_weights",
    "eval",
    "log",
    "step",
)
"""Phases of a ``tracerl train`` step (``step`` is the whole step)."""
ALLOC_PREDICTOR_PHASES = ("score", "allocate_roots", "expand_prefixes", "fit_predictor")
"""The phases that make up the allocation and predictor overhead (``ALLOC_PREDICTOR_FRACTION``)."""


def phase_time(phase: str) -> str:
    """``time/<phase>_s``: wall seconds spent in ``phase`` (one of the ``*_PHASES``)."""
    return f"time/{phase}_s"


TIME_STEP = phase_time("step")
TIME_ROLLOUT = phase_time("rollout")
TIME_LOG = phase_time("log")
ALLOC_PREDICTOR_FRACTION = "time/alloc_predictor_fraction"
TIME_OVERLAPPED = "time/overlapped_rollout_s"
TRAIN_STEP_PHASES = ("select", *STEP_PHASES, "broadcast", "update_policy")
"""The phases of ``TIME_TRAIN_STEP``: the step's rollout (select through expand_prefixes) and its update."""
TIME_TRAIN_STEP = "time/train_step_s"
TIME_STARTUP = "time/startup_s"
STARTUP_PHASES = ("launch", "ray", "tracking", "trainer", "policy", "samplers", "eval")
"""The parts of ``TIME_STARTUP``, in order (docs/metrics.md, "time/ (start-up of tracerl train)")."""


def startup_phase(phase: str) -> str:
    """``time/startup_<phase>_s``: wall seconds of one part of the start-up (one of ``STARTUP_PHASES``)."""
    return f"time/startup_{phase}_s"


# -- train/, throughput/, system/, sampler/ (per step of tracerl train) -------------------------------------------
LOSS = "train/loss"
CLIP_FRACTION = "train/clip_fraction"
APPROX_KL = "train/approx_kl"
KL_REF = "train/kl_ref"
ENTROPY = "train/entropy"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
LOSS_TOKENS = "train/loss_tokens"
SEQUENCES = "train/sequences"
SIGNAL_TOKENS = "train/signal_tokens"
UPDATE_SKIPPED = "train/update_skipped"
STALENESS_MEAN = "train/staleness_mean"
STALENESS_MAX = "train/staleness_max"
REWARD_MEAN = "train/reward_mean"
TRAIN_ACCURACY = "train/accuracy"
RESPONSE_TOKENS = "train/response_tokens"
TOKENS_PER_S = "train/tokens_per_s"
IS_WEIGHT_MEAN = "train/is_weight_mean"
IS_TRUNCATED_FRACTION = "train/is_truncated_fraction"
GENERATED_TOKENS_PER_S = "throughput/generated_tokens_per_s"
PEAK_MEMORY_MB = "system/peak_memory_mb"
CPU_S = "system/cpu_s"
ATTEMPT = "system/attempt"
ENGINE_RESTARTS = "sampler/engine_restarts"

# -- total/ and stop/ (per step of tracerl train: the run's compute so far, its compute stop) ---------------------
TOTAL_GENERATED_TOKENS = "total/generated_tokens"
TOTAL_LEAVES = "total/leaves"
TOTAL_CPU_S = "total/cpu_s"
TOTAL_WALL_S = "total/wall_s"
OVERSHOOT_TOKENS = "stop/overshoot_tokens"
OVERSHOOT_CPU_S = "stop/overshoot_cpu_s"

# -- curve/ (tracerl train: one point per evaluation, the MLflow step = total/generated_tokens) -------------------
CURVE_ACCURACY = "curve/accuracy"
CURVE_TASKS = "curve/tasks"
CURVE_LEAVES = "curve/leaves"
CURVE_UPDATES = "curve/updates"
CURVE_WALL_S = "curve/wall_s"
CURVE_CPU_S = "curve/cpu_s"

# -- predictor/ --------------------------------------------------------------------------------------------------
CALIBRATION_STATS = ("mse", "brier", "auc", "ece", "mse_true", "count")
"""What ``tracerl.calibration`` reports per group of anchors."""
FIT_LENGTH_LOG_MSE = "predictor/fit_length_log_mse"
FIT_LENGTH_EXAMPLES = "predictor/fit_length_examples"


def calibration(group: str, stat: str) -> str:
    """``predictor/<group>/<stat>``: calibration of the predictor on a group of anchors (roots, prefixes,
    depth_<t>)."""
    return f"predictor/{group}/{stat}"


def predictor_fit(key: str) -> str:
    """``predictor/fit_<key>``: what the predictor's online fit returned."""
    return f"predictor/fit_{key}"


# -- eval/ and key/ ----------------------------------------------------------------------------------------------
EVAL = "eval/"
"""Prefix of every held-out metric."""
EVAL_ACCURACY = "eval/accuracy"
EVAL_WELL_FORMED = "eval/well_formed_turns"
EVAL_EM = "eval/em"
EVAL_F1 = "eval/f1"
EVAL_GENERATED_TOKENS = "eval/generated_tokens"
EVAL_WALL_S = "eval/wall_s"
EVAL_CPU_S = "eval/cpu_s"
EVAL_TOOL_TIMEOUTS = "eval/tool_timeouts"
EVAL_GRADE_TIMEOUTS = "eval/grade_timeouts"
KEY = "key/"
"""Prefix of the copies that sort together in the MLflow runs table."""
KEY_ACCURACY = "key/accuracy"
KEY_EFFECTIVE_RATIO = "key/effective_ratio"
KEY_GENERATED_TOKENS = "key/generated_tokens"


def eval_source(source: str) -> str:
    """``eval/accuracy/<source>``: held-out accuracy of one task source."""
    return f"{EVAL_ACCURACY}/{source}"


def prefix_group_depth(depth: int) -> str:
    """``rollout/prefix_group_effective_ratio/depth_<t>``."""
    return f"{PREFIX_GROUP_ER}/depth_{depth}"


def kv_hit_rate_depth(depth: int) -> str:
    """``rollout/kv_hit_rate/depth_<t>``."""
    return f"{KV_HIT_RATE}/depth_{depth}"


def answer_score(prefix: str, name: str) -> str:
    """``rollout/<name>`` or ``eval/<name>`` (``prefix``: ``"rollout"``, ``"eval"``) for an environment's answer
    score (search: em, f1)."""
    return f"{prefix}/{name}"


# -- bench/ (summaries of tracerl bench allocation and bench rollout) ---------------------------------------------
def bench(key: str) -> str:
    """``bench/<key>``: a benchmark summary (mean over seeds)."""
    return f"bench/{key}"


def mean_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Key-wise mean over metric dicts that may hold different keys (per-depth metrics come and go)
    and NaN (undefined this step); NaN where no row has a finite value."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        vals = [float(row[key]) for row in rows if key in row and math.isfinite(float(row[key]))]
        out[key] = sum(vals) / len(vals) if vals else float("nan")
    return out
