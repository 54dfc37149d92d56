"""Rank 0's part of ``tracerl train``: the sampler pool (Ray actors, or in-process), the predictor, the allocator,
the candidate-pool RNG, held-out evaluation, the weight sync, checkpoints of its own state and the step's metrics.
The step itself, which calls these in order, is ``tracerl.workflows.train.loop.train_step``."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.actors.faults import Faults
from tracerl.config import BudgetConfig, TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.step import BareRollouts, PlannedStep, StepOutcome
from tracerl.engine.stepper import Stepper
from tracerl.engine.timer import PhaseTimer, process_tree_cpu_s
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.runs import phase_marker
from tracerl.workflows.train.budget import (
    Totals,
    append_point,
    crosses,
    curve_point,
    eval_subset,
    overshoot,
    stop_reason,
)
from tracerl.workflows.train.push import EngineRestarts
from tracerl.workflows.train.setup import ADAPTERS, say
from tracerl.workflows.train.step_log import (
    log_threads,
    log_trees,
    peak_memory_mb,
    start_pool,
    totals_line,
)

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
        import numpy as np

        from tracerl.algos.allocators import build_allocator
        from tracerl.engine.mc_scorer import with_monte_carlo
        from tracerl.engine.react import TEMPLATES
        from tracerl.envs.registry import tool_env_class
        from tracerl.predictors.length import attach_lengths
        from tracerl.workflows.lm.stack import make_text_predictor, task_prompts
        from tracerl.workflows.tracking.local_runs import tracking_client
        from tracerl.workflows.tracking.log_file import tracking_logs_to
        from tracerl.workflows.tracking.spool import MetricLog, next_attempt

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
        self.predictor = with_monte_carlo(self.allocator, self.predictor, self.pool)  # trace_mc
        self.prompts = task_prompts(cfg.env)
        self.eval_prompts = task_prompts(cfg.env, held_out=True)
        self.curve_prompts = [
            self.eval_prompts[i] for i in eval_subset(len(self.eval_prompts), cfg.eval_subset, cfg.seed)
        ]
        """The learning curve's held-out tasks: those of the token-schedule evaluations (``eval_subset``)."""
        self.rng = np.random.default_rng(cfg.seed)
        # Token mode: generated tokens and leaves so far, for the mean cost of a leaf.
        self.spent = [0.0, 0.0]
        self.tokens_before = 0.0
        """The run's generated tokens before the current step (the token schedule's crossing)."""
        self.cpu_total = self.wall_total = 0.0
        """The run's CPU and wall seconds so far, evaluation not counted (``total/``)."""
        self._ranks_cpu = 0.0  # the trainer ranks' process CPU seconds at the last reading
        self._eval_cpu = 0.0  # rank 0's CPU seconds spent evaluating since then
        self._sampler_cpu = 0.0  # the samplers' training CPU seconds read since then (before an evaluation)
        self._point: tuple[dict[str, float], bool, dict[str, float]] | None = None  # this step's evaluation
        self.stopped_by: str | None = None
        """Why the run ends after the current step (``budget.stop_reason``); None: it goes on."""
        self.version = step
        """The policy version (updates applied) the samplers hold."""
        self.ledgers: dict[int, Any] = {}
        """Each step's budget ledger (an overlapped step's starts before the previous step has logged)."""
        self.overlapped = 0.0
        self._ahead = ThreadPoolExecutor(1, "ahead") if cfg.pipeline.overlap else None

    def restore(self, ckpt_dir: str, state: CheckpointState) -> None:
        """Continue from a checkpoint: candidate-pool RNG, tokens spent, predictor and allocator state (the loop then
        pushes the restored policy to the samplers: a fresh run's samplers already hold ``model.path``)."""
        import torch

        self.rng.bit_generator.state = state.rng
        self.spent = list(state.spent)
        self.cpu_total, self.wall_total = state.cpu_s, state.wall_s
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
        return Ahead(budget, planned, self._ahead.submit(stepper.bare, planned), self.version, ledger)

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
        step's ledger holds the samplers' counts (tokens, tool calls, retries, generation time) for it."""
        from tracerl.calibration import collect_calibration, summarize_calibration
        from tracerl.engine.mc_scorer import mc_metrics
        from tracerl.engine.step_stats import step_metrics
        from tracerl.workflows.train.evaluate import leaf_score_means

        self.tokens_before = self.spent[0]
        self.spent = [self.spent[0] + out.ledger.generated_tokens, self.spent[1] + out.ledger.leaves]
        m = step_metrics(out)
        m[M.LEAF_BUDGET] = float(budget.leaves)
        m.update(mc_metrics(self.predictor))  # trace_mc: its Monte-Carlo rollouts, not in the ledger
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

    def sync(self, push: Callable[[Any], None], version: int) -> None:
        """Push the policy, ``version`` updates in, into every sampler: ``push(pool)`` (``Worker.push``, bucket by
        bucket)."""
        self.mark("sync_weights")
        push(self.pool)
        self.version = version

    def totals(self, updates: int) -> Totals:
        """The run's compute after ``updates`` steps (the CPU total as of the last ``check_stop``)."""
        return Totals(self.spent[0], self.spent[1], updates, self.cpu_total, self.wall_total)

    def start_meter(self, ranks_cpu: float) -> None:
        """Start counting CPU seconds here (the steps' loop): ``ranks_cpu`` is the trainer ranks' process CPU now;
        the samplers' counts start from their current readings."""
        self.pool.cpu_s()
        self._ranks_cpu, self._eval_cpu, self._sampler_cpu = ranks_cpu, 0.0, 0.0

    def reached(self, done: int) -> bool:
        """Whether step ``done`` ends the run on its tokens or ``steps`` alone (known before its update)."""
        return stop_reason(self.cfg.stop, self.cfg.steps, self.totals(done)) in ("tokens", "steps")

    def check_stop(self, done: int, ranks_cpu: float) -> bool:
        """After step ``done``'s update: add the CPU seconds used since the last check (trainer ranks' ``ranks_cpu``
        less rank 0's evaluation, the samplers' less theirs) and whether a limit ends the run here."""
        ranks = max(0.0, ranks_cpu - self._ranks_cpu - self._eval_cpu)
        self.cpu_total += ranks + self._sampler_cpu + self.pool.cpu_s()
        self._ranks_cpu, self._eval_cpu, self._sampler_cpu = ranks_cpu, 0.0, 0.0
        self.stopped_by = stop_reason(self.cfg.stop, self.cfg.steps, self.totals(done))
        return self.stopped_by is not None

    def eval_due(self, done: int) -> str | None:
        """Which evaluation step ``done`` runs: ``"full"`` (every held-out task: every ``eval_every`` steps and the
        last step unless ``eval_at_end`` is false), ``"curve"`` (the curve's tasks: its tokens crossed a multiple of ``eval_every_tokens``) or none."""
        due = bool(self.cfg.eval_every and done % self.cfg.eval_every == 0)
        if due or (self.stopped_by is not None and self.cfg.eval_at_end):
            return "full"
        if crosses(self.tokens_before, self.spent[0], self.cfg.eval_every_tokens):
            return "curve"
        return None

    def evaluate(self, step: int, full: bool = True) -> dict[str, float]:
        """Greedy held-out accuracy on every held-out task (``full``: per source; search: em, f1; per-task outcomes
        as an artifact) or on the curve's tasks; the evaluation's own tokens, wall and CPU seconds (not counted in
        the run's totals). The learning-curve point is logged with the step (``close_step``)."""
        from tracerl.workflows.tracking.run_info import key_metrics
        from tracerl.workflows.train.evaluate import evaluate_prompts, task_outcomes

        self.mark("eval", step)
        self._sampler_cpu += self.pool.cpu_s()  # the samplers' training CPU up to here
        t0, c0, ledgers = time.perf_counter(), process_tree_cpu_s(), []

        def run(*args: Any) -> Any:
            trees, led = self.pool.evaluate(*args)
            ledgers.append(led)
            return trees, led

        prompts = self.eval_prompts if full else self.curve_prompts
        m, traces = evaluate_prompts(run, prompts, 0, 0.0, self.cfg.seed + 10_000)
        outcomes = task_outcomes(traces)
        rank0 = process_tree_cpu_s() - c0
        self._eval_cpu += rank0
        cost = {k: float(sum(getattr(x, k) for x in ledgers)) for k in ("generated_tokens", *TIMEOUTS)}
        cost["wall_s"], cost["cpu_s"] = time.perf_counter() - t0, rank0 + self.pool.cpu_s()
        self._point = (outcomes, full, cost)
        out = {M.EVAL + k: v for k, v in cost.items()}  # eval/generated_tokens, wall_s, cpu_s, the timeouts
        if full:
            with (
                tempfile.TemporaryDirectory() as tmp
            ):  # per-task outcomes: the study's bootstrap resamples tasks
                (Path(tmp) / f"outcomes_step_{step:05d}.json").write_text(json.dumps(outcomes))
                self.metrics.log_artifacts(Path(tmp), "eval")
            out.update({M.EVAL_ACCURACY: m["accuracy"], M.EVAL_WELL_FORMED: m["greedy"]["well_formed_turns"]})
            for src, acc in m["greedy"]["by_source"].items():
                out[M.eval_source(src)] = acc
            out.update(
                {M.answer_score("eval", k): v for k, v in m["greedy"].get("scores", {}).items()}
            )  # search: em, f1
        if step == 0:  # later evaluations are logged with their step's metrics
            self.metrics.log({**out, **key_metrics(out), M.RETRIED: float(self.pool.ledger.retried)}, step)
            self._log_point(self.totals(0))
        what = f"{len(prompts)} tasks" if full else f"{len(prompts)} curve tasks"
        say(f"held-out greedy accuracy after {step} steps: {m['accuracy']:.3f} ({what})")
        return out

    def _log_point(self, totals: Totals) -> None:
        """The learning-curve point of the evaluation just run: ``curve/`` metrics at MLflow step = the run's
        generated tokens, and a line of ``<storage>/curve.jsonl``."""
        if self._point is None:
            return
        outcomes, full, cost = self._point
        self._point = None
        tasks = [p.prompt_id for p in self.curve_prompts]
        point = curve_point(totals, outcomes, tasks, full, cost, self.metrics.attempt)
        append_point(self.storage, point)
        self.metrics.log(point.metrics(), int(totals.generated_tokens))

    def close_step(self, m: dict[str, float], done: int, out: Any, timer: PhaseTimer) -> dict[str, float]:
        """The step's last metrics (retries, attempt, phase times, memory, CPU) and, when due, a sample of its
        trees as artifacts; then everything is logged at step ``done`` (spooled while the server is down)."""
        from tracerl.workflows.tracking.run_info import key_metrics

        self.mark("log")
        with timer("log"):
            # With retries of the weight sync and eval (with overlap, those of the weight sync and eval that ran
            # after the next step had started count in the next step's ledger).
            m[M.RETRIED] = float(self.ledgers.pop(done - 1, self.pool.ledger).retried)
            m[M.ATTEMPT] = float(self.metrics.attempt)
            m.update(self.restarts.metrics(self.pool))  # sampler/engine_restarts (and its one warning)
            m.update(timer.metrics())
            rollout_s = m.get(M.TIME_ROLLOUT, 0.0)
            overhead = sum(m.get(M.phase_time(k), 0.0) for k in M.ALLOC_PREDICTOR_PHASES)
            m[M.ALLOC_PREDICTOR_FRACTION] = overhead / rollout_s if rollout_s else 0.0
            m[M.PEAK_MEMORY_MB] = peak_memory_mb()
            m[M.CPU_S] = timer.cpu()  # rank 0's process: step driver and learner
            last = self.stopped_by is not None
            if (self.cfg.log_trees_every and done % self.cfg.log_trees_every == 0) or last:
                log_trees(self.metrics, out, done, self.cfg.run_name)
            m.update(self.startup)  # the first step of this launch only
            self.startup = {}
        m[M.TIME_LOG] = timer.seconds["log"]
        m[M.TIME_STEP] = timer.elapsed()
        m[M.TOKENS_PER_S] = m.get(M.GENERATED_TOKENS, 0.0) / max(m[M.TIME_STEP], 1e-9)
        self.wall_total += m[M.TIME_STEP] - m.get(M.phase_time("eval"), 0.0)
        totals = self.totals(done)
        m.update(totals.metrics())
        if last:
            m.update(overshoot(self.cfg.stop, totals))
        self.metrics.log({**m, **key_metrics(m, self.spent[0])}, done)
        self._log_point(totals)
        if last and self.cfg.stop.enabled:
            say(f"stopped after step {done} on {self.stopped_by}: {totals_line(totals)}")
        of = f"/{self.cfg.steps}" if self.cfg.steps is not None else ""
        say(
            f"step {done}{of}  ER {m[M.EFFECTIVE_RATIO]:.2f}  reward {m[M.REWARD_MEAN]:.2f}"
            f"  loss {m[M.LOSS]:+.4f}  clip {m[M.CLIP_FRACTION]:.3f}  {m[M.TIME_STEP]:.1f} s"
            + (f"  held-out {m[M.EVAL_ACCURACY]:.3f}" if M.EVAL_ACCURACY in m else "")
        )
        return m

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
            step,
            self.run_id,
            self.rng.bit_generator.state,
            (self.spent[0], self.spent[1]),
            self.cpu_total,
            self.wall_total,
        ).write(path)
        (path / "config.yaml").write_text(to_yaml(self.cfg))

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.shutdown()
        self.mark("done")
        self.metrics.flush()
        self.pool.shutdown()
