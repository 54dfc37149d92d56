"""Overlap of the next step's rollouts with the update (``pipeline.overlap``): weight versions, the behaviour
log-probs the loss reads, and a training run that overlaps, loses a sampler mid-overlap and its trainer, and
repeats the uninterrupted run after the restart.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT, TOOL_TIMEOUT_S, UNHURRIED
from tracerl import metrics as M
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

HABIT = ROOT / "models" / "tiny-math-habit"
SIGNAL_SEED = 1  # as in tests/test_train.py: smoke steps with mixed groups on HABIT


def _logprobs(model: Any, ids: list[int]) -> np.ndarray:
    """log pi(token t | tokens < t) for every token after the first, at temperature 1 (the sampler's)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return np.concatenate([[0.0], lp.numpy()])


def test_each_token_keeps_the_log_prob_of_the_weights_that_sampled_it() -> None:
    """Bare rollouts on weights A, the weights replaced by B (as the push after an update does), continuations on
    B: every loss token of the collated batch carries A's log-prob if a bare turn sampled it and B's if a
    continuation did, i.e. the importance weight exp(log pi_old - log mu) divides by the version that sampled it."""
    import torch

    from tracerl.actors.pools import strip_caches
    from tracerl.algos.allocators import Expansion
    from tracerl.algos.batch import collate
    from tracerl.config import ModelConfig, SamplerConfig, env_config
    from tracerl.engine.react import TEMPLATES
    from tracerl.engine.rollout import TreeRolloutEngine
    from tracerl.engine.step_stats import weight_staleness
    from tracerl.envs.math.env import MathEnv
    from tracerl.envs.sandbox import SandboxConfig
    from tracerl.models.hf import load_policy
    from tracerl.samplers.hf import HFSampler
    from tracerl.workflows.lm.stack import task_prompts

    cfg = ModelConfig(path=str(HABIT))
    tok, model = load_policy(cfg)
    env = MathEnv(SandboxConfig(timeout_s=TOOL_TIMEOUT_S))
    limits = SamplerConfig(max_turns=3, max_turn_tokens=32)
    engine = TreeRolloutEngine(
        HFSampler(model, tok), env, TEMPLATES.get(cfg.template)(tok), tok, limits, seed=3
    )
    engine.step = 0
    prompts = task_prompts(env_config("math"))[:4]
    trees = engine.rollout(prompts, [2] * len(prompts))
    for t in trees:
        t.stamp_version(0)
    bare_sizes = [len(t.nodes) for t in trees]
    weights_a = copy.deepcopy(model)
    with torch.no_grad():  # the update: a visibly different policy
        model.get_output_embeddings().weight.mul_(0.5)
    trees = [strip_caches(t) for t in trees]  # the samplers drop the old weights' KV caches on a push
    expansions = []
    for t in trees:
        inner = [n.node_id for n in t.nodes[1:] if not n.is_leaf]
        ids, counts = (
            (np.array(inner[:1]), np.array([2])) if inner else (np.array([], int), np.array([], int))
        )
        expansions.append(Expansion(ids, counts, 0 if inner else 2))
    engine.expand(trees, expansions)
    for t, n in zip(trees, bare_sizes):
        t.stamp_version(0, 1, n)
        t.stamp_version(1, n)
    assert sum(len(t.nodes) for t in trees) > sum(bare_sizes)

    batch = collate(trees)
    versions: list[list[int | None]] = []
    for t in trees:
        for leaf in t.leaves():
            v: list[int | None] = [None] * len(t.prompt_token_ids)
            for nid in t.path(leaf.node_id)[1:]:
                v += [t.nodes[nid].weight_version] * len(t.nodes[nid].token_ids)
            versions.append(v)
    checked = {0: 0, 1: 0}
    distinct = 0  # tokens where A and B disagree: the check can tell the versions apart
    padded = batch.pad(tok.pad_token_id)  # what the learner reads as mu
    for row, (ids, mask, ver) in enumerate(zip(batch.input_ids, batch.loss_mask, versions)):
        under = {0: _logprobs(weights_a, ids), 1: _logprobs(model, ids)}
        mu = padded.sampler_logprobs[row, : len(ids)].numpy()
        for i in np.flatnonzero(mask):
            own, other = under[ver[i]][i], under[1 - ver[i]][i]  # type: ignore[index]
            assert abs(mu[i] - own) < 2e-3, (row, i, ver[i], mu[i], own)
            assert abs(mu[i] - own) < abs(mu[i] - other) or abs(own - other) < 2e-3
            checked[ver[i]] += 1  # type: ignore[index]
            distinct += abs(own - other) > 0.01
    assert checked[0] > 0 and checked[1] > 0, checked
    assert distinct > (checked[0] + checked[1]) // 2
    mean, worst = weight_staleness(trees, 1)
    assert worst == 1 and mean == pytest.approx(checked[0] / (checked[0] + checked[1]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.importance_sampling=off"], "set loss.importance_sampling to auto or on"),
        (["checkpoint_every=1"], "never overlaps with checkpoint_every=1"),
    ],
)
def test_overlap_settings_that_cannot_work_are_refused(overrides: list[str], message: str) -> None:
    from tracerl.config import TrainConfig
    from tracerl.config_loader import ConfigError, compose, conf_dir

    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(TrainConfig, conf_dir() / "train/smoke.yaml", ["pipeline.overlap=true", *overrides])


def _series(client: Any, run_id: str, key: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
        out.setdefault(m.step, []).append(m.value)
    return out


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """3 steps, one checkpoint at the end: steps 2 and 3 start beside the update of 1 and 2 (their bare turns one
    update old). A sampler dies during step 2's overlapped rollouts; the trainer dies after step 2, before any
    checkpoint, and the run starts again: steps 1 and 2 run in both attempts."""
    tmp = tmp_path_factory.mktemp("overlap")
    args = [
        "train",
        "--config",
        str(ROOT / "conf" / "train" / "smoke.yaml"),
        f"model.path={HABIT}",
        f"seed={SIGNAL_SEED}",
        f"tracking.uri=sqlite:///{tmp}/mlruns.db",
        f"tracking.artifact_location={tmp}/art",
        *UNHURRIED,
        "steps=3",
        "checkpoint_every=3",
        # no start evaluation and a 2-task last one (the smoke config's are on 24): nothing here reads them
        "eval_at_start=false",
        "env.math.eval_tasks=2",
        "pipeline.overlap=true",
        "faults.kill_rollout_worker_at_step=1",
        "faults.kill_trainer_at_step=1",
        "max_failures=2",
        "--out",
        str(tmp / "runs"),
    ]
    assert main(args) == 0
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlruns.db")
    (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    return {"tmp": tmp, "client": client, "run": run}


def test_an_overlapped_run_survives_faults_and_repeats_itself_after_a_restart(
    overlap_run: dict[str, Any],
) -> None:
    """Steps 1 (not overlapped) and 2 (overlapped, a sampler killed meanwhile in the first attempt) are logged by
    both attempts with the same values: the trees depend on the seed and the weights alone."""
    client, run, tmp = overlap_run["client"], overlap_run["run"], overlap_run["tmp"]
    rid = run.info.run_id
    assert run.info.status == "FINISHED"
    last = {
        k: {s: v[-1] for s, v in _series(client, rid, k).items()}
        for k in (M.STALENESS_MAX, M.STALENESS_MEAN, M.TIME_OVERLAPPED)
    }
    assert last[M.STALENESS_MAX] == {1: 0.0, 2: 1.0, 3: 1.0}
    assert (
        last[M.TIME_OVERLAPPED][1] == 0.0
        and last[M.TIME_OVERLAPPED][2] > 0
        and last[M.TIME_OVERLAPPED][3] > 0
    )
    stale = last[M.STALENESS_MEAN]
    assert (
        stale[1] == 0.0 and 0 < stale[2] < 1 and 0 < stale[3] < 1
    )  # bare turns one update old, the rest current
    assert sorted(_series(client, rid, M.phase_time("wait_rollouts"))) == [1, 2, 3]
    assert _series(client, rid, M.RETRIED)[2][0] >= 1  # the sampler lost mid-overlap, in the first attempt
    attempts = _series(client, rid, M.ATTEMPT)
    assert attempts == {1: [1.0, 2.0], 2: [1.0, 2.0], 3: [2.0]}
    for key in (M.GENERATED_TOKENS, M.EFFECTIVE_RATIO, M.REWARD_MEAN, M.LOSS, M.STALENESS_MEAN):
        for step in (1, 2):
            again = _series(client, rid, key)[step]
            assert len(again) == 2 and again[0] == again[1], (key, step, again)
    # The last step's trees record the weights that sampled each turn: version 1 (bare, beside update 2), then 2.
    local = client.download_artifacts(rid, "trees/step_00003/trees.jsonl", str(tmp))
    versions = {
        n["weight_version"]
        for line in Path(local).read_text().splitlines()
        for n in json.loads(line)["nodes"][1:]
    }
    assert versions == {1, 2}


def test_an_overlapped_steps_train_step_s_counts_its_own_rollout_and_update(
    overlap_run: dict[str, Any],
) -> None:
    """``time/train_step_s`` is logged by every attempt of every step and stays within the step (its bare rollouts
    ran beside the previous update, which counted them); ``time/startup_s`` once, by the first attempt."""
    client, rid = overlap_run["client"], overlap_run["run"].info.run_id
    train, step = _series(client, rid, M.TIME_TRAIN_STEP), _series(client, rid, M.TIME_STEP)
    assert {s: len(v) for s, v in train.items()} == {s: len(v) for s, v in step.items()} == {1: 2, 2: 2, 3: 1}
    assert all(0 < t <= w for s in train for t, w in zip(train[s], step[s]))
    assert {s: len(v) for s, v in _series(client, rid, M.TIME_STARTUP).items()} == {1: 1}


def test_a_step_ending_in_a_checkpoint_does_not_overlap_the_next() -> None:
    from tracerl.config import PipelineConfig, TrainConfig
    from tracerl.workflows.train.driver import overlaps_next

    cfg = TrainConfig(steps=6, checkpoint_every=3, pipeline=PipelineConfig(overlap=True))
    assert [overlaps_next(cfg, d) for d in range(1, 7)] == [True, True, False, True, True, False]
    assert not any(overlaps_next(TrainConfig(steps=6, checkpoint_every=3), d) for d in range(1, 7))


def test_the_pipeline_bench_reads_a_train_runs_steps(overlap_run: dict[str, Any]) -> None:
    """``bench pipeline --train-steps``: each mode's run config, and the measured steps read back from a run."""
    from tracerl.config_loader import compose, conf_dir
    from tracerl.workflows.pipeline.bench_train import (
        format_train,
        step_measurements,
        summarize_train,
        train_config,
    )
    from tracerl.workflows.pipeline.config import BenchPipelineConfig

    cfg = compose(
        BenchPipelineConfig, conf_dir() / "bench/pipeline.yaml", ["train_steps=3", "modes=[]", "seeds=1"]
    )
    over, bar = train_config(cfg, "overlap", 7, "x"), train_config(cfg, "barrier", 7, "x")
    assert (over.pipeline.overlap, over.pipeline.mode, bar.pipeline.overlap, bar.pipeline.mode) == (
        True,
        "streaming",
        False,
        "barrier",
    )
    assert over.steps == over.checkpoint_every == 3 and over.seed == 7 and not over.eval_at_start
    assert over.tracking.uri.endswith("/bench_out/pipeline/mlruns.db") and over.tracking.enabled
    run = overlap_run["run"]
    tc = dataclasses.replace(
        over, tracking=dataclasses.replace(over.tracking, uri=f"sqlite:///{overlap_run['tmp']}/mlruns.db")
    )
    steps = step_measurements(run.info.run_id, tc)
    assert [s["step"] for s in steps] == [2.0]
    assert steps[0]["staleness_mean"] > 0 and steps[0]["overlapped_s"] > 0
    assert all(s["busy"] > 0 and s["occupancy"] >= 1 and s["generated_tokens"] > 0 for s in steps)
    train = summarize_train(
        dataclasses.replace(cfg, train_modes=["overlap"]), [{"mode": "overlap", "seed": 7, "steps": steps}]
    )
    assert train["overlap"]["step_s"] == pytest.approx(steps[0]["step_s"])
    assert "overlap" in "\n".join(format_train(train, 3))
