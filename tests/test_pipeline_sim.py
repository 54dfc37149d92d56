"""The pipeline scale model (workflows/experiments/pipeline_sim.py): hand-computed engine runs, step times and utilisation of
each mode, properties on the shipped profiles, validation against a CPU bench JSON, and ``bench pipeline --sim``."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from tracerl.workflows.cli.app import main
from tracerl.workflows.experiments.pipeline_profile import (
    Dist,
    Profile,
    load_profile,
    profile_from_dict,
    shipped_profiles,
)
from tracerl.workflows.experiments.pipeline_report import validation_error
from tracerl.workflows.experiments.pipeline_sim import (
    Path_,
    _follow,
    run_continuous,
    run_rounds,
    simulate,
    simulate_sampler,
    step_metrics,
)


def profile(**kw: object) -> Profile:
    """One sampler, one prompt, one bare rollout of one 10-token turn, no continuations, 0.1 s an iteration."""
    base: dict[str, object] = dict(
        name="hand",
        batching="continuous",
        prompts_per_sampler=1,
        bare_per_prompt={"const": 1},
        continuations_per_bare=0,
        turns={"const": 1},
        turn_tokens={"const": 10},
        prompt_tokens=100,
        obs_tokens=5,
        tool_s={"const": 1.0},
        decode_step_s={1: 0.1},
        prefill_tokens_per_s=1000.0,
        max_batch=8,
        tool_workers=0,
        update_s=1.0,
        replications=1,
    )
    base.update(kw)
    return profile_from_dict(base)


def test_one_sampler_one_turn_known_step_time() -> None:
    """prefill 100 / 1000 = 0.1 s, 10 iterations x 0.1 s = 1 s, update 1 s: every mode's step is 2.1 s but
    overlap's, max(1.1, 1) = 1.1 s; the sampler computes all through its rollout."""
    p = profile()
    res = simulate(p, (1,))
    assert res["barrier"]["rollout_s"] == pytest.approx([1.1])
    assert res["barrier"]["step_s"] == pytest.approx([2.1])
    assert res["streaming"]["step_s"] == pytest.approx([2.1])
    assert res["overlap"]["step_s"] == pytest.approx([1.1])
    assert res["barrier"]["util"] == pytest.approx([1.1 / 2.1])
    assert res["overlap"]["util"] == pytest.approx([1.0])
    assert res["barrier"]["bubble"] == pytest.approx([1.0 / 2.1])  # idle only during the update
    assert res["barrier"]["occupancy"] == pytest.approx([1.0])


def test_rounds_engine_by_hand() -> None:
    """Two 2-turn paths in one round: call 0.05 + prefill 2 x 10 / 100 + 5 x 0.2; both tool calls on one worker
    (2 x 1 s); second round: 0.05 + 2 x 5 / 100 + 5 x 0.2. Total 1.25 + 2 + 1.15 = 4.4 s, busy 2.4 s."""
    p = profile(
        batching="rounds",
        decode_step_s={1: 0.1, 2: 0.2},
        prefill_tokens_per_s=100.0,
        call_overhead_s=0.05,
        tool_workers=1,
    )
    paths = [Path_(0, True, [5, 5], [1.0], 10, [10, 20]) for _ in range(2)]
    run = run_rounds(p, paths)
    assert run.finish_s == pytest.approx(4.4)
    assert run.busy_s == pytest.approx(2.4)
    assert run.span_s == pytest.approx(4.4)
    assert run.rows / run.iters == 2


