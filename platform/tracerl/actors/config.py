"""Config schemas of the distributed side: Ray, the Ray Train workers, the actor pools, MLflow tracking, and the
fault injection and chaos drill that exercise them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tracerl.schema import check, check_choices


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs are logged (MLflow)."""

    enabled: bool = True
    """Log to MLflow at all. ``tracerl train`` with false logs to files under the run's storage instead
    (``metrics.jsonl``, one line per step; ``params.json``; ``artifacts/``) and cannot be resumed or registered."""
    uri: str | None = None
    """MLflow tracking URI (a SQLite file, a server URL, a file store); null: $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db."""
    artifact_location: str = "mlartifacts"
    """Artifact root for experiments created here (a local directory or an object-store URI)."""
    experiment: str = "tracerl"
    """Experiment name."""
    flush_timeout_s: float = 120.0
    """How long ``tracerl train`` waits for a tracking server that stops answering where it cannot spool: while it
    sets the run up (experiment, run, params; then one line and exit 2) and at the end, for the metrics spooled
    during an outage and the final status (then the run is left RUNNING in the store, its final status kept with
    the spool, exit 75, and ``tracerl sync RUN`` sends both once the server is back; docs/reliability.md)."""

    def __post_init__(self) -> None:
        check(
            self.flush_timeout_s >= 0, f"tracking.flush_timeout_s must be >= 0 (got {self.flush_timeout_s})"
        )


IN_PROCESS = "inprocess"
"""``cluster.address`` of the in-process mode: no Ray at all."""


@dataclass(frozen=True)
class ClusterConfig:
    """How Ray is reached, or that it is not used at all (``tracerl train`` in-process)."""

    address: str = "local"
    """'local' starts an embedded Ray; 'auto' or 'ray://host:10001' joins a cluster; 'inprocess' (``tracerl train``
    and the cells of ``tracerl study``) runs the trainer, one sampler and its environment inside the command's process with no Ray: one rank on the
    CPU, the sampler's own policy copy, tools and grading in this process's subprocesses. It trains the same trees as
    the Ray mode with the same ``pools.rollout_workers`` (run one shard after another; 1: one batch, fewer
    forwards); ``pools.rollout_cpus``, ``env_workers``, ``env_cpus``, ``max_retries`` and the rest of this section
    are unused, and torch runs ``trainer.torch_threads`` threads for both (null: torch's default, one per core).
    It refuses what needs more than one process: trainer.num_workers > 1, GPUs, sampler.backend=vllm, faults and
    the chaos drill. ``max_failures`` restarts the loop in-process from the newest intact checkpoint."""
    num_cpus: int | None = None
    """CPUs for an embedded Ray (null: all)."""
    object_store_memory_mb: int = 512
    """Object store size for an embedded Ray."""
    include_dashboard: bool = False
    """Start the dashboard with an embedded Ray (needed for Ray Jobs)."""

    def __post_init__(self) -> None:
        check(self.num_cpus is None or self.num_cpus >= 1, "cluster.num_cpus must be >= 1 or null")
        check(self.object_store_memory_mb >= 64, "cluster.object_store_memory_mb must be >= 64")

    @property
    def in_process(self) -> bool:
        """No Ray: ``tracerl train`` runs everything in its own process (``address: inprocess``)."""
        return self.address == IN_PROCESS


