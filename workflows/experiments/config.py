"""Config schemas of the experiments' commands: ``bench peer``, ``bench limit``, ``bench sync``, ``bench update`` and
``bench testbeds`` (the schemas of a room's commands live in its ``config.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tracerl.config import TrainConfig
from tracerl.schema import check, check_flat_keys, flattened


@dataclass(frozen=True)
class BenchUpdateConfig:
    """``tracerl bench update``: one learner update of a chosen shape, chunked and unchunked log-probs."""

    vocab: int = 151936
    hidden: int = 64
    layers: int = 2
    tokens: int = 8192
    """Tokens of the update's batch."""
    seq_len: int = 2048
    """Tokens of each sequence (half prompt, half loss tokens)."""
    micro_tokens: int = 0
    """``loss.micro_tokens`` of the update; 0: the whole batch in one micro-batch."""
    logit_chunks: list[int] | None = None
    """``loss.logit_chunk`` of each case, one subprocess each (0: the unchunked full-logits path)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (bfloat16: autocast over the float32 master weights)."""
    updates: int = 2
    max_gb: float = 16.0
    """Address-space cap of each case's subprocess, GB (1e9 bytes); 0: none."""
    seed: int = 0
    json_path: str | None = None
    bench_out: str = "bench_out/update"
    startup_ranks: int = 0
    """> 0: measure a run's set-up instead of an update: the host memory each of this many FSDP ranks takes to load
    the model, every rank reading it or rank 0 alone (workflows/experiments/rank_load.py)."""

    def __post_init__(self) -> None:
        check(
            min(self.vocab, self.hidden, self.layers, self.tokens, self.seq_len, self.updates) >= 1,
            "vocab, hidden, layers, tokens, seq_len and updates must be >= 1",
        )
        check(self.hidden % 32 == 0, f"hidden must be a multiple of 32 (heads of 32; got {self.hidden})")
        check(self.tokens % self.seq_len == 0, f"tokens ({self.tokens}) must be a multiple of seq_len")
        check(self.micro_tokens >= 0 and self.max_gb >= 0, "micro_tokens and max_gb must be >= 0")
        check(all(c >= 0 for c in self.chunks), f"logit_chunks must be >= 0 (got {self.logit_chunks})")
        check(self.startup_ranks != 1 and self.startup_ranks >= 0, "startup_ranks must be 0 (off) or >= 2")

    @property
    def chunks(self) -> list[int]:
        return [1024, 0] if self.logit_chunks is None else list(self.logit_chunks)