def test_streaming_starts_a_prompt_s_continuations_when_its_own_bare_rollouts_end() -> None:
    """Prompt 0's bare rollout ends at 1 s, prompt 1's at 3 s; prompt 0's continuation is 30 tokens. Barrier: 3 s
    of bare rollouts, then 3 s of continuations = 6 s; streaming: prompt 0's continuation runs from 1 s to 4 s."""
    p = profile(prompt_tokens=0)
    bare = [Path_(0, True, [10], [], 0, [0]), Path_(1, True, [30], [], 0, [0])]
    cont = [Path_(0, False, [30], [], 0, [10]), Path_(1, False, [5], [], 0, [30])]
    assert run_continuous(p, bare).finish_s + run_continuous(p, cont).finish_s == pytest.approx(6.0)
    stream = run_continuous(p, bare, _follow(bare, cont, 0.0))
    assert stream.finish_s == pytest.approx(4.0)
    assert stream.busy_s == pytest.approx(4.0)  # always at least one row decoding
    # overlap: the continuations also wait for the new weights (here at 5 s); the wait is bubble, not flight
    late = run_continuous(p, bare, _follow(bare, cont, 0.0, not_before=5.0))
    assert late.finish_s == pytest.approx(5.0 + 3.0)
    assert late.span_s == pytest.approx(3.0 + 3.0)
    rounds = run_rounds(replace(p, batching="rounds"), bare, _follow(bare, cont, 0.0))
    # rounds: round 1 runs 30 iterations (both rows), prompt 0's continuation joins round 2 with prompt 1's
    assert rounds.finish_s == pytest.approx(3.0 + 3.0)


def test_continuous_tool_wait_is_not_bubble() -> None:
    """A 2-turn episode: 10 iterations, a 1 s tool call, prefill 5 / 1000, 10 iterations: in flight throughout."""
    p = profile()
    run = run_continuous(p, [Path_(0, True, [10, 10], [1.0], 0, [0, 15])])
    assert run.finish_s == pytest.approx(1.0 + 1.0 + 0.005 + 1.0)
    assert run.busy_s == pytest.approx(2.005)
    assert run.span_s == pytest.approx(run.finish_s)


@pytest.mark.parametrize("name", ["tiny_cpu.yaml", "qwen3_8b_h100.yaml"])
def test_properties_on_the_shipped_profiles(name: str) -> None:
    """Overlap is never slower than streaming; utilisation and bubble are fractions. Barrier is slower than
    streaming on average; not in every draw: with hf's rounds a round is as long as its longest row, so
    continuations that join a round of long bare turns can cost more than they save, and with continuous batching
    early joins pause decoding for their prefill and lengthen others' KV reads (within 1% here; docs)."""
    p = load_profile(Path("conf/bench/pipeline_profiles") / name)
    p = replace(p, prompts_per_sampler=min(p.prompts_per_sampler, 4), replications=1)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        draws = [simulate_sampler(p, rng, 4 * i) for i in range(4)]
        for n in (1, 2, 4):
            m = step_metrics(p, draws[:n])
            assert m["streaming"]["step_s"] >= m["overlap"]["step_s"] > 0
            if p.batching == "continuous":
                assert m["barrier"]["step_s"] >= 0.99 * m["streaming"]["step_s"]
            for mode in m.values():
                assert 0.0 <= mode["util"] <= 1.0 and 0.0 <= mode["bubble"] <= 1.0
                assert mode["util"] + mode["bubble"] <= 1.0 + 1e-9
                assert 0.0 <= mode["rollout_util"] <= 1.0
    res = simulate(replace(p, replications=20 if p.batching == "rounds" else 3), (2, 8))
    assert all(b >= s for b, s in zip(res["barrier"]["step_s"], res["streaming"]["step_s"]))


def test_barrier_waits_for_the_slowest_sampler() -> None:
    """With random lengths, the barrier's rollout time grows with S (the max over more samplers)."""
    p = profile(
        turns={"pmf": {1: 0.5, 3: 0.5}}, continuations_per_bare=2, prompts_per_sampler=2, replications=2
    )
    res = simulate(p, (1, 8))
    assert res["barrier"]["rollout_s"][1] > res["barrier"]["rollout_s"][0]
    assert res["streaming"]["rollout_s"][1] <= res["barrier"]["rollout_s"][1]