@dataclass(frozen=True)
class TrainerConfig:
    """The Ray Train workers that hold the policy."""

    num_workers: int = 1
    """Data-parallel workers (DDP/FSDP ranks)."""
    cpus_per_worker: float = 0.5
    """CPUs reserved per worker (fractional on the embedded default so actors fit beside it)."""
    use_gpu: bool = False
    """One GPU per worker, NCCL; CPU workers use gloo."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """'ddp' (full replica per rank; small models) or 'fsdp' (FSDP2 ``fully_shard`` per decoder block: weights, grads
    and optimizer state sharded over the ranks; large models; runs on CPU with gloo too)."""
    gradient_checkpointing: bool = False
    master_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the trainer's parameters, gradients and optimizer state; the forward and backward run in
    ``model.dtype`` (what the samplers run). float32 master weights with model.dtype=bfloat16 is mixed precision
    (FSDP2's MixedPrecisionPolicy, autocast under DDP): an update smaller than about |w|/256, which bfloat16
    weights round away (most of them at an 8B model's lr of 1e-6), still lands. Set it to model.dtype for pure
    low-precision training (half the trainer memory, at that cost)."""
    torch_threads: int | None = None
    """torch intra-op threads of each trainer worker; null: what Ray gives the worker (its OMP_NUM_THREADS: the
    CPUs it reserves, rounded down, at least 1). Logged as the run's param ``threads/trainer``."""
    lora_rank: int = 0
    """> 0 trains LoRA adapters of this rank through peft instead of all weights (base frozen); samplers and
    checkpoints get the merged weights, and a checkpoint also keeps the adapters (lora_adapters.pt) for resume."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the update is (lora_alpha / lora_rank) * B A."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear layers that get adapters (checked against the model at start)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each trainer worker asks for besides its CPUs (and GPU), e.g. ``{node1: 0.01}`` to place
    the trainer on the node started with ``--resources='{"node1": 1}'``. Empty: any node."""
    collective_timeout_s: int = 86400
    """Timeout of the trainer ranks' process group (Ray Train's ``TorchConfig.timeout_s``, whose default is 1800 s):
    ranks 1..n wait in a broadcast while rank 0 rolls out, scores and collates, so it must exceed the longest rollout
    phase. The default, a day, is past any step's rollouts; a lower value ends a hung collective sooner."""
    push_bucket_mb: int = 256
    """Size of a weight push's buckets, MB (2^20 bytes): after each update the policy leaves the trainer in buckets
    of at most this many bytes in ``model.dtype`` (a larger tensor goes alone), each its own object in Ray's object
    store, loaded by every sampler and freed before the next but one is put (workflows/train/push.py). Peak extra
    memory of the push on rank 0 is about two buckets; smaller buckets lower it, at more round trips."""
    push_transport: Literal["ray", "nccl"] = "ray"
    """How a weight push reaches the samplers: 'ray' (buckets through Ray's object store, any sampler) or 'nccl'
    (trainer rank 0 broadcasts each tensor to the sampler engines' GPUs over a NCCL group of their own, vLLM's weight
    transfer: tracerl/actors/collective.py; needs sampler=vllm, trainer.use_gpu and pools.rollout_gpus > 0; not
    yet run on a GPU here)."""
    gpu_memory_gb: float | None = None
    """Memory of one trainer GPU in GB (1e9 bytes), e.g. 80 for an H100/A100 80GB. Set with ``use_gpu``, a run is
    refused before it starts when the update's largest micro-batch (``loss.micro_tokens``, or
    ``loss.micro_batch_size`` sequences, and never less than ``sampler.max_context_tokens``) does not fit 90 % of it
    by the memory estimate (workflows/ops/gpu_plan.py); the message gives the largest budget that fits. null: no
    check."""

    def __post_init__(self) -> None:
        check_choices(self, "trainer")
        check(self.num_workers >= 1, f"trainer.num_workers must be >= 1 (got {self.num_workers})")
        check(self.cpus_per_worker > 0, "trainer.cpus_per_worker must be > 0")
        check_resources("trainer.resources", self.resources)
        check(
            self.torch_threads is None or self.torch_threads >= 1,
            f"trainer.torch_threads must be >= 1 or null (got {self.torch_threads})",
        )
        check(self.lora_rank >= 0, "trainer.lora_rank must be >= 0")
        check(self.push_bucket_mb >= 1, f"trainer.push_bucket_mb must be >= 1 (got {self.push_bucket_mb})")
        check(
            self.collective_timeout_s >= 1,
            f"trainer.collective_timeout_s must be >= 1 (got {self.collective_timeout_s})",
        )
        check(
            self.gpu_memory_gb is None or self.gpu_memory_gb > 0,
            f"trainer.gpu_memory_gb must be > 0 or null (got {self.gpu_memory_gb})",
        )
        check(
            self.lora_rank == 0 or (self.lora_alpha > 0 and len(self.lora_targets) > 0),
            "trainer.lora_alpha must be > 0 and trainer.lora_targets non-empty when trainer.lora_rank > 0",
        )


