"""`tracerl train` end to end on the smoke config: real Ray Train, actor pools, MLflow, checkpoints, faults,
resume, the Model Registry and `tracerl eval`.

One module-scoped run is shared: a sampler actor, an environment actor and the trainer's rank 0 each exit
for real during the run, and the run must still finish with every step logged once per report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, UNHURRIED, sqlite_client
from tracerl import metrics as M
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")


def _common(tiny: Path, tmp: Path) -> list[str]:
    return [
        f"model.path={tiny}",
        f"seed={SIGNAL_SEED}",
        f"tracking.uri=sqlite:///{tmp}/mlruns.db",
        f"tracking.artifact_location={tmp}/art",
        *UNHURRIED,
        "--out",
        str(tmp / "runs"),
    ]


HABIT = ROOT / "models" / "tiny-math-habit"
"""A tiny policy that succeeds often enough for mixed groups (a training signal) within a few steps."""
SIGNAL_SEED = 1
"""A run seed whose smoke steps hold mixed groups with HABIT: trace gives its 5 roots to 2 prompts a step, so a
seed decides whether 3 steps see any success (seed 0 saw none: every update skipped). Trees depend on the seed
alone (per-turn seeds), so the choice holds across restarts, worker counts and machine load."""


EVAL_EVERY_TOKENS = 700
"""Between one and two steps' tokens of the smoke run: some steps cross a multiple, some do not."""
EVAL_TASKS, EVAL_SUBSET = 8, 4
"""The run's held-out tasks (the smoke config's 24 cost three evaluations of 24 tasks, resume's included) and the
token schedule's subset of them: fewer than all, so a full evaluation and a subset one differ."""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("train")
    # Two DDP ranks (gloo): rank 0 drives the pools and broadcasts each batch; both update on their shards.
    args = [
        "train",
        "--config",
        SMOKE,
        *_common(HABIT, tmp),
        "trainer.num_workers=2",
        "trainer.cpus_per_worker=0.4",
        "faults.kill_rollout_worker_at_step=0",
        "faults.kill_env_worker_at_step=1",
        "faults.kill_trainer_at_step=1",
        "max_failures=3",
        f"eval_every_tokens={EVAL_EVERY_TOKENS}",  # the learning curve's schedule (workflows/train/budget.py)
        f"env.math.eval_tasks={EVAL_TASKS}",
        f"eval_subset={EVAL_SUBSET}",
    ]  # one restart is the drill; spare ones absorb a health check lost to a loaded machine
    assert main(args) == 0
    client = sqlite_client(tmp)
    exp = client.get_experiment_by_name("tracerl")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # the restart after the trainer's death continued the same MLflow run
    return {"tmp": tmp, "run_id": runs[0].info.run_id, "tiny": HABIT}


def test_run_survives_actor_and_trainer_deaths(run: dict[str, Any]) -> None:
    from tracerl.workflows.tracking.runs import metric_series

    client = sqlite_client(run["tmp"])
    r = client.get_run(run["run_id"])
    assert r.info.status == "FINISHED"
    er = metric_series(client, run["run_id"], "rollout/effective_ratio")
    assert sorted(er) == [1, 2, 3]
    retried = metric_series(client, run["run_id"], "budget/retried")
    assert (
        retried[1] >= 1
    )  # the sampler that died in step 0 (logged at step 1); env deaths: tests/test_pools.py
    # every required metric family is logged
    for key in (
        "train/loss",
        "train/clip_fraction",
        "train/approx_kl",
        "train/entropy",
        "train/grad_norm",
        "train/reward_mean",
        "train/accuracy",
        "train/response_tokens",
        "train/tokens_per_s",
        "system/peak_memory_mb",
        "time/update_policy_s",
        "time/sync_weights_s",
        "time/rollout_s",
        "budget/leaves",
        "budget/generated_tokens",
        "budget/prefill_tokens_reused",
        "eval/accuracy",
    ):
        assert key in r.data.metrics, key
    assert metric_series(client, run["run_id"], "budget/leaves") == {1: 15.0, 2: 15.0, 3: 15.0}
    # the key/ copies: the same accuracy and effective ratio, and the tokens generated so far (across the restart)
    assert metric_series(client, run["run_id"], "key/accuracy") == metric_series(
        client, run["run_id"], "eval/accuracy"
    )
    assert metric_series(client, run["run_id"], "key/effective_ratio") == er
    tokens = metric_series(client, run["run_id"], "budget/generated_tokens")
    assert metric_series(client, run["run_id"], "key/generated_tokens")[3] == sum(tokens.values())
    assert r.data.tags["tracerl.budget"] == "L=15 N=2 m_max=16" and r.data.tags["tracerl.seed"] == str(
        SIGNAL_SEED
    )
    assert r.data.tags["mlflow.note.content"].startswith("trace on math with the ")
    acc = metric_series(client, run["run_id"], "eval/accuracy")
    assert sorted(acc) == [0, 3]
    assert r.data.params["allocator.name"] == "trace" and r.data.tags["tracerl.git_sha"]
    artifacts = {a.path for a in client.list_artifacts(run["run_id"])}
    assert {"config.yaml", "trees"} <= artifacts
    trees = client.list_artifacts(run["run_id"], "trees/step_00003")
    assert {Path(a.path).name for a in trees} == {"trees.jsonl", "trees.html"}