def test_validation_error_is_the_worst_relative_error_at_two_samplers() -> None:
    pred = {m: {"step_s": [10.0, 99.0]} for m in ("barrier", "streaming")}
    cpu = {"barrier": {"step_s": 11.0}, "streaming": {"step_s": 8.0}}
    assert validation_error(pred, (2, 8), cpu) == pytest.approx(0.25)  # |10 - 8| / 8
    with pytest.raises(ValueError, match=r"cpu\.streaming\.step_s"):
        validation_error(pred, (2, 8), {"barrier": {"step_s": 11.0}})


def test_profiles_load_and_bad_ones_say_what_to_change() -> None:
    names = [load_profile(f).name for f in shipped_profiles()]
    assert any("qwen3-8b" in n for n in names) and "tiny-cpu" in names
    assert [load_profile(f).cpu_bench for f in shipped_profiles()].count(True) == 1
    with pytest.raises(ValueError, match="unknown key"):
        profile(decode_speed=1)
    with pytest.raises(ValueError, match="turns: give one of"):
        profile(turns={"const": 1, "pmf": {1: 1}})
    with pytest.raises(ValueError, match="batching must be one of"):
        profile(batching="static")
    with pytest.raises(ValueError, match="decode_step_s"):
        profile(decode_step_s={0: 0.1})
    assert Dist(pmf=((1, 1.0), (3, 3.0))).mean == pytest.approx(2.5)
    assert profile(decode_step_s={1: 0.1, 3: 0.3}).step_time(5) == pytest.approx(0.5)  # extrapolated