def check_resources(key: str, resources: dict[str, float]) -> None:
    """Custom resources: names other than CPU, GPU and memory (their own keys set those), amounts > 0."""
    for name, amount in resources.items():
        check(
            name not in ("CPU", "GPU", "memory", "object_store_memory"),
            f"{key}.{name}: set CPUs and GPUs with their own keys; this one is for custom resources",
        )
        check(amount > 0, f"{key}.{name} must be > 0 (got {amount})")


@dataclass(frozen=True)
class PoolConfig:
    """Sampler and environment actor pools."""

    rollout_workers: int = 2
    """Sampler actors; each rolls out a share of the step's prompts (and their continuations)."""
    rollout_cpus: float = 0.5
    rollout_gpus: float = 0.0
    sampler_threads: int | None = None
    """torch intra-op threads of each sampler actor; null: ``rollout_cpus`` rounded down, at least 1. Logged as the
    run's param ``threads/sampler``."""
    env_workers: int = 2
    """Tool-environment actors serving every sampler's tool calls (0: samplers run tools in-process)."""
    env_cpus: float = 0.25
    rollout_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each sampler actor asks for besides its CPUs, e.g. ``{node2: 0.01}`` to place the samplers
    on the nodes started with ``--resources='{"node2": 1}'`` (docs/design.md, "Placement"). Empty: any node."""
    env_resources: dict[str, float] = field(default_factory=dict)
    """The same for the environment actors (tool calls and shared services such as the search retriever)."""
    max_retries: int = 3
    """Times a work item is retried on a fresh actor after the one running it died."""
    lost_node_wait_s: float = 300.0
    """How long a new sampler, environment or service actor may wait while no live node of the cluster has what it
    asks for (its node was lost: ``rollout_resources`` or ``env_resources`` that only that node offered) before the
    run fails in one line naming the missing resource (actors/placement.py); a node that comes back within it takes
    the actor and the run goes on. A slow start on a node that exists is not bounded by it."""

    def __post_init__(self) -> None:
        check(self.rollout_workers >= 1, f"pools.rollout_workers must be >= 1 (got {self.rollout_workers})")
        check(
            self.env_workers >= 0 and self.max_retries >= 0,
            "pools.env_workers and pools.max_retries must be >= 0",
        )
        check(
            self.sampler_threads is None or self.sampler_threads >= 1,
            f"pools.sampler_threads must be >= 1 or null (got {self.sampler_threads})",
        )
        check(
            self.rollout_cpus > 0 and self.env_cpus > 0, "pools.rollout_cpus and pools.env_cpus must be > 0"
        )
        check_resources("pools.rollout_resources", self.rollout_resources)
        check_resources("pools.env_resources", self.env_resources)
        check(
            self.lost_node_wait_s >= 0, f"pools.lost_node_wait_s must be >= 0 (got {self.lost_node_wait_s})"
        )


@dataclass(frozen=True)
class FaultConfig:
    """Fault injection for tests and cluster drills: a real process exit at a given step (-1 = never)."""

    kill_rollout_worker_at_step: int = -1
    """A sampler actor exits during its first rollout call of this step (streaming: on its second call of the step,
    after one round)."""
    kill_env_worker_at_step: int = -1
    """An environment actor exits during its first tool call of this step."""
    kill_trainer_at_step: int = -1
    """Rank 0 exits after logging this step (before the next checkpoint), once per run."""


@dataclass(frozen=True)
class ChaosConfig:
    """The chaos drill (``tracerl train --config conf/train/chaos.yaml``): a controller outside the run SIGKILLs its
    processes at seeded times."""

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
        check(
            min(self.actor_kills, self.trainer_kills, self.server_restarts, self.resume_steps) >= 0,
            "chaos.actor_kills, trainer_kills, server_restarts and resume_steps must be >= 0",
        )
        check(0 <= self.min_gap_s <= self.max_gap_s, "chaos needs 0 <= min_gap_s <= max_gap_s")
        check(
            self.server_down_s >= 0 and self.phase_wait_s > 0,
            "chaos.server_down_s must be >= 0, phase_wait_s > 0",
        )