def test_startup_is_logged_once_and_the_thread_counts_are_params(run: dict[str, Any]) -> None:
    """The trainer's restart (after step 2) does not log ``time/startup_s`` again; its parts add up to it."""
    client = sqlite_client(run["tmp"])
    history = client.get_metric_history(run["run_id"], M.TIME_STARTUP)
    assert [m.step for m in history] == [1]
    parts = [client.get_metric_history(run["run_id"], M.startup_phase(p)) for p in M.STARTUP_PHASES]
    assert all(len(h) == 1 for h in parts)
    assert sum(h[0].value for h in parts) <= history[0].value + 1e-6
    params = client.get_run(run["run_id"]).data.params
    assert int(params["threads/trainer"]) >= 1 and params["threads/sampler"] == "1"


def test_the_learning_curve_is_logged_against_tokens(run: dict[str, Any]) -> None:
    """Every evaluation (the start, the token schedule's on the subset, the last on every task) is a curve point at
    MLflow step = the run's generated tokens, with the totals reached there; the totals survive the restart."""
    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.runs import metric_series, run_storage
    from tracerl.workflows.train.budget import read_curve, token_eval_steps

    client, rid = sqlite_client(run["tmp"]), run["run_id"]
    per_step = metric_series(client, rid, M.GENERATED_TOKENS)
    total = metric_series(client, rid, M.TOTAL_GENERATED_TOKENS)
    assert sorted(total) == [1, 2, 3] and total[1] == per_step[1]
    assert total[3] == sum(per_step.values())  # restored from the step-2 checkpoint after the trainer's death
    assert metric_series(client, rid, M.TOTAL_LEAVES) == {1: 15.0, 2: 30.0, 3: 45.0}
    cpu, wall = metric_series(client, rid, M.TOTAL_CPU_S), metric_series(client, rid, M.TOTAL_WALL_S)
    assert 0 < cpu[1] < cpu[2] < cpu[3] and 0 < wall[1] < wall[2] < wall[3]
    # the schedule: the steps whose total crossed a multiple, then the last step (every task)
    scheduled = token_eval_steps([total[s] for s in (1, 2, 3)], EVAL_EVERY_TOKENS)
    evaluated = sorted({0, *scheduled, 3})
    updates = metric_series(client, rid, M.CURVE_UPDATES)
    assert updates == {0 if s == 0 else int(total[s]): float(s) for s in evaluated}
    assert metric_series(client, rid, M.CURVE_CPU_S) == {int(total[s]): cpu[s] for s in evaluated if s} | {
        0: 0.0
    }
    assert set(metric_series(client, rid, M.CURVE_ACCURACY)) == set(updates)
    assert metric_series(client, rid, M.CURVE_TASKS) == dict.fromkeys(updates, float(EVAL_SUBSET))
    eval_tokens = metric_series(client, rid, M.EVAL_GENERATED_TOKENS)
    assert sorted(eval_tokens) == evaluated and all(v > 0 for v in eval_tokens.values())
    timeouts = {k: metric_series(client, rid, k) for k in (M.EVAL_TOOL_TIMEOUTS, M.EVAL_GRADE_TIMEOUTS)}
    assert all(sorted(v) == evaluated for v in timeouts.values())  # counted at every evaluation, 0 or more
    # the curve file: the same points, each with its per-task outcomes on the same subset of tasks
    storage = run_storage(rid, TrackingConfig(uri=f"sqlite:///{run['tmp']}/mlruns.db"))
    points = read_curve(storage)
    assert [p["updates"] for p in points] == evaluated
    assert [p["full"] for p in points] == [s in (0, 3) for s in evaluated]
    assert all(len(p["tasks"]) == EVAL_SUBSET and set(p["tasks"]) <= set(p["outcomes"]) for p in points)
    assert len(points[-1]["outcomes"]) == EVAL_TASKS  # the last evaluation ran every held-out task
    assert [p["eval"]["tool_timeouts"] for p in points] == [
        timeouts[M.EVAL_TOOL_TIMEOUTS][s] for s in evaluated
    ]


