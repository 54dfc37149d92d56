"""``tracerl bench peer``'s harness: the settings mapping, the process-tree PSS sampler on real processes, the
statistics and writers, and TRL's ``rollout_func`` adapter on trees the project's engine rolled out (gold replay of
the math environment, scripted sampler). TRL itself is not in CI's venv: the one test that runs TRL's side is
skipped unless ``trl`` imports (run it with ``.venv-peer/bin/pytest``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, TOOL_TIMEOUT_S, UNHURRIED
from tests.test_stepper import BUDGET, _parts
from tracerl.config import SamplerConfig, env_config
from tracerl.config_loader import ConfigError, compose, to_yaml
from tracerl.engine.react import PlainTemplate
from tracerl.engine.stepper import Stepper
from tracerl.envs.math.config import MathEnvConfig
from tracerl.envs.sandbox import SandboxConfig
from tracerl.workflows.bench.env import gold_engine
from tracerl.workflows.experiments.config import BenchPeerConfig
from tracerl.workflows.experiments.peer_report import (
    aggregate,
    best_sides,
    format_table,
    side_stats,
    wall_to_target,
    write_json,
)
from tracerl.workflows.experiments.peer_settings import (
    grpo_draws,
    replay_draws,
    run_order,
    settings,
    side_config,
    side_mode,
    side_tag,
    side_threads,
)
from tracerl.workflows.experiments.peer_sides import run_process, run_tracerl_side, run_trl_side
from tracerl.workflows.experiments.peer_trl import PeerRollout, env_reward, group_runs, rollout_outputs
from tracerl.workflows.experiments.proc_memory import TreeMemory, same_address_space, tree_pss_mb

PEER = ROOT / "conf/bench/peer.yaml"
TINY = [
    "steps=1",
    "warmup_steps=0",
    "budget.num_leaves=6",
    "budget.group_size=2",
    "budget.pool_factor=2",
    "loss.micro_batch_size=3",
    "sampler.max_turns=2",
    "sampler.max_turn_tokens=24",
    "env.math.num_tasks=6",
    "env.math.eval_tasks=4",
    f"model.path={ROOT / 'models/tiny-math-habit'}",
    *UNHURRIED,
]


def test_settings_map_the_issue_setup_onto_trl() -> None:
    cfg = compose(BenchPeerConfig, PEER)
    m = settings(cfg.train)
    a = m["trl_args"]
    # 48 rollouts a step in groups of 4, micro-batches of 16: one optimizer step per generation batch
    assert (a["generation_batch_size"], a["num_generations"]) == (48, 4)
    assert a["per_device_train_batch_size"] * a["gradient_accumulation_steps"] == 48
    assert (a["learning_rate"], a["adam_beta1"], a["adam_beta2"], a["weight_decay"]) == (
        1e-4,
        0.9,
        0.999,
        0.0,
    )
    assert (a["max_grad_norm"], a["beta"], a["epsilon"], a["epsilon_high"]) == (1.0, 0.0, 0.2, 0.28)
    assert (a["loss_type"], a["scale_rewards"], a["num_iterations"]) == ("dapo", "none", 1)
    assert a["temperature"] == cfg.train.sampler.temperature and a["max_steps"] == cfg.train.steps
    rows = {r["setting"]: r for r in m["rows"]}
    assert rows["tasks"]["value"] == "math, 256 training prompts"
    assert rows["tool tokens"]["trl"].startswith("env_mask=0")
    # TRL's GRPOConfig defaults gradient checkpointing on; tracerl's trainer runs without it, so TRL is told so
    assert a["activation_checkpointing"] is False and "gradient_checkpointing" not in a
    assert rows["activation checkpointing"]["trl"] == "activation_checkpointing=False"
    # every row says why where TRL's side departs from what TRL's docs would do, and only there
    departs = {"checkpoint", "dtype", "optimizer", "schedule", "activation checkpointing", "checkpoints"}
    departs |= {"logging", "torch threads", "tasks", "micro-batch"}
    departs |= {"predictor"}  # and where tracerl's grpo side departs from the bench's config: it fits none
    assert {k for k, r in rows.items() if r["why"]} == departs
    # one optimizer step per generation batch and one epoch: TRL computes no old log-probs (no extra forward)
    assert "no extra forward" in rows["old log-probs"]["trl"]
    json.dumps(m)  # printed into the JSON as is
    seq = dataclasses.replace(
        cfg.train, loss=dataclasses.replace(cfg.train.loss, aggregation="seq_mean_token_mean")
    )
    assert settings(seq)["trl_args"]["loss_type"] == "grpo"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("loss.micro_batch_size=10", "multiple of loss.micro_batch_size"),
        ("loss.importance_sampling=on", "loss.importance_sampling"),
        ("trainer.num_workers=2", "trainer.num_workers=1"),
    ],
)
def test_settings_refuse_what_trl_cannot_match(override: str, says: str) -> None:
    cfg = compose(BenchPeerConfig, PEER, [override])
    with pytest.raises(ValueError, match=says):
        settings(cfg.train)


def test_bad_sides_and_a_missing_peer_venv_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sides must name some of trl, grpo, trace, grpo-ray, trace-ray"):
        compose(BenchPeerConfig, PEER, ["sides=[trl,ppo]"])
    from tracerl.workflows.cli.app import main

    assert main(["bench", "peer", f"peer_python={tmp_path}/nope", f"--out={tmp_path}"]) == 2
    assert not (tmp_path / "results.json").exists()


def test_side_configs_and_alternating_order(tmp_path: Path) -> None:
    cfg = compose(BenchPeerConfig, PEER, [f"bench_out={tmp_path}"])
    g = side_config(cfg, "grpo", 3, "peer-grpo")
    t = side_config(cfg, "trace", 3, "peer-trace")
    assert (g.allocator.name, g.loss.advantage, t.allocator.name, t.loss.advantage) == (
        "grpo",
        "grpo",
        "trace",
        cfg.train.loss.advantage,
    )
    assert g.seed == 3 and not g.eval_at_start and g.out_dir == str(tmp_path / "runs")
    # grpo ignores scores: its side fits no predictor (as TRL); trace keeps the configured one
    assert (g.predictor.name, t.predictor) == ("constant", cfg.train.predictor)
    assert (
        (g.budget, g.optim, g.sampler)
        == (t.budget, t.optim, t.sampler)
        == (
            cfg.train.budget,
            cfg.train.optim,
            cfg.train.sampler,
        )
    )
    (tmp_path / "g.yaml").write_text(to_yaml(g))  # what the side's `tracerl train --config` reads back
    from tracerl.config import TrainConfig

    assert compose(TrainConfig, tmp_path / "g.yaml") == g
    # grpo and trace run in-process, their -ray twins on Ray, with the same training setup otherwise
    r = side_config(cfg, "grpo-ray", 3, "peer-grpo-ray")
    assert (g.cluster.address, t.cluster.address, r.cluster.address) == ("inprocess", "inprocess", "local")
    assert dataclasses.replace(r, cluster=g.cluster, run_name=g.run_name) == g
    assert [side_mode(s) for s in ("trl", "grpo", "trace-ray")] == ["trl", "inprocess", "ray"]
    assert [run_order(["trl", "grpo", "trace"], k) for k in range(3)] == [
        ["trl", "grpo", "trace"],
        ["grpo", "trace", "trl"],
        ["trace", "trl", "grpo"],
    ]


def test_sides_at_their_own_thread_counts(tmp_path: Path) -> None:
    cfg = compose(
        BenchPeerConfig,
        PEER,
        [f"bench_out={tmp_path}", "sides=[trl@1,trl@2,grpo@2,trace]", "torch_threads=1"],
    )
    assert [side_threads(cfg, s) for s in cfg.sides] == [1, 2, 2, 1]
    assert [side_mode(s) for s in cfg.sides] == ["trl", "trl", "inprocess", "inprocess"]
    assert [side_tag(s) for s in cfg.sides] == ["trl-t1", "trl-t2", "grpo-t2", "trace"]
    g2, g = side_config(cfg, "grpo@2", 0, "a"), side_config(cfg, "grpo", 0, "a")
    assert (g2.trainer.torch_threads, g.trainer.torch_threads) == (2, 1)
    assert dataclasses.replace(g2, trainer=g.trainer) == g
    assert settings(cfg.train, [1, 2])["rows"][-1]["value"] == "1/2"
    for bad in ("trl@0", "trl@x", "ppo@2"):
        with pytest.raises(ConfigError, match="optionally with @T"):
            compose(BenchPeerConfig, PEER, [f"sides=[{bad}]"])
    with pytest.raises(ConfigError, match="names a side twice"):
        compose(BenchPeerConfig, PEER, ["sides=[trl@2,trl@2]"])


def test_the_bench_runs_each_side_at_its_threads_and_picks_the_fastest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_peer_bench with the sides' runners faked: each variant runs with its own threads and tag, in the rotated
    order, and the summary's ``best`` takes each side's fastest variant."""
    from tracerl.workflows.experiments import peer

    secs = {("trl", 1): 4.0, ("trl", 2): 3.0, ("grpo", 1): 2.4, ("grpo", 2): 2.7}
    calls: list[tuple[str, int, str]] = []

    def fake(cfg: BenchPeerConfig, side: str, tag: str) -> dict[str, object]:
        base, t = side.split("@")[0], side_threads(cfg, side)
        calls.append((side, t, tag.rsplit("-", 3)[0]))  # less -s<seed>-<date>-<time>
        return _run(0.0, [9.0, secs[base, t], secs[base, t]], {}, {}) | {"threads": {}, "cpus": [0], "rc": 0}

    monkeypatch.setattr(peer, "run_trl_side", lambda cfg, seed, tag, progress, side: fake(cfg, side, tag))
    monkeypatch.setattr(peer, "run_tracerl_side", lambda cfg, side, seed, tag, progress: fake(cfg, side, tag))
    monkeypatch.setattr(peer, "peer_interpreter", lambda cfg: Path(sys.executable))
    cfg = compose(
        BenchPeerConfig,
        PEER,
        [
            f"bench_out={tmp_path}",
            "sides=[trl@1,trl@2,grpo@1,grpo@2]",
            "seeds=2",
            "steps=3",
            "interleave=seed",
        ],
    )
    out = peer.run_peer_bench(cfg)
    assert calls[:4] == [
        ("trl@1", 1, "peer-trl-t1"),
        ("trl@2", 2, "peer-trl-t2"),
        ("grpo@1", 1, "peer-grpo-t1"),
        ("grpo@2", 2, "peer-grpo-t2"),
    ]
    assert [c[0] for c in calls[4:]] == ["trl@2", "grpo@1", "grpo@2", "trl@1"]  # seed 1: rotated by one
    assert out["side_torch_threads"] == {"trl@1": 1, "trl@2": 2, "grpo@1": 1, "grpo@2": 2}
    assert out["best"]["trl"]["side"] == "trl@2" and out["best"]["grpo"]["side"] == "grpo@1"
    assert out["best"]["grpo"]["vs_trl"] == pytest.approx(0.8)
    assert out["modes"] == {"trl@1": "trl", "trl@2": "trl", "grpo@1": "inprocess", "grpo@2": "inprocess"}
    assert [r["setting"] for r in out["settings"]["rows"]][-1] == "torch threads"
    assert out["settings"]["rows"][-1]["value"] == "1/2"
    # interleave=step: each seed's sides go to run_in_turns together, in the same rotated order
    turns: list[list[str]] = []

    def in_turns(cfg: BenchPeerConfig, jobs: dict[str, str]) -> dict[str, dict[str, object]]:
        turns.append(list(jobs))
        return {side: fake(cfg, side, tag) for side, tag in jobs.items()}

    monkeypatch.setattr(peer, "_job", lambda cfg, side, seed, tag, progress: tag)
    monkeypatch.setattr(peer, "run_in_turns", in_turns)
    out = peer.run_peer_bench(dataclasses.replace(cfg, interleave="step"))
    assert turns == [["trl@1", "trl@2", "grpo@1", "grpo@2"], ["trl@2", "grpo@1", "grpo@2", "trl@1"]]
    assert out["interleave"] == "step" and out["best"]["grpo"]["vs_trl"] == pytest.approx(0.8)


