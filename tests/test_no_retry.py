"""Budgets that cannot run are refused before Ray starts, with the largest value that runs; an error in the training
loop that a restart cannot get past (a bad value, an unknown name) is one ``tracerl:`` line, not retried."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path

import pytest

from tests.conftest import ROOT, UNHURRIED, sqlite_client
from tracerl.config import TrainConfig
from tracerl.config_loader import compose
from tracerl.workflows.cli.app import main
from tracerl.workflows.ops.no_retry import LoopFailed, as_permanent, loop_failed
from tracerl.workflows.train.preflight import check_budget, training_tasks

SMOKE = ROOT / "conf" / "train" / "smoke.yaml"  # 64 math tasks, budget G=3, N=2, pool_factor=2
HABIT = ROOT / "models" / "tiny-math-habit"


def _smoke(*overrides: str) -> TrainConfig:
    return compose(TrainConfig, SMOKE, list(overrides))


def test_the_issues_budget_is_refused_before_ray_or_mlflow_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--config", str(SMOKE), "budget.num_leaves=99999999", f"out_dir={tmp_path}/runs"]
    assert main([*argv, f"tracking.uri=sqlite:///{tmp_path}/m.db"]) == 2
    assert capsys.readouterr().err == (
        "tracerl: budget.num_leaves=99999999 needs a candidate pool of 66666666 prompts each step "
        "(budget.pool_factor=2 x L=99999999 / budget.group_size=3) but the training task set has 64: "
        "set budget.num_leaves to at most 96, or raise env.math.num_tasks\n"
    )
    assert list(tmp_path.iterdir()) == []  # no store, no run storage: nothing was started


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["budget.num_leaves=102"], "set budget.num_leaves to at most 96, or lower budget.pool_factor to 1"),
        (
            ["budget.num_leaves=null", "budget.num_roots=40"],
            "set budget.num_roots to at most 32, or lower budget.pool_factor to 1",
        ),
        (["budget.pool_factor=40"], "set budget.num_leaves to at most 3, or lower budget.pool_factor to 12"),
    ],
)
def test_the_largest_value_named_runs_and_one_more_does_not(overrides: list[str], fix: str) -> None:
    cfg = _smoke(*overrides)
    tasks = training_tasks(cfg)
    assert tasks == 64
    with pytest.raises(ValueError, match="training task set has 64: ") as err:
        check_budget(cfg, tasks)
    assert str(err.value).endswith(f": {fix}, or raise env.math.num_tasks")
    for named in fix.split(", or "):  # each value the message names passes
        key, value = named.split(" ")[1], named.rsplit(" ", 1)[1]
        check_budget(_smoke(*overrides, f"{key}={value}"), tasks)


def test_a_loop_error_a_restart_cannot_fix_is_classed_as_such() -> None:
    failed = as_permanent(KeyError("unknown policy loss 'nope'"))
    assert isinstance(failed, LoopFailed) and str(failed) == (
        "the training loop stopped (KeyError): \"unknown policy loss 'nope'\""
    )
    assert str(as_permanent(ValueError("a\n  b"))) == "the training loop stopped (ValueError): a b"
    for transient in (RuntimeError("bug or crash"), ConnectionError("peer gone"), OSError(errno.EIO, "io")):
        assert as_permanent(transient) is None
    back = pickle.loads(pickle.dumps(LoopFailed("x")))  # crosses Ray's process boundaries
    assert isinstance(back, LoopFailed) and str(back) == "x"
    wrapped = RuntimeError("Training failed")
    wrapped.__cause__ = back
    assert loop_failed(wrapped) is back and loop_failed(RuntimeError("no")) is None


def test_ray_train_does_not_retry_a_loop_failed() -> None:
    """The controller callback turns Ray Train's RETRY after a LoopFailed into an error it does not retry; any
    other worker error is left to the failure policy."""
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    from tracerl.workflows.ops.disk_callback import StopOnDiskFull

    class FakePollStatus:  # the one field the callback reads from Ray's WorkerGroupPollStatus
        def __init__(self, errors: dict[int, BaseException]) -> None:
            self.errors = errors

    cb = StopOnDiskFull()
    cb.after_worker_group_poll_status(FakePollStatus({0: RuntimeError("actor died")}))
    cb.before_controller_execute_failure_decision(FailureDecision.RETRY)
    cb.after_worker_group_poll_status(FakePollStatus({0: LoopFailed("bad value")}))
    cb.before_controller_execute_failure_decision(FailureDecision.RAISE)
    with pytest.raises(LoopFailed, match="bad value"):
        cb.before_controller_execute_failure_decision(FailureDecision.RETRY)


def test_an_unknown_loss_ends_the_run_in_one_line_without_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run (in-process: the same guarded loop as a Train worker) with max_failures=2: one attempt, the run
    FAILED, one ``tracerl:`` line, exit 2."""
    argv = [
        "train",
        "--config",
        str(SMOKE),
        f"model.path={HABIT}",
        "cluster=inprocess",
        "steps=2",
        "max_failures=2",
        "eval_at_start=false",
        "loss.name=nope",
        f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracking.artifact_location={tmp_path}/art",
        f"out_dir={tmp_path}/runs",
        *UNHURRIED,
    ]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == (
        "tracerl: the training loop stopped (RegistryError): unknown policy loss 'nope'; known: ppo_clip "
        "(or give an import path 'package.module:attr')"
    )
    assert "restarting" not in captured.out + captured.err and "Traceback" not in captured.err
    client = sqlite_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    assert run.info.status == "FAILED"


def test_a_context_too_short_for_the_longest_prompt_is_refused_with_the_smallest_that_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sampler.max_context_tokens at or below the longest prompt's tokens would end every episode of it at once with
    nothing generated: refused before Ray or MLflow start, naming the smallest limit that runs, which passes."""
    from tracerl.workflows.train.preflight import check_context, longest_prompt

    cfg = _smoke(f"model.path={HABIT}")
    tokens, task = longest_prompt(cfg)
    assert 0 < tokens < cfg.sampler.max_context_tokens and task
    check_context(cfg, (tokens, task))
    check_context(_smoke(f"model.path={HABIT}", f"sampler.max_context_tokens={tokens + 1}"), (tokens, task))
    argv = ["train", "--config", str(SMOKE), f"model.path={HABIT}", f"sampler.max_context_tokens={tokens}"]
    assert main([*argv, f"out_dir={tmp_path}/runs", f"tracking.uri=sqlite:///{tmp_path}/m.db"]) == 2
    where, err = capsys.readouterr().err.split("\n", 1)  # the line saying where runs go, then the error
    assert where.startswith("MLflow tracking at ") and err == (
        f"tracerl: sampler.max_context_tokens={tokens} leaves no room for a turn after the longest prompt (task "
        f"{task}: {tokens} tokens in model.template=plain): set sampler.max_context_tokens to at least {tokens + 1} "
        f"({tokens + 48} for a whole turn of sampler.max_turn_tokens=48), or shorten the prompts\n"
    )
    assert list(tmp_path.iterdir()) == []
