"""Rank 0's part of ``tracerl train``: the sampler pool (Ray actors, or in-process), the predictor, the allocator,
the candidate-pool RNG, held-out evaluation, the weight sync, checkpoints of its own state and the step's metrics.
The step itself, which calls these in order, is ``tracerl.workflows.train.loop.train_step``."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.actors.faults import Faults
from tracerl.config import BudgetConfig, TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.engine.allocation import build_allocation
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.mc_scorer import mc_metrics
from tracerl.engine.react import make_template
from tracerl.engine.step import BareRollouts, PlannedStep, StepOutcome
from tracerl.engine.step_stats import step_metrics, weight_staleness
from tracerl.engine.stepper import Stepper
from tracerl.engine.timer import PhaseTimer, process_tree_cpu_s
from tracerl.envs.registry import tool_env_class
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.local_runs import tracking_client
from tracerl.workflows.tracking.log_file import tracking_logs_to
from tracerl.workflows.tracking.run_info import key_metrics
from tracerl.workflows.tracking.runs import phase_marker
from tracerl.workflows.tracking.spool import MetricLog, next_attempt
from tracerl.workflows.train.budget import (
    append_point,
    eval_subset,
    overshoot,
)
from tracerl.workflows.train.evaluate import evaluate_prompts, leaf_score_means, task_outcomes
from tracerl.workflows.train.meter import RunMeter
from tracerl.workflows.train.push import EngineRestarts
from tracerl.workflows.train.setup import ADAPTERS, say
from tracerl.workflows.train.step_log import (
    log_threads,
    log_trees,
    peak_memory_mb,
    start_pool,
    totals_line,
)

# Slow imports (torch, transformers, Ray, scipy: seconds) stay inside the functions that use them: this module loads
# with the CLI, which starts without them (docs/results/startup.md).

TIMEOUTS = ("tool_timeouts", "grade_timeouts")  # wall-clock limits an evaluation logs as eval/<name>


def overlaps_next(cfg: TrainConfig, done: int) -> bool:
    """Whether the step after step ``done`` (1-based) starts beside this one's update: with ``pipeline.overlap``,
    unless this step is the last of ``steps`` or ends in a checkpoint (a checkpoint then holds no step half done, so
    a run resumed from it repeats the uninterrupted one)."""
    return (
        cfg.pipeline.overlap and (cfg.steps is None or done < cfg.steps) and done % cfg.checkpoint_every != 0
    )


@dataclass
class Ahead:
    """A step started early (``pipeline.overlap``): its Stage 1 ran before the previous update and its bare
    rollouts run beside it, on the weights of ``version``."""

    budget: BudgetConfig
    planned: PlannedStep
    bare: Future[BareRollouts]
    version: int
    ledger: BudgetLedger
    """The samplers' counts for this step (a later step's start begins a new one)."""
    step: int
    """The step it rolls out (its trees are released once complete)."""
    waited: float = 0.0
    """Seconds the previous step waited for the bare rollouts after its update (``time/wait_rollouts_s``)."""

    @property
    def timer(self) -> PhaseTimer:
        return self.planned.timer


class Driver:
    """Rank 0's pools, predictor, allocator and candidate pools, and the run's metric log."""

    def __init__(
        self, cfg: TrainConfig, run_id: str, storage: Path, tok: Any, model: Any, step: int, pool: Any = None
    ) -> None:
        """Build the allocator and predictor over ``pool`` (``start_pool``'s, started while the trainer loaded its
        policy; None: started here) and wait until every sampler is up; log the run's thread counts."""
        # slow to import: torch, transformers
        from tracerl.workflows.lm.stack import task_prompts, text_features

        self.cfg, self.run_id, self.storage, self.tok = cfg, run_id, storage, tok
        # The HF model class and config that checkpoints are written with (a LoRA run's base model).
        self.export = model.get_base_model() if hasattr(model, "get_base_model") else model
        if cfg.tracking.enabled:
            tracking_logs_to(storage)  # MLflow's and SQLAlchemy's own lines (rank 0's process)
        self.client = tracking_client(cfg.tracking, storage.parent)
        self.metrics = MetricLog(self.client, run_id, storage, next_attempt(storage), say)
        self.metrics.flush()  # what an earlier attempt spooled
        self.mark = phase_marker(storage, cfg.chaos.enabled, step, cfg.steps, cfg.chaos.phase_wait_s)
        self.pool = pool if pool is not None else start_pool(cfg, storage)
        self.faults: Faults = self.pool.spec.faults
        self.restarts = EngineRestarts(storage, say)
        self.pool.wait_ready()  # every sampler up: start-up ends here, not inside the first step
        for w in self.pool.warnings():
            say(f"sandbox: {w}")
        log_threads(self.client, run_id, self.pool)
        self.startup: dict[str, float] = {}
        """``time/startup_s`` and its parts, logged with the next step (the first this launch runs)."""
        template = make_template(cfg.model.template, tok, cfg.model.system_prompt)
        tools = list(tool_env_class(cfg.env.name).tools)
        features = text_features(cfg.predictor, model, tok, lambda q: template.prompt(q, tools))
        # trace_mc scores prefixes by extra rollouts on the pool
        self.allocator, self.predictor = build_allocation(
            cfg.allocator, cfg.predictor, cfg.seed, self.pool, features
        )
        self.prompts = task_prompts(cfg.env)
        self.eval_prompts = task_prompts(cfg.env, held_out=True)
        self.curve_prompts = [
            self.eval_prompts[i] for i in eval_subset(len(self.eval_prompts), cfg.eval_subset, cfg.seed)
        ]
        """The learning curve's held-out tasks: those of the token-schedule evaluations (``eval_subset``)."""
        self.rng = np.random.default_rng(cfg.seed)
        self.meter = RunMeter(cfg)
        """Tokens, leaves, CPU and wall seconds so far; the stop checks and the token-mode budget."""
        self.version = step
        """The policy version (updates applied) the samplers hold."""
        self.ledgers: dict[int, Any] = {}
        """Each step's budget ledger (an overlapped step's starts before the previous step has logged)."""
        self.overlapped = 0.0
        self._ahead = ThreadPoolExecutor(1, "ahead") if cfg.pipeline.overlap else None

    def restore(self, ckpt_dir: str, state: CheckpointState) -> None:
        """Continue from a checkpoint: candidate-pool RNG, tokens spent, predictor and allocator state (the loop then
        pushes the restored policy to the samplers: a fresh run's samplers already hold ``model.path``)."""
        import torch  # slow to import: torch

        self.rng.bit_generator.state = state.rng
        self.meter.restore(state)
        for name, part in (("predictor.pt", self.predictor), ("allocator.pt", self.allocator)):
            if name == "predictor.pt" or (Path(ckpt_dir) / name).exists():  # allocator.pt: trace_plus's
                part.load_state_dict(
                    torch.load(Path(ckpt_dir) / name, map_location="cpu", weights_only=False)
                )

    def stepper(self) -> Stepper:
        """The engine's assembly of a step over this driver's prompts, allocator, predictor, samplers and generator
        (built per call: a restore replaces the generator's state)."""
        return Stepper(
            self.prompts, self.allocator, self.predictor, self.pool, self.rng, self.cfg.pipeline.mode
        )

    def roll_out(self, step: int, timer: PhaseTimer) -> tuple[StepOutcome, BudgetConfig]:
        """Select, score, allocate roots, roll out, expand prefixes (tracerl/engine/stepper.py) on the samplers'
        current weights."""
        with timer("select"):
            budget = self.budget(step)
        out = self.stepper().run(step, budget, timer)
        self.pool.release(step)  # no expansion follows: the samplers' KV caches go before the update
        self.ledgers[step] = self.pool.ledger
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
        with timer("select"):
            budget = self.budget(step)
        stepper = self.stepper()
        planned, ledger = stepper.start(step, budget, timer)
        self.ledgers[step] = ledger
        return Ahead(budget, planned, self._ahead.submit(stepper.bare, planned), self.version, ledger, step)

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
        out = self.stepper().finish(ahead.planned, bare, ahead.ledger)
        self.pool.release(ahead.step)
        for t, n in zip(out.sampled_trees, sizes):
            t.stamp_version(ahead.version, 1, n)
            t.stamp_version(self.version, n)
        return out, ahead.budget

    def budget(self, step: int) -> BudgetConfig:
        """Step ``step``'s budget (``RunMeter.budget``: token mode sizes it from the tokens left)."""
        return self.meter.budget(step, len(self.prompts))

    def rollout_metrics(self, out: Any, budget: BudgetConfig) -> dict[str, float]:
        """The step's rollout, budget and calibration metrics (before the predictor fits on the new trees); the
        step's ledger holds the samplers' counts (tokens, tool calls, retries, generation time) for it."""
        from tracerl.calibration import collect_calibration, summarize_calibration  # slow to import: scipy

        self.meter.add_rollout(out.ledger)
        metrics = step_metrics(out)
        metrics[M.LEAF_BUDGET] = float(budget.leaves)
        metrics.update(mc_metrics(self.predictor))  # trace_mc: its Monte-Carlo rollouts, not in the ledger
        if self.predictor.ready:
            for group, vals in summarize_calibration(collect_calibration(out)).items():
                metrics.update({M.calibration(group, k): v for k, v in vals.items()})
        metrics.update(
            {M.answer_score("rollout", k): v for k, v in leaf_score_means(out.trees).items()}
        )  # search: em, f1
        gen_s = out.ledger.phase_s.get("generate", 0.0)
        metrics[M.GENERATED_TOKENS_PER_S] = out.ledger.generated_tokens / gen_s if gen_s else 0.0
        return metrics

    def batch_metrics(self, batch: Any, out: Any) -> dict[str, float]:
        """Reward, accuracy and response length of the collated batch (one sequence per leaf); with overlap, how
        stale the weights that sampled it are (at most one update)."""

        rewards = batch.rewards
        metrics = {
            M.REWARD_MEAN: sum(rewards) / len(rewards) if rewards else 0.0,
            M.TRAIN_ACCURACY: sum(r > 0.5 for r in rewards) / len(rewards) if rewards else 0.0,
            M.RESPONSE_TOKENS: out.ledger.generated_tokens / max(out.ledger.leaves, 1),
            M.SEQUENCES: float(len(batch)),
        }
        if self.cfg.pipeline.overlap:
            mean, worst = weight_staleness(out.trees, self.version)
            if worst > 1:
                raise RuntimeError(f"tokens sampled {worst} updates ago: overlap bounds the staleness at 1")
            metrics.update(
                {M.STALENESS_MEAN: mean, M.STALENESS_MAX: float(worst), M.TIME_OVERLAPPED: self.overlapped}
            )
        return metrics

    def fit(self, out: Any) -> dict[str, float]:
        """Fit the predictor (and trace_plus's length predictor) on every tree rolled out this step."""
        fit = {**self.predictor.fit(out.sampled_trees), **self.allocator.observe(out.sampled_trees)}
        return {M.predictor_fit(k): v for k, v in fit.items()}

    def sync(self, push: Callable[[Any], None], version: int) -> None:
        """Push the policy, ``version`` updates in, into every sampler: ``push(pool)`` (``Worker.push``, bucket by
        bucket)."""
        self.mark("sync_weights")
        push(self.pool)
        self.version = version

    @property
    def stopped_by(self) -> str | None:
        """Why the run ends after the current step; None: it goes on."""
        return self.meter.stopped_by

    def start_meter(self, ranks_cpu: float) -> None:
        """Start counting CPU seconds here (the steps' loop): ``ranks_cpu`` is the trainer ranks' process CPU now;
        the samplers' counts start from their current readings."""
        self.pool.cpu_s()
        self.meter.start(ranks_cpu)

    def reached(self, done: int) -> bool:
        return self.meter.reached(done)

    def check_stop(self, done: int, ranks_cpu: float) -> bool:
        """After step ``done``'s update: the meter adds the CPU used since the last check; whether a limit ends the
        run here."""
        return self.meter.check_stop(done, ranks_cpu, self.pool.cpu_s())

    def eval_due(self, done: int) -> str | None:
        """Which evaluation step ``done`` runs: ``"full"`` (every held-out task: every ``eval_every`` steps and the
        last step unless ``eval_at_end`` is false), ``"curve"`` (the curve's tasks: its tokens crossed a multiple of ``eval_every_tokens``) or none."""
        due = bool(self.cfg.eval_every and done % self.cfg.eval_every == 0)
        if due or (self.stopped_by is not None and self.cfg.eval_at_end):
            return "full"
        if self.meter.crossed():
            return "curve"
        return None

    def evaluate(self, step: int, full: bool = True) -> dict[str, float]:
        """Greedy held-out accuracy on every held-out task (``full``: per source; search: em, f1; per-task outcomes
        as an artifact) or on the curve's tasks; the evaluation's own tokens, wall and CPU seconds (not counted in
        the run's totals). The learning-curve point is logged with the step (``close_step``)."""

        self.mark("eval", step)
        samplers_before = self.pool.cpu_s()  # the samplers' training CPU up to here
        t0, c0, ledgers = time.perf_counter(), process_tree_cpu_s(), []

        def run(*args: Any) -> Any:
            trees, led = self.pool.evaluate(*args)
            ledgers.append(led)
            return trees, led

        prompts = self.eval_prompts if full else self.curve_prompts
        summary, traces = evaluate_prompts(run, prompts, 0, 0.0, self.cfg.seed + 10_000)
        outcomes = task_outcomes(traces)
        rank0 = process_tree_cpu_s() - c0
        self.meter.add_eval(rank0, samplers_before)
        cost = {k: float(sum(getattr(x, k) for x in ledgers)) for k in ("generated_tokens", *TIMEOUTS)}
        cost["wall_s"], cost["cpu_s"] = time.perf_counter() - t0, rank0 + self.pool.cpu_s()
        self.meter.add_evaluation(outcomes, full, cost)
        out = {M.EVAL + k: v for k, v in cost.items()}  # eval/generated_tokens, wall_s, cpu_s, the timeouts
        if full:
            with (
                tempfile.TemporaryDirectory() as tmp
            ):  # per-task outcomes: the study's bootstrap resamples tasks
                (Path(tmp) / f"outcomes_step_{step:05d}.json").write_text(json.dumps(outcomes))
                self.metrics.log_artifacts(Path(tmp), "eval")
            out.update(
                {
                    M.EVAL_ACCURACY: summary["accuracy"],
                    M.EVAL_WELL_FORMED: summary["greedy"]["well_formed_turns"],
                }
            )
            for src, acc in summary["greedy"]["by_source"].items():
                out[M.eval_source(src)] = acc
            out.update(
                {M.answer_score("eval", k): v for k, v in summary["greedy"].get("scores", {}).items()}
            )  # search: em, f1
        if step == 0:  # later evaluations are logged with their step's metrics
            self.metrics.log({**out, **key_metrics(out), M.RETRIED: float(self.pool.ledger.retried)}, step)
            self._log_point(0)
        what = f"{len(prompts)} tasks" if full else f"{len(prompts)} curve tasks"
        say(f"held-out greedy accuracy after {step} steps: {summary['accuracy']:.3f} ({what})")
        return out

    def _log_point(self, updates: int) -> None:
        """The learning-curve point of the evaluation just run, if one ran: ``curve/`` metrics at MLflow step = the
        run's generated tokens, and a line of ``<storage>/curve.jsonl``."""
        tasks = [p.prompt_id for p in self.curve_prompts]
        point = self.meter.curve_point(updates, tasks, self.metrics.attempt)
        if point is not None:
            append_point(self.storage, point)
            self.metrics.log(point.metrics(), int(point.totals.generated_tokens))

    def close_step(
        self, metrics: dict[str, float], done: int, out: Any, timer: PhaseTimer
    ) -> dict[str, float]:
        """The step's last metrics (retries, attempt, phase times, memory, CPU) and, when due, a sample of its
        trees as artifacts; then everything is logged at step ``done`` (spooled while the server is down)."""

        self.mark("log")
        with timer("log"):
            # With retries of the weight sync and eval (with overlap, those of the weight sync and eval that ran
            # after the next step had started count in the next step's ledger).
            metrics[M.RETRIED] = float(self.ledgers.pop(done - 1, self.pool.ledger).retried)
            metrics[M.ATTEMPT] = float(self.metrics.attempt)
            metrics.update(self.restarts.metrics(self.pool))  # sampler/engine_restarts (and its one warning)
            metrics.update(timer.metrics())
            rollout_s = metrics.get(M.TIME_ROLLOUT, 0.0)
            overhead = sum(metrics.get(M.phase_time(k), 0.0) for k in M.ALLOC_PREDICTOR_PHASES)
            metrics[M.ALLOC_PREDICTOR_FRACTION] = overhead / rollout_s if rollout_s else 0.0
            metrics[M.PEAK_MEMORY_MB] = peak_memory_mb()
            metrics[M.CPU_S] = timer.cpu()  # rank 0's process: step driver and learner
            last = self.stopped_by is not None
            if (self.cfg.log_trees_every and done % self.cfg.log_trees_every == 0) or last:
                log_trees(self.metrics, out, done, self.cfg.run_name)
            metrics.update(self.startup)  # the first step of this launch only
            self.startup = {}
        metrics[M.TIME_LOG] = timer.seconds["log"]
        metrics[M.TIME_STEP] = timer.elapsed()
        metrics[M.TOKENS_PER_S] = metrics.get(M.GENERATED_TOKENS, 0.0) / max(metrics[M.TIME_STEP], 1e-9)
        self.meter.add_wall(metrics[M.TIME_STEP] - metrics.get(M.phase_time("eval"), 0.0))
        totals = self.meter.totals(done)
        metrics.update(totals.metrics())
        if last:
            metrics.update(overshoot(self.cfg.stop, totals))
        self.metrics.log({**metrics, **key_metrics(metrics, self.meter.tokens)}, done)
        self._log_point(done)
        if last and self.cfg.stop.enabled:
            say(f"stopped after step {done} on {self.stopped_by}: {totals_line(totals)}")
        of = f"/{self.cfg.steps}" if self.cfg.steps is not None else ""
        say(
            f"step {done}{of}  ER {metrics[M.EFFECTIVE_RATIO]:.2f}  reward {metrics[M.REWARD_MEAN]:.2f}"
            f"  loss {metrics[M.LOSS]:+.4f}  clip {metrics[M.CLIP_FRACTION]:.3f}  {metrics[M.TIME_STEP]:.1f} s"
            + (f"  held-out {metrics[M.EVAL_ACCURACY]:.3f}" if M.EVAL_ACCURACY in metrics else "")
        )
        return metrics

    def save(self, path: Path, step: int, weights: dict[str, Any], adapters: dict[str, Any]) -> None:
        """Rank 0's share of a checkpoint: the merged policy (HF format), LoRA adapters, predictor, allocator
        state, candidate-pool RNG, tokens spent and the config."""
        import torch  # slow to import: torch

        self.mark("save", step)
        self.export.save_pretrained(path / "policy", state_dict=weights)
        if adapters:
            torch.save(adapters, path / ADAPTERS)
        self.tok.save_pretrained(path / "policy")
        torch.save(self.predictor.state_dict(), path / "predictor.pt")
        if self.allocator.state_dict():
            torch.save(self.allocator.state_dict(), path / "allocator.pt")
        self.meter.state(step, self.run_id, self.rng.bit_generator.state).write(path)
        (path / "config.yaml").write_text(to_yaml(self.cfg))

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.shutdown()
        self.mark("done")
        self.metrics.flush()
        self.pool.shutdown()