def test_cli_writes_the_sim_part_and_validates(tmp_path: Path) -> None:
    """``bench pipeline --sim``: the "sim" entries next to the CPU bench's part, validation on the cpu_bench
    profile only; bad input is exit 2."""
    small = tmp_path / "small.yaml"
    raw = yaml.safe_load(Path("conf/bench/pipeline_profiles/tiny_cpu.yaml").read_text())
    small.write_text(yaml.safe_dump({**raw, "replications": 1, "prompts_per_sampler": 1}))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**raw, "name": "other", "cpu_bench": False, "replications": 1}))
    out = tmp_path / "bench.json"
    cpu = {"barrier": {"step_s": 4.0}, "streaming": {"step_s": 3.0}, "same_allocation": True}
    out.write_text(json.dumps({"cpu": cpu}))
    argv = ["bench", "pipeline", "--sim", "--profile", str(small), "--profile", str(other)]
    assert main([*argv, "--samplers", "2,4", "--json", str(out), "--validate", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["cpu"] == cpu
    first, second = data["sim"]
    assert first["profile"] == "tiny-cpu" and second["profile"] == "other"
    assert first["samplers"] == [2, 4]
    for key in ("barrier_util", "streaming_util", "overlap_util", "barrier_step_s", "streaming_step_s"):
        assert len(first[key]) == 2 and all(isinstance(x, float) for x in first[key])
    pred = {
        "barrier": {"step_s": first["barrier_step_s"]},
        "streaming": {"step_s": first["streaming_step_s"]},
    }
    assert first["validation_error"] == pytest.approx(validation_error(pred, (2, 4), cpu))
    assert second["validation_error"] is None and "validation" not in second
    detail = first["validation"]
    assert set(detail) == {"barrier", "streaming"}  # the JSON has no overlap entry
    assert detail["barrier"]["measured_step_s"] == 4.0 and detail["barrier"]["measured_rollout_s"] is None
    assert detail["streaming"]["predicted_step_s"] == first["streaming_step_s"][0]
    assert first["validated_on"] == "frozen"  # no train runs in this JSON
    # with the bench's train runs (--train-steps) the model is validated on them: a profile models a training step
    train = {"barrier": {"step_s": 5.0}, "streaming": {"step_s": 4.5}, "overlap": {"step_s": 4.0}}
    out.write_text(json.dumps({"cpu": cpu, "train": train}))
    assert main([*argv, "--samplers", "2,4", "--json", str(out), "--validate", str(out)]) == 0
    first = json.loads(out.read_text())["sim"][0]
    assert first["validated_on"] == "train" and first["validation"]["overlap"]["measured_step_s"] == 4.0
    assert first["validation_error"] == pytest.approx(validation_error(pred, (2, 4), train))
    assert main([*argv, "--samplers", "0"]) == 2
    assert main([*argv, "--validate", str(tmp_path / "missing.json")]) == 2
    assert main(["bench", "pipeline", "--sim", "--profile", str(tmp_path / "nope.yaml")]) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a: [1,\n", "not valid YAML: this '[' is not closed"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"- 1\n", "is a YAML mapping"),
    ],
)
def test_a_bad_profile_file_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    assert main(["bench", "pipeline", "--sim", "--profile", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tracerl: {bad}") and message in err and "\n" not in err


def test_tree_shapes_for_the_profile(tmp_path: Path) -> None:
    """pipeline_measure reads turns of bare rollouts, tokens per turn and observation tokens from trees.jsonl."""
    from tracerl.workflows.experiments.pipeline_measure import summarize_trees

    def node(i: int, parent: int | None, depth: int, path: int, tokens: int, model: int) -> dict[str, object]:
        return {
            "id": i,
            "parent": parent,
            "depth": depth,
            "path": path,
            "tokens": tokens,
            "model_tokens": model,
        }

    tree = {
        "bare_rollouts": 2,
        "nodes": [
            node(0, None, 0, -1, 0, 0),
            node(1, 0, 1, 0, 30, 20),  # bare 0: a tool turn (10 observation tokens), then an answer
            node(2, 1, 2, 0, 18, 18),
            node(3, 0, 1, 1, 22, 22),  # bare 1: answers at once
            node(4, 1, 2, 2, 16, 16),  # a continuation from node 1
        ],
    }
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "trees.jsonl").write_text(json.dumps(tree) + "\n")
    out = summarize_trees(tmp_path)
    assert out["bare_turns"] == {1: 1, 2: 1}
    assert out["turn_tokens_mean"] == pytest.approx((20 + 18 + 22 + 16) / 4)
    assert out["obs_tokens_mean"] == 10 and out["bare_per_prompt"] == {2: 1}
    # a turn that ends in a tool call (node 1) against each path's last turn (the answers): a round lasts as long as
    # its longest row, so the profile keeps the two apart (final_turn_tokens)
    final = out["final_turn_tokens"]  # percentiles of 18, 22, 16
    assert set(out["tool_turn_tokens"]) == {20} and len(final) == 20 and (min(final), max(final)) == (16, 22)

    # the same step recorded for the profile's recorded_steps: both trees on one sampler, or one each on two
    from tracerl.workflows.experiments.pipeline_measure import record_steps

    one = record_steps(tmp_path, 1)
    assert one["samplers"] == 1 and len(one["steps"]) == 1
    assert one["steps"][0][0] == {"bare": [[0, 0, [20, 18]], [0, 0, [22]]], "cont": [[0, 30, [16]]]}
    tree2 = {**tree, "bare_rollouts": 1, "nodes": tree["nodes"][:3]}  # one bare rollout: the smaller shard
    (tmp_path / "step_1" / "trees.jsonl").write_text(json.dumps(tree) + "\n" + json.dumps(tree2) + "\n")
    two = record_steps(tmp_path, 2)
    assert [len(share["bare"]) for share in two["steps"][0]] == [2, 1]


def test_recorded_steps_are_the_work_the_samplers_run(tmp_path: Path) -> None:
    """With ``recorded_steps`` each simulated sampler runs one recorded share's episodes (tokens as recorded, a
    tool call after every turn but the last), the samplers of one recorded step together; without the file the
    profile says so when it loads."""
    from tracerl.workflows.experiments.pipeline_sim import workload

    rec = {
        "samplers": 2,
        "steps": [
            [{"bare": [[0, 0, [10, 4]]], "cont": [[0, 14, [3]]]}, {"bare": [[0, 0, [7]]], "cont": []}],
        ],
    }
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(rec))
    p = profile(recorded_steps=str(path), continuations_per_bare=2)
    bare, cont = workload(p, np.random.default_rng(0), first_prompt=5, share=(0, 0))
    assert [(x.prompt, x.bare, x.tokens, x.tools, x.prefill, x.ctx) for x in bare] == [
        (5, True, [10, 4], [1.0], 100, [0, 15])  # ctx: 10 tokens + 5 observation tokens
    ]
    assert [(x.bare, x.tokens, x.tools, x.prefill, x.ctx) for x in cont] == [(False, [3], [], 5, [14])]
    # one sampler: share 0 only; its rounds by hand: 0.1 s prefill + 1 s, tool 1 s, 0.005 + 0.4 s; then 0.005 + 0.3
    res = simulate(p, (1, 2))
    assert res["barrier"]["rollout_s"][0] == pytest.approx(0.1 + 1.0 + 1.0 + 0.005 + 0.4 + 0.005 + 0.3)
    assert res["barrier"]["rollout_s"][1] == res["barrier"]["rollout_s"][0]  # share 1 is shorter (0.8 s)
    with pytest.raises(ValueError, match="recorded_steps .*missing.json"):
        profile(recorded_steps=str(tmp_path / "missing.json"))
    path.write_text(json.dumps({**rec, "samplers": 3}))
    with pytest.raises(ValueError, match="one share per sampler"):
        profile(recorded_steps=str(path))


def test_final_turn_tokens_are_drawn_for_the_last_turn_only() -> None:
    from tracerl.workflows.experiments.pipeline_sim import workload

    p = profile(turns={"const": 3}, turn_tokens={"const": 30}, final_turn_tokens={"const": 5})
    bare, _ = workload(p, np.random.default_rng(0))
    assert bare[0].tokens == [30, 30, 5]
    assert workload(profile(turns={"const": 2}), np.random.default_rng(0))[0][0].tokens == [10, 10]


def test_pool_records_give_the_profile_s_overheads() -> None:
    """``summarize_pool``: an actor's time in a call outside generate and tool calls, per path-turn; a phase's
    driver time outside its slowest actor's call; a tool batch of n calls over 2 environment actors as
    ceil(n / 2) calls."""
    from tracerl.workflows.experiments.pipeline_pool import summarize_pool

    def call(seconds: float, gen: float, tools: float, turns: int) -> dict[str, object]:
        return {"what": "rollout", "seconds": seconds, "generate_s": gen, "tools_s": tools, "grade_s": 0.01,
                "path_turns": turns}  # fmt: skip

    # seconds = prefill tokens / 1000 + iterations x (0.01 + 0.001 rows)
    gens = [[1, 10, 100, 0.1 + 10 * 0.011], [4, 20, 400, 0.4 + 20 * 0.014], [2, 30, 100, 0.1 + 30 * 0.012]]
    workers = [
        {"generate": gens, "tools": [[3, 0.4]], "calls": [call(1.0, 0.6, 0.3, 10)]},
        {"generate": gens, "tools": [[1, 0.3]], "calls": [call(0.5, 0.3, 0.1, 5)]},
    ]
    run = {
        "seed": 1,
        "env_workers": 2,
        "steps": [{"rollout_s": 1.2}],
        "phases": [{"wall_s": 1.05, "workers": workers}],
    }
    out = summarize_pool([run])
    assert out["turn_overhead_s"] == pytest.approx((0.1 + 0.1) / 15)
    assert out["phase_overhead_s"]["mean"] == pytest.approx(0.05)
    assert out["tool_call_s"]["median"] == pytest.approx(0.25)  # 0.4 / 2 and 0.3 / 1
    fit = out["generate_fit"]
    assert fit["decode_s_fixed"] == pytest.approx(0.01) and fit["decode_s_per_row"] == pytest.approx(0.001)
    assert fit["prefill_tokens_per_s"] == pytest.approx(1000.0)