def test_checkpoints_hold_a_changed_policy(run: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.runs import latest_checkpoint, metric_series, run_storage

    storage = run_storage(run["run_id"], TrackingConfig(uri=f"sqlite:///{run['tmp']}/mlruns.db"))
    ckpt = latest_checkpoint(storage)
    assert ckpt is not None and json.loads((ckpt / "state.json").read_text())["step"] == 3
    assert len([d for d in storage.glob("checkpoint_0*") if d.is_dir()]) <= 2  # keep_checkpoints
    assert {"predictor.pt", "trainer_rank0.pt", "trainer_rank1.pt", "config.yaml"} <= {
        p.name for p in ckpt.iterdir()
    }
    trained = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    assert all(torch.isfinite(p).all() for p in trained.parameters())
    # The policy moved: some step had a training signal and the saved weights differ from the start's.
    client = sqlite_client(run["tmp"])
    skipped = metric_series(client, run["run_id"], M.UPDATE_SKIPPED)
    assert sorted(skipped) == [1, 2, 3] and min(skipped.values()) == 0.0, (
        f"every update was skipped: {skipped}"
    )
    start = AutoModelForCausalLM.from_pretrained(run["tiny"]).state_dict()
    after = trained.state_dict()
    assert sorted(after) == sorted(start)
    assert any(not torch.equal(after[k], start[k]) for k in start), "the checkpoint holds the initial policy"
    # three schedule steps, counted across the restart after step 2: the trainer state came back from the checkpoint
    state = torch.load(ckpt / "trainer_rank0.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == 3
    # Adam moments exist only for the steps that had a non-zero advantage (the others were skipped)
    assert all(0 < float(s["step"]) <= 3 for s in state["optimizer"]["state"].values())
    assert state["optimizer"]["state"]


def test_resume_continues_the_same_run(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """The newest checkpoint's policy cut short: resume names the file and continues from the one before it, on a
    token budget one past the tokens of the run's 3 steps (steps unbounded): the resumed run keeps its totals, so
    step 4 crosses the budget and is the last, with its overshoot logged."""
    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.runs import metric_series, run_storage

    tmp, rid = run["tmp"], run["run_id"]
    storage = run_storage(rid, TrackingConfig(uri=f"sqlite:///{tmp}/mlruns.db"))
    weights = storage / "checkpoint_000003" / "policy" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    capsys.readouterr()
    client = sqlite_client(tmp)
    budget = int(metric_series(client, rid, M.TOTAL_GENERATED_TOKENS)[3]) + 1
    args = ["train", *_common(run["tiny"], tmp), f"resume={rid}", "steps=null", f"stop.tokens={budget}"]
    assert main(args) == 0
    out = capsys.readouterr()
    said = [line for line in (out.out + out.err).splitlines() if "is damaged, skipped" in line]
    assert len(said) == 1 and said[0].endswith(
        f"policy/model.safetensors is {size // 2} bytes, its manifest says {size}; "
        "falling back to checkpoint_000002 (step 2)"
    ), said
    assert len(client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])) == 1
    assert sorted(metric_series(client, rid, "rollout/effective_ratio")) == [1, 2, 3, 4]
    assert client.get_run(rid).info.status == "FINISHED"
    total = metric_series(client, rid, M.TOTAL_GENERATED_TOKENS)
    assert total[4] == total[3] + metric_series(client, rid, M.GENERATED_TOKENS)[4]
    assert metric_series(client, rid, M.OVERSHOOT_TOKENS) == {4: total[4] - budget}
    assert metric_series(client, rid, M.TOTAL_CPU_S)[4] > metric_series(client, rid, M.TOTAL_CPU_S)[3]
    assert metric_series(client, rid, M.CURVE_UPDATES)[int(total[4])] == 4.0  # the last step evaluates
    storage = run_storage(rid, TrackingConfig(uri=f"sqlite:///{tmp}/mlruns.db"))
    summary = json.loads((storage / "summary.json").read_text())
    assert (summary["stopped_by"], summary["overshoot_tokens"]) == ("tokens", total[4] - budget)


def test_register_and_load_back(run: dict[str, Any]) -> None:
    import mlflow
    from transformers import AutoModelForCausalLM

    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.model_registry import register, resolve_model_path

    uri = f"sqlite:///{run['tmp']}/mlruns.db"
    v = register(run["run_id"], "tiny-math-rl", "champion", uri)
    client = sqlite_client(run["tmp"])
    mv = client.get_model_version_by_alias("tiny-math-rl", "champion")
    assert int(mv.version) == v["version"]
    assert {
        "git_sha",
        "config_hash",
        "dataset_fingerprint",
        "predictor_checkpoint",
        "checkpoint_step",
    } <= set(mv.tags)
    model = mlflow.pyfunc.load_model("models:/tiny-math-rl@champion")
    out = model.predict(["Question: What is 2 + 3?\n"], params={"max_new_tokens": 8})
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], str)
    path = resolve_model_path("models:/tiny-math-rl@champion", TrackingConfig(uri=uri))
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "llama"


