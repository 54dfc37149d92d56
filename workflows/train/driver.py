"""Rank 0's part of ``tracerl train``: the sampler actor pool, the predictor, the allocator, the candidate-pool RNG,
held-out evaluation, the weight sync, checkpoints of its own state and the step's metrics. The step itself, which
calls these in order, is ``workflows.train.run.train_step``."""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.actors.faults import Faults
from tracerl.config import BudgetConfig, TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.engine.step import (
    BareRollouts,
    PlannedStep,
    StepOutcome,
    complete,
    plan_roots,
    roll_out_bare,
    run_step,
)
from tracerl.engine.timer import PhaseTimer
from workflows.tracking.checkpoint_state import CheckpointState
from workflows.tracking.runs import phase_marker
from workflows.tracking.store import resolve_uri
from workflows.train.setup import ADAPTERS, say


def overlaps_next(cfg: TrainConfig, done: int) -> bool:
    """Whether the step after step ``done`` (1-based) starts beside this one's update: with ``pipeline.overlap``,
    unless this step is the last or ends in a checkpoint (a checkpoint then holds no step half done, so a run
    resumed from it repeats the uninterrupted one)."""
    return cfg.pipeline.overlap and done < cfg.steps and done % cfg.checkpoint_every != 0


@dataclass
class Ahead:
    """A step started early (``pipeline.overlap``): its Stage 1 ran before the previous update and its bare
    rollouts run beside it, on the weights of ``version``."""

    budget: BudgetConfig
    planned: PlannedStep
    bare: Future[BareRollouts]
    version: int
    waited: float = 0.0
    """Seconds the previous step waited for the bare rollouts after its update (``time/wait_rollouts_s``)."""

    @property
    def timer(self) -> PhaseTimer:
        return self.planned.timer