@check_flat_keys
@dataclass(frozen=True)
class BenchLimitConfig:
    """``tracerl bench limit``: the embedded default's step at its limit, next to a real step."""

    train: TrainConfig = flattened(TrainConfig)
    """The setup (its keys at the top level): conf/bench/limit.yaml holds conf/train/default.yaml's."""
    warmup_steps: int = 1
    """Steps left out at the start of the real run (the last step is always left out)."""
    repeats: int = 5
    """Timed repeats of each microbenchmark (the least is kept; one untimed run before)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/limit"
    """Where results.json and the run go."""

    def __post_init__(self) -> None:
        steps = self.train.steps
        check(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(
            steps is not None and steps >= self.warmup_steps + 2,
            f"steps ({steps}) must be at least warmup_steps + 2 ({self.warmup_steps + 2}): the first "
            f"{self.warmup_steps} and the last are not measured",
        )
        check(self.repeats >= 1, f"repeats must be >= 1 (got {self.repeats})")
        check(self.train.resume is None, "bench limit starts a fresh run; resume is not allowed")
        check(
            self.train.sampler.backend == "hf" and self.train.env.name == "math",
            "bench limit models the embedded default: sampler.backend=hf, env.name=math "
            f"(got {self.train.sampler.backend}, {self.train.env.name})",
        )
        check(
            self.train.pipeline.mode == "barrier" and not self.train.pipeline.overlap,
            "bench limit composes a barrier step: pipeline.mode=barrier, pipeline.overlap=false",
        )


@dataclass(frozen=True)
class BenchTestbedsConfig:
    """``tracerl bench testbeds``: acceptance numbers and depth profiles of the study's testbeds."""

    testbeds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> {family: math or search, model_path, late: true for a -late testbed (its acceptance adds the depth
    and choice criteria)}."""
    eval_tasks: int = 200
    """Held-out tasks per testbed (the study's eval set)."""
    task_seed: int = 0
    """Seed of the generated tasks (math) or world (search), as env.*.task_seed of the study's train configs."""
    top_k: int = 2
    """search: passages per search (env.search.top_k of conf/env/search.yaml)."""
    accuracy_range: tuple[float, float] = (0.15, 0.60)
    min_late_failures: float = 0.5
    """-late testbeds: the least share of greedy failures that first go wrong at turn 2 or later."""
    late_range: tuple[float, float] = (0.3, 0.7)
    """-late testbeds: where the median probability of the premature answer must lie."""
    only: str | None = None
    """Comma-separated testbed names to measure (``--only``); all when null."""
    out_dir: str = "bench_out/testbeds"
    """Where results.json goes (``--out``)."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""

    def __post_init__(self) -> None:
        if not self.testbeds:
            raise ValueError("testbeds is empty: give name -> {family, model_path, late}")
        for name, tb in self.testbeds.items():
            if tb.get("family") not in ("math", "search") or not tb.get("model_path"):
                raise ValueError(f"testbed {name}: needs family (math or search) and model_path (got {tb})")
        unknown = set(self.names()) - set(self.testbeds)
        if unknown:
            raise ValueError(
                f"--only names unknown testbeds {sorted(unknown)}; known: {sorted(self.testbeds)}"
            )
        if self.eval_tasks < 1:
            raise ValueError(f"eval_tasks must be >= 1 (got {self.eval_tasks})")

    def names(self) -> list[str]:
        return [n.strip() for n in self.only.split(",") if n.strip()] if self.only else list(self.testbeds)


SIDES = ("trl", "grpo", "trace", "grpo-ray", "trace-ray")
THREADS_MARK = "@"
"""A side named ``<side>@T`` runs with T torch threads (``trl@2``); a bare name, with ``torch_threads``."""


def split_side(side: str) -> tuple[str, int | None]:
    """``trl@2`` -> ("trl", 2); ``grpo`` -> ("grpo", None). A suffix that is not a positive integer gives 0."""
    base, mark, t = side.partition(THREADS_MARK)
    if not mark:
        return base, None
    return base, int(t) if t.isdigit() and int(t) > 0 else 0


@check_flat_keys
@dataclass(frozen=True)
class BenchPeerConfig:
    """``tracerl bench peer``: TRL's GRPO trainer and tracerl's grpo and trace side by side on one setup."""

    train: TrainConfig = flattened(TrainConfig)
    """The training setup every side runs (its keys at the top level); ``eval_every`` > 0 adds accuracy curves."""
    sides: list[str] = field(default_factory=lambda: list(SIDES[:3]))
    """Which of trl, grpo, trace, grpo-ray, trace-ray to run (``--sides trl,grpo``): grpo and trace run
    ``tracerl train`` in-process, their ``-ray`` twins on an embedded Ray (``side_mode``). ``side@T`` runs a side
    with T torch threads instead of ``torch_threads`` (``--sides trl@1,trl@2,grpo@1,grpo@2``: each side at both
    counts, interleaved; the summary's ``best`` picks each side's fastest)."""
    seeds: int = 3
    """Seeds per side (seed, seed + 1, ...); the sides' order rotates by one each seed."""
    interleave: Literal["seed", "step"] = "seed"
    """How the sides share the machine. ``seed``: one whole run after another. ``step``: a seed's sides start one
    after another, then take turns a step each (the others paused between their steps; ``tracerl.workflows.ops.turns``),
    so a drift in the machine's speed falls on every side alike. Under ``step`` the sides' processes live side by
    side: memory pages they share (the same venv's libraries) are split between them in each one's PSS, so compare
    memory under ``seed``. In-process sides only (a Ray side's steps run in its workers)."""
    threads: int = 2
    """CPUs every side may use (the first N of this process's affinity)."""
    torch_threads: int = 1
    """torch threads of each side's computing processes, unless the side names its own (``trl@2``): TRL's one
    process and tracerl's trainer worker (OMP_NUM_THREADS and ``trainer.torch_threads``); tracerl's sampler actors
    run one each (``pools.sampler_threads``). More threads than free cores spin against each other: on the busy
    2-core machine TRL's rollouts took 1.4-10 s a call with 2 threads and 0.3-0.5 s with 1 (docs/results/peer.md)."""
    warmup_steps: int = 1
    """Steps left out of the per-step means (the first step pays for lazy set-up)."""
    target: float | None = None
    """Held-out accuracy whose wall time is reported (with ``eval_every`` > 0); null: 90% of the way from the start
    to the first side's final accuracy (``tracerl.workflows.experiments.curves.target_accuracy``)."""
    sample_s: float = 0.5
    """Seconds between PSS samples of a side's process tree."""
    peer_python: str = ".venv-peer/bin/python"
    """The interpreter of the venv holding TRL (``make bench-peer`` builds it), relative to the repository."""
    json_path: str | None = None
    """Write the JSON summary here as well (``--json``)."""
    bench_out: str = "bench_out/peer"
    """Where results.json, the sides' configs, logs and runs go."""

    def __post_init__(self) -> None:
        unknown = [s for s in self.sides if split_side(s)[0] not in SIDES or split_side(s)[1] == 0]
        check(
            not unknown and bool(self.sides),
            f"sides must name some of {', '.join(SIDES)}, each optionally with {THREADS_MARK}T for T torch threads "
            f"(got {self.sides})",
        )
        check(len(set(self.sides)) == len(self.sides), f"sides names a side twice (got {self.sides})")
        check(self.seeds >= 1, f"seeds must be >= 1 (got {self.seeds})")
        check(self.threads >= 1, f"threads must be >= 1 (got {self.threads})")
        check(self.torch_threads >= 1, f"torch_threads must be >= 1 (got {self.torch_threads})")
        check(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        check(
            self.train.steps is not None and self.train.steps > self.warmup_steps,
            f"steps ({self.train.steps}) must be set and exceed warmup_steps ({self.warmup_steps})",
        )
        check(self.sample_s > 0, f"sample_s must be > 0 (got {self.sample_s})")
        check(self.train.resume is None, "bench peer starts fresh runs; resume is not allowed")
        ray = [s for s in self.sides if split_side(s)[0].endswith("-ray")]
        check(
            self.interleave == "seed" or not ray,
            f"interleave=step runs in-process sides only; run {', '.join(ray)} with interleave=seed",
        )


@dataclass(frozen=True)
class BenchSyncConfig:
    """``tracerl bench sync``: weight pushes of a model of a chosen size to ``samplers`` hf sampler actors."""

    vocab: int = 32768
    hidden: int = 1024
    layers: int = 11
    """With the defaults: 252 M parameters, 0.50 GB in bfloat16."""
    intermediate: int = 0
    """MLP width; 0: 4 x hidden."""
    samplers: int = 2
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    """The samplers' dtype (``model.dtype`` of a run); the sender keeps float32 master weights."""
    bucket_mb: int = 256
    """``trainer.push_bucket_mb`` of the push (where the push is bucketed)."""
    pushes: int = 3
    """Pushes; the first is a warm-up (not in the mean seconds)."""
    sampler_threads: int = 1
    object_store_mb: int = 512
    """Object store of the embedded Ray (``cluster.object_store_memory_mb``; the local cluster's default)."""
    sample_ms: float = 5.0
    """Interval of the RSS-sampling threads."""
    seed: int = 0
    json_path: str | None = None
    bench_out: str = "bench_out/sync"

    def __post_init__(self) -> None:
        check(
            min(self.vocab, self.hidden, self.layers, self.samplers, self.pushes, self.bucket_mb) >= 1,
            "vocab, hidden, layers, samplers, pushes and bucket_mb must be >= 1",
        )
        check(self.hidden % 64 == 0, f"hidden must be a multiple of 64 (heads of 64; got {self.hidden})")
        check(self.intermediate >= 0 and self.sample_ms > 0, "intermediate must be >= 0 and sample_ms > 0")
        check(self.object_store_mb >= 64, "object_store_mb must be >= 64")