def test_eval_of_a_run_checkpoint(run: dict[str, Any], tmp_path: Path) -> None:
    tmp = run["tmp"]
    args = [
        "eval",
        f"model.path=runs:/{run['run_id']}",
        f"tracking.uri=sqlite:///{tmp}/mlruns.db",
        "env.math.eval_tasks=6",
        "sampler.max_turns=3",
        "--samples",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["greedy"]["tasks"] == 6 and s["sampled"]["k"] == 2
    assert s["pass@2"] >= s["avg@2"]
    traces = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 12 and {t["mode"] for t in traces} == {"greedy", "sampled_t1"}


def test_resume_of_an_unknown_run_says_so(
    tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_common(tiny_policy, tmp_path), "resume=0123abc"]) == 2
    assert "no MLflow run '0123abc'" in capsys.readouterr().err


def test_compare_ranks_runs_and_logs_the_report(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp = run["tmp"]
    assert main(["compare", "--tracking-uri", f"sqlite:///{tmp}/mlruns.db", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank" in out and "trace" in out
    rows = json.loads((tmp_path / "runs.json").read_text())
    assert [r["run_id"] for r in rows] == [run["run_id"]] and rows[0]["continuations"] == 2
    assert {
        "effective_ratio_per_step.png",
        "accuracy_vs_budget.png",
        "budget_shape_heatmap.png",
        "learning_curve.png",  # the run evaluates on a token schedule
    } <= {p.name for p in tmp_path.iterdir()}
    client = sqlite_client(tmp)
    exp = client.get_experiment_by_name("tracerl")
    cmp = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("tracerl.command") == "compare"
    ]
    assert len(cmp) == 1 and cmp[0].data.tags["tracerl.compared"] == run["run_id"]
    assert {Path(a.path).name for a in client.list_artifacts(cmp[0].info.run_id, "compare")} >= {"table.txt"}


def test_lora_on_two_fsdp_ranks_trains_adapters_and_resumes(tmp_path: Path) -> None:
    """trainer.strategy=fsdp (FSDP2 over 2 gloo ranks) with LoRA adapters, bfloat16 compute and activation
    checkpointing: checkpoints hold the merged float32 policy and the adapters, and a resumed run continues from the
    saved adapters (not freshly initialised ones)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.runs import latest_checkpoint, metric_series, run_storage

    habit = (
        ROOT / "models" / "tiny-math-habit"
    )  # succeeds often enough for mixed groups (a signal) in 2 steps
    common = [
        *_common(habit, tmp_path),
        "trainer.num_workers=2",
        "trainer.cpus_per_worker=0.4",
        "trainer.strategy=fsdp",
        "trainer.lora_rank=4",
        "trainer.lora_alpha=8",
        "checkpoint_every=1",
        "eval_at_start=false",
        "env.math.eval_tasks=4",
        # the GPU recipe on CPU: bfloat16 compute over float32 master weights, activation checkpointing
        "model.dtype=bfloat16",
        "trainer.gradient_checkpointing=true",
        "loss.kl_coef=0.05",
    ]  # a reference model, sharded like the policy
    assert main(["train", "--config", SMOKE, *common, "--steps", "2"]) == 0
    client = sqlite_client(tmp_path)
    run_id = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])[0].info.run_id
    assert client.get_run(run_id).data.params["trainer.strategy"] == "fsdp"
    storage = run_storage(run_id, TrackingConfig(uri=f"sqlite:///{tmp_path}/mlruns.db"))
    ckpt = latest_checkpoint(storage)
    assert ckpt is not None and {"lora_adapters.pt", "trainer_rank0.pt", "trainer_rank1.pt"} <= {
        p.name for p in ckpt.iterdir()
    }
    adapters = torch.load(ckpt / "lora_adapters.pt", weights_only=True)
    base = AutoModelForCausalLM.from_pretrained(habit).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype="auto").state_dict()
    assert sorted(trained) == sorted(base)
    assert {v.dtype for v in trained.values()} == {
        torch.float32
    }  # the master weights, not the bf16 compute copy
    layers = sum(1 for k in base if k.endswith("self_attn.q_proj.weight"))
    assert len(adapters) == 8 * layers  # A and B of q, k, v, o in every layer
    assert all(torch.equal(trained[k], base[k]) for k in base if ".mlp." in k)  # no adapters there: untouched
    skipped = metric_series(client, run_id, M.UPDATE_SKIPPED)
    assert sorted(metric_series(client, run_id, "train/kl_ref")) == [1, 2]
    assert min(skipped.values()) == 0.0, f"every update was skipped (no mixed group): {skipped}"
    # B starts at zero and moves with the first real update; the merged attention weights move with it
    assert any(bool(v.abs().sum() > 0) for k, v in adapters.items() if ".lora_B." in k), "LoRA B never moved"
    assert any(not torch.equal(trained[k], base[k]) for k in base if "self_attn" in k)

    assert main(["train", *_common(habit, tmp_path), f"resume={run_id}", "--steps", "3"]) == 0
    after = latest_checkpoint(storage)
    assert after is not None and json.loads((after / "state.json").read_text())["step"] == 3
    resumed = torch.load(after / "lora_adapters.pt", weights_only=True)
    # one more small step from the saved adapters; re-initialised A matrices would differ by far more
    assert max(float((resumed[k] - v).abs().max()) for k, v in adapters.items()) < 1e-2


def test_lora_targets_the_model_lacks_stop_before_a_run(
    tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "train",
        "--config",
        SMOKE,
        *_common(tiny_policy, tmp_path),
        "trainer.lora_rank=4",
        "trainer.lora_targets=[q_proj, c_attn]",
    ]
    assert main(args) == 2
    assert "trainer.lora_targets ['c_attn'] name no linear layer" in capsys.readouterr().err
    assert not (tmp_path / "mlruns.db").exists()  # checked before the tracking store (and a run) was created


def test_a_run_too_big_for_the_embedded_ray_stops_before_it_starts(
    tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Actors that cannot all fit would leave Ray waiting for ever (found with 2 trainer workers of 0.5 CPU beside
    the smoke config's pools on 2 cores): the run is refused with the shares and the keys that set them."""
    args = [
        "train",
        "--config",
        SMOKE,
        *_common(tiny_policy, tmp_path),
        "trainer.num_workers=64",
        "trainer.cpus_per_worker=1",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "needs 65.1 CPUs at once (trainer 64 x 1, samplers 2 x 0.5, environments 2 x 0.05) but the embedded Ray "
        "has"
    ) in err
    assert "lower trainer.num_workers / trainer.cpus_per_worker" in err and "cluster.num_cpus" in err
    assert not (tmp_path / "mlruns.db").exists()  # refused before the tracking store (and a run) was created