class Driver:
    """Rank 0's pools, predictor, allocator and candidate pools, and the run's metric log."""

    def __init__(self, cfg: TrainConfig, run_id: str, storage: Path, tok: Any, model: Any, step: int) -> None:
        """Start the sampler pool (every sampler loads ``model.path``) and build the allocator and predictor."""
        import mlflow
        import numpy as np

        from envs.registry import tool_env_class
        from predictors.length import attach_lengths
        from tracerl.actors.pools import RolloutPool
        from tracerl.actors.spec import WorkerSpec
        from tracerl.algos.allocators import build_allocator
        from tracerl.engine.react import TEMPLATES
        from workflows.lm.stack import make_text_predictor, task_prompts
        from workflows.tracking.spool import MetricLog, next_attempt

        self.cfg, self.run_id, self.storage, self.tok = cfg, run_id, storage, tok
        # The HF model class and config that checkpoints are written with (a LoRA run's base model).
        self.export = model.get_base_model() if hasattr(model, "get_base_model") else model
        mlflow.set_tracking_uri(resolve_uri(cfg.tracking.uri))
        self.client = mlflow.MlflowClient()
        self.metrics = MetricLog(self.client, run_id, storage, next_attempt(storage), say)
        self.metrics.flush()  # what an earlier attempt spooled
        self.mark = phase_marker(storage, cfg.chaos.enabled, step)
        self.faults = Faults.from_config(cfg.faults, storage / ".faults")
        spec = WorkerSpec(cfg.model, cfg.sampler, cfg.env, cfg.pools, faults=self.faults)
        p = cfg.pools
        self.pool = RolloutPool(
            spec,
            p.rollout_workers,
            p.rollout_cpus,
            p.rollout_gpus,
            p.max_retries,
            cfg.seed,
            cfg.pipeline.reencode_queue,
        )
        for w in self.pool.warnings():
            say(f"sandbox: {w}")
        self.allocator = build_allocator(cfg.allocator)
        attach_lengths(self.allocator)  # trace_plus: its length predictor
        template = TEMPLATES.get(cfg.model.template)(tok)
        tools = list(tool_env_class(cfg.env.name).tools)
        self.predictor = make_text_predictor(
            cfg.predictor,
            cfg.seed,
            model,
            tok,
            lambda q: template.prompt(q, tools),
            name=self.allocator.predictor,
            targets=self.allocator.targets,
        )
        self.prompts = task_prompts(cfg.env)
        self.eval_prompts = task_prompts(cfg.env, held_out=True)
        self.rng = np.random.default_rng(cfg.seed)
        # Token mode: generated tokens and leaves so far, for the mean cost of a leaf.
        self.spent = [0.0, 0.0]
        self.version = step
        """The policy version (updates applied) the samplers hold."""
        self.ledgers: dict[int, Any] = {}
        """Each step's budget ledger (an overlapped step's starts before the previous step has logged)."""
        self.overlapped = 0.0
        self._ahead = ThreadPoolExecutor(1, "ahead") if cfg.pipeline.overlap else None

    def restore(self, ckpt_dir: str, state: CheckpointState, weights: dict[str, Any]) -> None:
        """Continue from a checkpoint: candidate-pool RNG, tokens spent, predictor and allocator state, and the
        restored policy pushed to the samplers (a fresh run's samplers already hold ``model.path``)."""
        import torch

        self.rng.bit_generator.state = state.rng
        self.spent = list(state.spent)
        self.predictor.load_state_dict(torch.load(Path(ckpt_dir) / "predictor.pt", weights_only=False))
        if (Path(ckpt_dir) / "allocator.pt").exists():  # trace_plus: its length predictor
            self.allocator.load_state_dict(torch.load(Path(ckpt_dir) / "allocator.pt", weights_only=False))
        self.sync(weights, state.step)

    def select(self, step: int, timer: PhaseTimer) -> tuple[BudgetConfig, list[Any]]:
        """Step ``step``'s budget and candidate pool; the samplers' ledger starts counting for the step."""
        from tracerl.engine.stepper import sample_pool

        with timer("select"):
            budget = self.budget(step)
            pool = sample_pool(self.prompts, budget.num_candidates, self.rng)
            self.pool.begin_step(step)
            self.ledgers[step] = self.pool.ledger
        return budget, pool

    def roll_out(self, step: int, timer: PhaseTimer) -> tuple[StepOutcome, BudgetConfig]:
        """Select, score, allocate roots, roll out, expand prefixes (tracerl/engine/step.py) on the samplers'
        current weights."""
        budget, pool = self.select(step, timer)
        out = run_step(
            pool, self.allocator, self.predictor, self.pool, budget, self.rng, timer, self.cfg.pipeline.mode
        )
        for t in out.sampled_trees:
            t.stamp_version(self.version)
        self.overlapped = 0.0
        return out, budget

    def start_ahead(self, step: int) -> Ahead:
        """Step ``step``'s candidate pool and Stage 1 now, on this thread (the predictor may read the policy,
        which the update is about to change), and its bare rollouts on a background thread."""
        assert self._ahead is not None
        timer = PhaseTimer()
        self.mark("rollout", step + 1)
        budget, pool = self.select(step, timer)
        planned = plan_roots(pool, self.allocator, self.predictor, budget, self.rng, timer)
        return Ahead(budget, planned, self._ahead.submit(roll_out_bare, planned, self.pool), self.version)

    def wait_ahead(self, ahead: Ahead | None) -> None:
        """Wait for ``ahead``'s bare rollouts (before the weights they were sampled with are replaced)."""
        if ahead is not None:
            t0 = time.perf_counter()
            ahead.bare.result()
            ahead.waited = time.perf_counter() - t0

    def finish_ahead(self, ahead: Ahead) -> tuple[StepOutcome, BudgetConfig]:
        """Stage 2 of a step started early, on the new weights: its bare turns keep the version they were
        sampled with, its continuations get the current one."""
        bare = ahead.bare.result()
        self.overlapped = max(0.0, ahead.timer.seconds.get("rollout", 0.0) - ahead.waited)
        sizes = [len(t.nodes) for t in bare.out.sampled_trees]
        out = complete(ahead.planned, bare, self.allocator, self.predictor, self.pool)
        for t, n in zip(out.sampled_trees, sizes):
            t.stamp_version(ahead.version, 1, n)
            t.stamp_version(self.version, n)
        return out, ahead.budget

    def budget(self, step: int) -> BudgetConfig:
        """Step ``step``'s budget (0-based). Token mode: L re-set from the tokens this step may spend and the mean
        tokens of a leaf so far. Unspent tokens carry over: the steps up to this one share ``(step + 1) x T``, so
        the run's mean tokens per step tracks T (an overrun is made up by later steps)."""
        budget = self.cfg.budget
        if budget.token_budget is None or self.spent[1] <= 0:
            return budget
        left = max(1, int(budget.token_budget * (step + 1) - self.spent[0]))
        return replace(budget, token_budget=left).for_tokens(
            self.spent[0] / self.spent[1],
            max_candidates=len(self.prompts),
            min_roots=self.cfg.allocator.m_min,
        )

    def rollout_metrics(self, out: Any, budget: BudgetConfig) -> dict[str, float]:
        """The step's rollout, budget and calibration metrics (before the predictor fits on the new trees); the
        samplers' counts (tokens, tool calls, retries, generation time) join the step's ledger."""
        from tracerl.calibration import collect_calibration, summarize_calibration
        from tracerl.engine.step_stats import step_metrics
        from tracerl.engine.stepper import merge_ledgers
        from workflows.train.evaluate import leaf_score_means

        out.ledger = merge_ledgers(out.ledger, self.pool.ledger)
        self.spent = [self.spent[0] + out.ledger.generated_tokens, self.spent[1] + out.ledger.leaves]
        m = step_metrics(out)
        m[M.LEAF_BUDGET] = float(budget.leaves)
        if self.predictor.ready:
            for group, vals in summarize_calibration(collect_calibration(out)).items():
                m.update({M.calibration(group, k): v for k, v in vals.items()})
        m.update(
            {M.answer_score("rollout", k): v for k, v in leaf_score_means(out.trees).items()}
        )  # search: em, f1
        gen_s = out.ledger.phase_s.get("generate", 0.0)
        m[M.GENERATED_TOKENS_PER_S] = out.ledger.generated_tokens / gen_s if gen_s else 0.0
        return m

    def batch_metrics(self, batch: Any, out: Any) -> dict[str, float]:
        """Reward, accuracy and response length of the collated batch (one sequence per leaf); with overlap, how
        stale the weights that sampled it are (at most one update)."""
        from tracerl.engine.step_stats import weight_staleness

        rewards = batch.rewards
        m = {
            M.REWARD_MEAN: sum(rewards) / len(rewards) if rewards else 0.0,
            M.TRAIN_ACCURACY: sum(r > 0.5 for r in rewards) / len(rewards) if rewards else 0.0,
            M.RESPONSE_TOKENS: out.ledger.generated_tokens / max(out.ledger.leaves, 1),
            M.SEQUENCES: float(len(batch)),
        }
        if self.cfg.pipeline.overlap:
            mean, worst = weight_staleness(out.trees, self.version)
            if worst > 1:
                raise RuntimeError(f"tokens sampled {worst} updates ago: overlap bounds the staleness at 1")
            m.update(
                {M.STALENESS_MEAN: mean, M.STALENESS_MAX: float(worst), M.TIME_OVERLAPPED: self.overlapped}
            )
        return m

    def fit(self, out: Any) -> dict[str, float]:
        """Fit the predictor (and trace_plus's length predictor) on every tree rolled out this step."""
        fit = {**self.predictor.fit(out.sampled_trees), **self.allocator.observe(out.sampled_trees)}
        return {M.predictor_fit(k): v for k, v in fit.items()}

    def sync(self, weights: dict[str, Any], version: int) -> None:
        """Push the policy's full HF-named weights (``Worker.gather``), ``version`` updates in, to every sampler."""
        import torch

        self.mark("sync_weights")
        dtype = getattr(torch, self.cfg.model.dtype)  # the samplers' (master weights may be more precise)
        self.pool.load_weights({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()})
        self.version = version

    def eval_due(self, done: int) -> bool:
        return bool(self.cfg.eval_every and done % self.cfg.eval_every == 0) or done == self.cfg.steps

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy held-out accuracy (per source; search: em, f1); per-task outcomes as an artifact."""
        from workflows.tracking.run_info import key_metrics
        from workflows.train.evaluate import evaluate_prompts, task_outcomes

        self.mark("eval", step)
        m, traces = evaluate_prompts(self.pool.evaluate, self.eval_prompts, 0, 0.0, self.cfg.seed + 10_000)
        with tempfile.TemporaryDirectory() as tmp:  # per-task outcomes: the study's bootstrap resamples tasks
            (Path(tmp) / f"outcomes_step_{step:05d}.json").write_text(json.dumps(task_outcomes(traces)))
            self.metrics.log_artifacts(Path(tmp), "eval")
        out = {M.EVAL_ACCURACY: m["accuracy"], M.EVAL_WELL_FORMED: m["greedy"]["well_formed_turns"]}
        for src, acc in m["greedy"]["by_source"].items():
            out[M.eval_source(src)] = acc
        out.update(
            {M.answer_score("eval", k): v for k, v in m["greedy"].get("scores", {}).items()}
        )  # search: em, f1
        if step == 0:  # later evaluations are logged with their step's metrics
            self.metrics.log({**out, **key_metrics(out), M.RETRIED: float(self.pool.ledger.retried)}, step)
        say(
            f"held-out greedy accuracy after {step} steps: {m['accuracy']:.3f} ({len(self.eval_prompts)} tasks)"
        )
        return out

    def close_step(self, m: dict[str, float], done: int, out: Any, timer: PhaseTimer) -> dict[str, float]:
        """The step's last metrics (retries, attempt, phase times, memory, CPU) and, when due, a sample of its
        trees as artifacts; then everything is logged at step ``done`` (spooled while the server is down)."""
        from workflows.tracking.run_info import key_metrics

        self.mark("log")
        with timer("log"):
            # With retries of the weight sync and eval (with overlap, those of the weight sync and eval that ran
            # after the next step had started count in the next step's ledger).
            m[M.RETRIED] = float(self.ledgers.pop(done - 1, self.pool.ledger).retried)
            m[M.ATTEMPT] = float(self.metrics.attempt)
            m.update(timer.metrics())
            rollout_s = m.get(M.TIME_ROLLOUT, 0.0)
            overhead = sum(
                m.get(M.phase_time(k), 0.0)
                for k in ("score", "allocate_roots", "expand_prefixes", "fit_predictor")
            )
            m[M.ALLOC_PREDICTOR_FRACTION] = overhead / rollout_s if rollout_s else 0.0
            m[M.PEAK_MEMORY_MB] = _peak_memory_mb()
            m[M.CPU_S] = timer.cpu()  # rank 0's process: step driver and learner
            if (self.cfg.log_trees_every and done % self.cfg.log_trees_every == 0) or done == self.cfg.steps:
                self._log_trees(out, done)
        m[M.TIME_LOG] = timer.seconds["log"]
        m[M.TIME_STEP] = timer.elapsed()
        m[M.TOKENS_PER_S] = m.get(M.GENERATED_TOKENS, 0.0) / max(m[M.TIME_STEP], 1e-9)
        self.metrics.log({**m, **key_metrics(m, self.spent[0])}, done)
        say(
            f"step {done}/{self.cfg.steps}  ER {m[M.EFFECTIVE_RATIO]:.2f}  reward {m[M.REWARD_MEAN]:.2f}"
            f"  loss {m[M.LOSS]:+.4f}  clip {m[M.CLIP_FRACTION]:.3f}  {m[M.TIME_STEP]:.1f} s"
            + (f"  held-out {m[M.EVAL_ACCURACY]:.3f}" if M.EVAL_ACCURACY in m else "")
        )
        return m

    def _log_trees(self, out: Any, step: int) -> None:
        from workflows.lm.rollout import outcome_records
        from workflows.lm.viewer import render_html

        records = outcome_records(out)
        with tempfile.TemporaryDirectory() as tmp:
            with open(Path(tmp) / "trees.jsonl", "w") as f:
                for r in records[:16]:
                    f.write(json.dumps(r) + "\n")
            (Path(tmp) / "trees.html").write_text(
                render_html(records[:16], f"{self.cfg.run_name}: step {step}")
            )
            self.metrics.log_artifacts(Path(tmp), f"trees/step_{step:05d}")

    def save(self, path: Path, step: int, weights: dict[str, Any], adapters: dict[str, Any]) -> None:
        """Rank 0's share of a checkpoint: the merged policy (HF format), LoRA adapters, predictor, allocator
        state, candidate-pool RNG, tokens spent and the config."""
        import torch

        self.mark("save", step)
        self.export.save_pretrained(path / "policy", state_dict=weights)
        if adapters:
            torch.save(adapters, path / ADAPTERS)
        self.tok.save_pretrained(path / "policy")
        torch.save(self.predictor.state_dict(), path / "predictor.pt")
        if self.allocator.state_dict():
            torch.save(self.allocator.state_dict(), path / "allocator.pt")
        CheckpointState(
            step, self.run_id, self.rng.bit_generator.state, (self.spent[0], self.spent[1])
        ).write(path)
        (path / "config.yaml").write_text(to_yaml(self.cfg))

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.shutdown()
        self.mark("done")
        self.metrics.flush()
        self.pool.shutdown()


def _peak_memory_mb() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
