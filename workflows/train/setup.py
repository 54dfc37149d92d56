"""Set-up and restore of a ``tracerl train`` rank (a Ray Train worker, or the command's own process in the in-process
mode: workflows/train/context.py): the policy (restored from the newest checkpoint, LoRA adapters, gradient
checkpointing, placed by DDP or FSDP2), the frozen reference model, the learner, and what rank 0 needs to continue
(the checkpoint's state). workflows/train/loop.py runs the steps."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.config import TrainConfig
from tracerl.engine.timer import process_tree_cpu_s
from tracerl.models.hf import check_weights, load_policy, load_tokenizer
from tracerl.workflows.tracking.checkpoint_files import damaged, newest_good, problem
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.train.context import TrainContext
from tracerl.workflows.train.push import adapter_pushes, push_policy
from tracerl.workflows.train.shared_storage import check_shared

# Slow imports (torch, transformers, Ray, scipy: seconds) stay inside the functions that use them: this module loads
# with the CLI, which starts without them (docs/results/startup.md).

ADAPTERS = "lora_adapters.pt"  # a LoRA run's checkpoint: its adapters (peft names) beside the merged policy


def say(msg: str) -> None:
    """A progress line from a worker (straight to the process's stdout, which Ray forwards to the driver;
    Ray Train's patched print would log it twice when another library wraps sys.stdout)."""
    out = sys.__stdout__ or sys.stdout
    out.write(msg + "\n")
    out.flush()


@dataclass
class Worker:
    """One rank: its policy (placed), learner and the checkpoint it started from."""

    cfg: TrainConfig
    rank: int
    world: int
    tok: Any
    model: Any
    """The policy as trained (plain, DDP or FSDP2; LoRA-wrapped when trainer.lora_rank > 0)."""
    learner: Any
    """``tracerl.learner.PolicyLearner``."""
    ckpt_dir: str | None
    """The checkpoint restored from (None: a fresh run)."""
    state: CheckpointState
    """That checkpoint's state (step, candidate-pool RNG, tokens spent); step 0 for a fresh run."""
    storage: Path
    """The run's storage directory (checkpoints are written there)."""
    ctx: TrainContext
    """Where it runs (a Ray Train worker or the command's process): reports and checkpoints go through it."""
    pushed: bool = False
    """Whether this launch pushed the policy whole once (a LoRA run with hf samplers then pushes adapters alone)."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        import torch  # slow to import: torch

        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank (a no-op for one worker)."""
        import torch  # slow to import: torch

        if self.world > 1:
            torch.distributed.barrier()

    def push(self, pool: Any) -> None:
        """The policy into ``pool``'s samplers bucket by bucket (rank 0; None on the others, which take part in
        the gathers under FSDP): workflows/train/push.py. The launch's first push is whole; later ones of a LoRA run
        with hf samplers carry the adapters alone (every rank decides alike)."""

        adapters = self.pushed and adapter_pushes(self.cfg.trainer, self.cfg.sampler.backend)
        push_policy(self.model, self.cfg.trainer, pool, self.cfg.model.dtype, adapters)
        self.pushed = True

    def gather(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The policy's HF-named full weights (LoRA adapters merged) and the LoRA adapters alone, on rank 0.

        Under FSDP every rank takes part in the gather (the others get empty dicts); DDP ranks hold full replicas,
        so only rank 0 reads its own."""
        from tracerl.models.wrap import adapter_weights, gather_state, hf_weights  # slow to import: torch

        if self.cfg.trainer.strategy != "fsdp" and self.rank != 0:
            return {}, {}
        state = gather_state(self.model)
        if self.rank != 0:
            return {}, {}
        return hf_weights(state, self.cfg.trainer), adapter_weights(state)


def setup_worker(cfg: TrainConfig, storage: Path, ctx: TrainContext, reported: Iterable[str] = ()) -> Worker:
    """This rank's policy, reference model and learner, restored from the newest complete checkpoint if there is
    one (rank 0 chooses, saying which damaged ones it passed over, except those ``reported`` by the driver)."""
    # slow to import: torch (and learner, models.wrap)
    import torch

    from tracerl.learner import PolicyLearner
    from tracerl.models.wrap import fill_from_rank0, fully_shard_model, is_fsdp, is_meta, skeleton

    rank, world = ctx.rank, ctx.world
    if world > 1:  # before anything is loaded: every rank must see the storage the others write to
        check_shared(storage, rank, world, _all_gather, torch.distributed.barrier)
    torch.manual_seed(cfg.seed + rank)
    ckpt_dir = restore_dir(ctx.checkpoint(), storage, say, reported) if rank == 0 else None
    if world > 1:  # every rank restores the checkpoint rank 0 chose
        box = [ckpt_dir]
        torch.distributed.broadcast_object_list(box, src=0)
        ckpt_dir = box[0]
    state = CheckpointState(step=0)
    if ckpt_dir is not None:
        state = CheckpointState.read(ckpt_dir)
        if rank == 0:
            say(f"restoring from {ckpt_dir} (step {state.step})")
    # FSDP: rank 0 alone reads the weights; the others start from the architecture on the meta device and receive
    # their shards from it (fill_from_rank0), so no rank but 0 ever holds the whole model.
    from_rank0 = world > 1 and cfg.trainer.strategy == "fsdp"
    tok, model = load_model(cfg, ckpt_dir, weights=rank == 0 or not from_rank0)
    whole = (
        model.state_dict() if from_rank0 and rank == 0 else None
    )  # before sharding replaces the parameters
    ref_model = None
    if cfg.loss.kl_coef > 0:  # the initial policy, frozen
        if rank == 0 or not from_rank0:
            _, ref_model = load_policy(cfg.model)
        else:
            ref_model = skeleton(cfg.model.path, getattr(torch, cfg.model.dtype))
        ref_model.requires_grad_(False)
    ref_whole = ref_model.state_dict() if ref_model is not None and from_rank0 and rank == 0 else None
    model = ctx.place(model, cfg)
    device = next(model.parameters()).device
    if from_rank0:
        fill_from_rank0(model, whole, device)
        del whole
    if ref_model is not None:  # sharded like the policy under FSDP (a full frozen replica per GPU otherwise)
        ref_model = ref_model if is_meta(ref_model) else ref_model.to(device)
        ref_model = fully_shard_model(ref_model) if is_fsdp(model) else ref_model
        if from_rank0:
            fill_from_rank0(ref_model, ref_whole, device)
            del ref_whole
    compute = getattr(torch, cfg.model.dtype)
    # FSDP2 casts the gathered parameters itself (its MixedPrecisionPolicy); a replica computes under autocast.
    autocast = compute if compute != getattr(torch, cfg.trainer.master_dtype) and not is_fsdp(model) else None
    # auto: on where sampler and trainer log-probs differ (vLLM's kernels; overlap's one-update-old weights).
    use_is = cfg.loss.importance_sampling == "on" or (
        cfg.loss.importance_sampling == "auto" and (cfg.sampler.backend == "vllm" or cfg.pipeline.overlap)
    )
    learner = PolicyLearner(
        model,
        cfg.optim,
        cfg.loss,
        cfg.steps or 1,  # null (a compute stop): the schedule is constant (checked), its length unused
        pad_id=tok.pad_token_id,
        temperature=cfg.sampler.temperature,
        importance_sampling=use_is,
        ref_model=ref_model,
        autocast=autocast,
    )
    if ckpt_dir is not None:
        own = Path(ckpt_dir) / f"trainer_rank{rank}.pt"
        learner.load_state_dict(
            torch.load(
                own if own.exists() else Path(ckpt_dir) / "trainer_rank0.pt",
                map_location=next(model.parameters()).device,  # a GPU rank: its own device, not the saver's
                weights_only=False,
            )
        )
    return Worker(cfg, rank, world, tok, model, learner, ckpt_dir, state, storage, ctx)


def _all_gather(obj: Any) -> list[Any]:
    import torch  # slow to import: torch

    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def load_model(cfg: TrainConfig, ckpt_dir: str | None, weights: bool = True) -> tuple[Any, Any]:
    """The tokenizer and the trainable policy in ``trainer.master_dtype``: the checkpoint's weights (a LoRA run: its
    adapters on the base policy) or ``model.path``'s, with gradient checkpointing and LoRA as configured. Without
    ``weights``, the architecture alone on the meta device (an FSDP rank but 0: ``fill_from_rank0`` gives it its
    shards)."""
    # slow to import: torch (and models.wrap)
    import torch

    from tracerl.models.wrap import adapter_weights, apply_lora, skeleton

    lora = cfg.trainer.lora_rank > 0
    # a LoRA run restores its adapters onto the base policy below; a full run reads the checkpoint's policy alone
    path = Path(ckpt_dir) / "policy" if ckpt_dir is not None and not lora else Path(cfg.model.path)
    tok = load_tokenizer(cfg.model)
    dtype = getattr(torch, cfg.trainer.master_dtype)  # mixed precision: the master weights
    model: Any
    if not weights:
        model = skeleton(str(path), dtype)
    else:
        from transformers import AutoModelForCausalLM  # slow to import: transformers

        check_weights(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    if cfg.trainer.gradient_checkpointing:  # transformers 5.x renamed it; older versions have only the first
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model = apply_lora(model, cfg.trainer)
    if lora and ckpt_dir is not None and weights:
        saved = torch.load(Path(ckpt_dir) / ADAPTERS, map_location="cpu", weights_only=True)
        missing = set(adapter_weights(model.state_dict())) - set(saved)
        if missing:
            raise RuntimeError(
                f"checkpoint {ckpt_dir} lacks LoRA adapters {sorted(missing)[:3]}: was it saved with "
                f"the same trainer.lora_rank and lora_targets?"
            )
        model.load_state_dict(saved, strict=False)
    return tok, model


def restore_dir(
    ckpt: Any, storage: Path, say: Any = lambda s: None, reported: Iterable[str] = ()
) -> str | None:
    """The newest complete checkpoint: Ray's (after a restart or resume_from_checkpoint) or a newer one in storage.

    A worker that dies right after ``ray.train.report`` may leave a persisted checkpoint the controller never
    registered; its step is in its state.json, so it is found here and nothing done before the death is redone.
    The storage's checkpoints are checked newest first (``tracerl.workflows.tracking.checkpoint_files.newest_good``; a write
    cut short never becomes a checkpoint directory at all), Ray's too when it lies elsewhere (a download): a damaged
    one is passed over, in one line to ``say`` (unless its name is in ``reported``), for the newest that checks out.
    """
    choice = newest_good(storage)  # Ray's checkpoint is one of these on local storage: each is read once
    best = (choice.step, str(choice.path)) if choice.path is not None else None
    bad = {str(p): why for p, why in choice.skipped}
    if ckpt is not None and Path(ckpt.path).parent.resolve() != storage.resolve():
        d = ckpt.to_directory()
        why = problem(Path(d))
        if why is not None:
            bad[d] = why
        elif best is None or CheckpointState.read(d).step > best[0]:
            best = (CheckpointState.read(d).step, d)
    then = f"restoring from {Path(best[1]).name} (step {best[0]})" if best else "starting from model.path"
    for d, why in bad.items():
        if Path(d).name not in set(reported):
            say(damaged(Path(d), why, then))
    return best[1] if best else None


def quiet_train_reports() -> None:
    """Ray Train V2 logs every ``ray.train.report`` with its whole metrics dict at INFO from each rank (a 3 kB line
    a step), through a logger named after its source file; our own progress line already says the step."""
    try:  # slow to import: ray; optional: Ray Train V2's internal layout
        from ray.train.v2._internal.execution import context
    except ImportError:  # pragma: no cover - another Ray layout: leave its logging alone
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def ranks_cpu(w: Worker) -> float:
    """On rank 0: the CPU seconds of every trainer rank's process (and its children) so far; a collective."""
    import torch  # slow to import: torch

    mine = process_tree_cpu_s()
    if w.world == 1:
        return mine
    every: list[Any] = [None] * w.world
    torch.distributed.all_gather_object(every, mine)
    return float(sum(every))