def test_tree_memory_counts_a_real_child_process() -> None:
    # a parent holding ~40 MB and a child holding ~80 MB, both touched (resident), until stdin closes
    code = (
        "import subprocess, sys\n"
        "b = bytearray(40 * 2**20)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import sys; b = bytearray(80 * 2**20); "
        "print(1, flush=True); sys.stdin.read()'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "c.stdout.readline(); print('ready', flush=True); sys.stdin.read(); c.stdin.close(); c.wait()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        mb, n = tree_pss_mb(p.pid)
        assert n == 2 and mb > 110
        with TreeMemory(p.pid, every=0.05) as mem:
            while mem.samples < 2:
                mem._stop.wait(0.05)
        assert mem.peak_processes == 2 and mem.peak_mb > 110
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=60)
    assert tree_pss_mb(p.pid) == (0.0, 0)  # gone: nothing counted


def test_run_process_records_the_tree_and_names_the_log_of_a_failure(tmp_path: Path) -> None:
    ok = run_process(
        [sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
        tmp_path / "a.txt",
        1,
        0.05,
        3,
    )
    assert ok["rc"] == 0 and len(ok["cpus"]) == 1 and (tmp_path / "a.txt").read_text().strip() == "3"
    with pytest.raises(RuntimeError, match=r"exited 3; see .*b\.txt: boom"):
        run_process(
            [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "b.txt", 1, 0.05
        )


def _run(launch: float, step_s: list[float], evals: dict[int, float], acc: dict[int, float]) -> dict:
    """A side's record: steps back to back from launch + 10 s, each taking step_s[k] (2 s of rollout, 1 of update)
    and then its evaluation's seconds."""
    t, steps = launch + 10.0, []
    for k, d in enumerate(step_s, start=1):
        steps.append(
            {
                "step": k,
                "begin": t,
                "end": t + d,
                "eval_s": evals.get(k, 0.0),
                "rollout_s": 2.0,
                "update_s": 1.0,
                "generated_tokens": 100.0 * d,
                "generate_s": 1.5,
                "tools_s": 0.25,
            }
        )
        t += d + evals.get(k, 0.0)
    return {
        "launch": launch,
        "steps": steps,
        "evals": [{"step": k, "accuracy": v} for k, v in acc.items()],
        "peak_pss_mb": 1000.0,
        "peak_processes": 3,
    }


def test_side_stats_leave_out_warmup_and_evaluations() -> None:
    run = _run(100.0, [9.0, 4.0, 6.0], {2: 30.0, 3: 5.0}, {2: 0.4, 3: 0.6})
    st = side_stats(run, warmup=1, acc0=0.2)
    assert st["startup_s"] == pytest.approx(10.0)
    # steps 2 and 3; step 2's 30 s evaluation is not step 3's time
    assert st["s_per_step"] == pytest.approx(5.0)
    assert (st["rollout_s"], st["update_s"], st["rest_s"]) == pytest.approx((2.0, 1.0, 2.0))
    assert (st["generate_s"], st["tools_s"]) == pytest.approx((1.5, 0.25))  # of the rollout
    assert st["gen_tokens_per_s"] == pytest.approx(100.0)
    # x: wall seconds from launch, earlier evaluations left out, start-up included
    assert [tuple(p) for p in st["curve"]] == [(10.0, 0.2), (23.0, 0.4), (29.0, 0.6)]
    assert wall_to_target(st["curve"], 0.5) == pytest.approx(26.0)
    assert wall_to_target(st["curve"], 0.2) == pytest.approx(10.0)
    assert wall_to_target(st["curve"], 0.9) == math.inf


def test_aggregate_table_and_json(tmp_path: Path) -> None:
    a = [side_stats(_run(0.0, [9.0, 4.0, 4.0], {3: 1.0}, {3: 0.6}), 1, 0.2) for _ in range(2)]
    b = [side_stats(_run(0.0, [9.0, 8.0, 8.0], {3: 1.0}, {3: 0.3}), 1, 0.2)]
    out = aggregate({"trl": a, "grpo": b}, target=0.5)
    assert out["trl"]["s_per_step"] == {"mean": 4.0, "std": 0.0} and out["trl"]["seeds"] == 2
    assert out["trl"]["wall_to_target_s"]["reached"] == 2 and out["grpo"]["wall_to_target_s"] == {
        "per_seed": [None],
        "mean_reached": None,
        "reached": 0,
    }
    summary = {
        "sides": out,
        "steps": 3,
        "seeds": 2,
        "warmup_steps": 1,
        "threads": 2,
        "torch_threads": 1,
        "target": 0.5,
    }
    table = format_table(summary)
    lines = table.splitlines()
    assert "s to 0.500" in lines[1] and lines[2].split()[0] == "trl" and "never" in lines[3]
    assert "4.00" in lines[2] and "8.00" in lines[3]
    assert lines[1].split()[3:5] == ["(gen", "tools)"] and lines[2].split()[4:6] == ["1.50", "0.25"]
    assert "fastest" not in table  # one thread count a side: nothing to pick
    # each side at the thread count best for it: trl@2's 4 s against grpo@1's 3 s
    c = [side_stats(_run(0.0, [9.0, 3.0, 3.0], {}, {}), 1)]
    two = aggregate({"trl@1": b, "trl@2": a, "grpo@1": c, "grpo@2": b}, None)
    best = best_sides(two)
    assert {k: (v["side"], v["vs_trl"]) for k, v in best.items()} == {
        "trl": ("trl@2", 1.0),
        "grpo": ("grpo@1", 0.75),
    }
    table = format_table({**summary, "sides": two, "best": best, "target": None})
    assert table.splitlines()[-1] == "fastest: trl@2 4.00, grpo@1 3.00 (0.75 x TRL's)"
    assert table.splitlines()[0].endswith("interleave=seed")
    turns = format_table({**summary, "interleave": "step"}).splitlines()
    assert turns[0].endswith("interleave=step") and turns[-1].startswith(
        "peak PSS: the sides' processes lived"
    )
    write_json({**summary, "x": math.inf}, tmp_path / "r.json", str(tmp_path / "extra/r.json"))
    back = json.loads((tmp_path / "extra/r.json").read_text())
    assert back["sides"]["trl"]["seeds"] == 2 and (tmp_path / "r.json").is_file()


def test_rollout_outputs_from_the_project_engine() -> None:
    """TRL's rollout_func output from real trees: the math environment's gold turns replayed through the engine
    (sandboxed tool, math-verify reward), two rollouts per group as TRL's prompt list repeats them."""
    from tracerl.envs.math.env import MathEnv

    cfg = env_config(
        name="math",
        math=MathEnvConfig(num_tasks=4, eval_tasks=4, sandbox=SandboxConfig(timeout_s=TOOL_TIMEOUT_S)),
    )
    env = MathEnv.from_config(cfg)
    # two tasks whose reference solution runs the tool before answering
    plain = PlainTemplate()
    prompts = [p for p in MathEnv.prompts(cfg, held_out=True) if len(env.gold_turns(p, plain)) > 1][:2]
    engine = gold_engine(env, prompts, "plain", SamplerConfig())
    trl_prompts = [prompts[0].text] * 2 + [prompts[1].text] * 2
    assert group_runs(trl_prompts) == [(prompts[0].text, 2), (prompts[1].text, 2)]
    trees = engine.rollout(prompts, [2, 2])
    out = rollout_outputs(trees, eos_id=256)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"}
    assert all(len(v) == 4 for v in out.values())
    assert out["env_reward"] == [1.0] * 4  # gold answers, graded by the environment in the loop
    for i, tree in enumerate(t for t in trees for _ in range(2)):
        assert out["prompt_ids"][i] == tree.prompt_token_ids
        c, mask, lps = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
        assert len(c) == len(mask) == len(lps)
        assert 0 in mask and 1 in mask  # a tool call: observation tokens masked, model tokens trained
        text = bytes(t for t, m in zip(c, mask) if not m).decode()
        assert "Observation:" in text and "Final Answer" not in text
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        leaf = tree.leaves()[i % 2]
        ids, model_mask, _ = tree.sequence(leaf.node_id)
        assert c == ids[len(tree.prompt_token_ids) :] and mask == [
            int(m) for m in model_mask[len(tree.prompt_token_ids) :]
        ]
    assert env_reward([], [], env_reward=out["env_reward"], trainer_state=None) == [1.0] * 4


def test_replayed_draws_are_the_prompts_a_grpo_stepper_rolls_out() -> None:
    """TRL's dataset order (grpo's draws replayed without rollouts) is what a real grpo ``Stepper`` rolls out, step
    by step, once its predictor is fitted and ready too; and the bench's TRL spec carries it for every step."""
    backend, prompts, alloc, pred = _parts("grpo", seed=5)
    stepper = Stepper(prompts, alloc, pred, backend, np.random.default_rng(5))
    rolled = []
    for step in range(4):
        out = stepper.run(step, BUDGET)
        pred.fit(out.sampled_trees)
        rolled.append([t.prompt.prompt_id for t in out.sampled_trees])
    assert pred.ready
    replayed = [[p.prompt_id for p in s] for s in replay_draws(prompts, BUDGET, 5, 4)]
    assert replayed == rolled and all(len(s) == BUDGET.num_leaves // BUDGET.group_size for s in rolled)
    assert replay_draws(prompts, BUDGET, 6, 4) != replayed  # the seed decides them

    tc = side_config(compose(BenchPeerConfig, PEER), "grpo", 0, "t")
    draws = grpo_draws(tc)
    assert len(draws) == tc.steps and all(len(s) == 12 for s in draws)
    assert settings(tc)["trl_args"]["shuffle_dataset"] is False
    with pytest.raises(ValueError, match="budget.token_budget=null"):
        grpo_draws(dataclasses.replace(tc, budget=dataclasses.replace(tc.budget, token_budget=1000)))


def test_a_prompt_in_two_groups_gets_distinct_ids() -> None:
    from tracerl.types import Prompt

    p, q = Prompt("a", "what is 1+1?", "2"), Prompt("b", "what is 2+2?", "4")
    r = PeerRollout.__new__(PeerRollout)
    r.by_text = {p.text: p, q.text: q}
    ps, counts = r.trees_for([p.text, p.text, q.text, q.text, p.text, p.text])
    assert [x.prompt_id for x in ps] == ["a", "b", "a#2"] and counts == [2, 2, 2]
    assert ps[2].text == p.text and ps[2].answer == "2"


NEEDS_TRL = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="needs TRL (`make bench-peer` builds .venv-peer)"
)


@NEEDS_TRL
def test_trl_config_of_the_settings(tmp_path: Path) -> None:
    """What TRL makes of the mapped arguments: no activation checkpointing, no bf16, and one generation per
    optimizer step with one epoch (so TRL computes no old log-probs: no extra forward)."""
    from trl import GRPOConfig

    cfg = compose(BenchPeerConfig, PEER)
    args = GRPOConfig(**settings(cfg.train)["trl_args"], output_dir=str(tmp_path), report_to="none")
    assert (args.activation_checkpointing, args.gradient_checkpointing, args.bf16) == (False, False, False)
    assert args.steps_per_generation == args.gradient_accumulation_steps == 3 and args.num_iterations == 1
    assert args.generation_batch_size == 48


@NEEDS_TRL
def test_trl_side_runs_one_step(tmp_path: Path) -> None:
    """TRL's GRPOTrainer for one step on the tiny policy, through the bench's own subprocess runner."""
    from tracerl.workflows.experiments.peer_sides import run_trl_side

    cfg = compose(
        BenchPeerConfig,
        PEER,
        [*TINY, f"bench_out={tmp_path}", f"peer_python={sys.executable}", "threads=1", "torch_threads=1"],
    )
    run = run_trl_side(cfg, 0, "t", lambda s: None)
    assert [s["step"] for s in run["steps"]] == [1] and run["evals"][0]["step"] == 1
    assert run["steps"][0]["generated_tokens"] > 0 and run["peak_pss_mb"] > 100
    assert (tmp_path / "t" / "spec.json").is_file() and 0.0 <= run["evals"][0]["accuracy"] <= 1.0


@NEEDS_TRL
def test_both_sides_roll_out_the_same_first_step(tmp_path: Path) -> None:
    """TRL's side and tracerl's grpo side roll out the same prompts with the same seeds: before any update their
    trees are the same, so the first step generates the same number of tokens on both."""
    cfg = compose(
        BenchPeerConfig,
        PEER,
        [*TINY, f"bench_out={tmp_path}", f"peer_python={sys.executable}", "threads=1", "torch_threads=1"],
    )
    trl = run_trl_side(cfg, 0, "t", lambda s: None)
    grpo = run_tracerl_side(cfg, "grpo", 0, "g", lambda s: None)
    assert trl["steps"][0]["generated_tokens"] == grpo["steps"][0]["generated_tokens"] > 0


def test_a_child_sharing_its_parents_address_space_is_told_apart() -> None:
    """kcmp(2) says whether two processes share one address space: a vfork'd child before its exec does, and its PSS
    is its parent's (tree_pss_mb counts it once); a forked child does not."""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("kcmp's number is known here for x86_64 and aarch64 only")
    assert same_address_space(os.getpid(), os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not same_address_space(os.getpid(), child.pid)
    finally:
        child.kill()
        child.wait()
