"""`tracerl bootstrap`, `tracerl rollout` and `tracerl bench rollout` end to end on a briefly trained tiny policy."""

import json
from pathlib import Path

import pytest

from tracerl.workflows.bench.rollout import INT_KEYS
from tracerl.workflows.cli.app import main


def _small(tiny: Path) -> list[str]:
    """The tiny policy on 48 tasks of at most 3 turns of 40 tokens."""
    return [
        f"model.path={tiny}",
        "sampler.max_turns=3",
        "sampler.max_turn_tokens=40",
        "env.math.num_tasks=48",
    ]


@pytest.fixture(scope="module")
def tiny(tiny_policy: Path) -> Path:
    return tiny_policy


def test_bootstrap_writes_a_standard_checkpoint(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    assert model.config.model_type == "llama" and tok.padding_side == "left"
    assert json.loads((tiny / "bootstrap.json").read_text())["eval_tasks"] == 6
    assert main(["bootstrap", "--out", str(tiny)]) == 0  # already there: not rebuilt


def test_rollout_writes_trees_and_view(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "rollout",
        "--out",
        str(tmp_path),
        "--steps",
        "2",
        *_small(tiny),
    ]
    assert main(args) == 0
    lines = (tmp_path / "trees.jsonl").read_text().splitlines()
    trees = [json.loads(x) for x in lines]
    assert sum(len(t["rewards"]) for t in trees) == 48  # L leaves
    assert all(t["nodes"][0]["depth"] == 0 and t["answer"] for t in trees)
    assert any(n.get("continuations") for t in trees for n in t["nodes"])  # prefixes were expanded
    html = (tmp_path / "trees.html").read_text()
    assert "continuations K=" in html and "reward" in html
    assert "prefill re-used" in capsys.readouterr().out


def test_same_seed_same_trees(tiny: Path, tmp_path: Path) -> None:
    args = [
        "rollout",
        "--steps",
        "2",
        *_small(tiny),
        "seed=3",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "trees.jsonl").read_text() == (tmp_path / "b" / "trees.jsonl").read_text()


def test_rollout_reports_a_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--out", str(tmp_path), f"model.path={tmp_path}/none"]) == 2
    assert "tracerl bootstrap" in capsys.readouterr().err


def test_bench_rollout_json(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    args = [
        "bench",
        "rollout",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--json",
        str(out),
        *_small(tiny),
        "allocators=[grpo,trace]",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
        f"tracking.artifact_location={tmp_path}/a",
        "warmup_fraction=0",
    ]
    assert main(args) == 0
    s = json.loads(out.read_text())["allocators"]
    for name in ("grpo", "trace"):
        for key in (*INT_KEYS, "effective_ratio", "leaf_effective_ratio", "mixed_groups_per_step", "wall_s"):
            assert key in s[name], (name, key)
        assert s[name]["leaves"] == 48
    assert s["trace"]["prefill_tokens_reused"] > 0
    assert s["trace"]["continuation_prefill_fraction"] <= 0.10  # continuations re-use their prefix's cache
    assert s["trace"]["effective_ratio_ci95"] is None  # one seed: no interval
    # Started again with the same settings (an interrupted benchmark): every run is reused, the summary is the same.
    first = out.read_text()
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "grpo seed 0: reusing" in err and "trace seed 0: reusing" in err
    assert json.loads(out.read_text()) == json.loads(first)
    assert main([*args, "warmup_fraction=0.5"]) == 0  # the warm-up is a summary setting: still reused
    capsys.readouterr()
    assert main([*args, "budget.continuations=1", "allocators=[trace]"]) == 0
    err = capsys.readouterr().err
    assert "trace-seed0.json ran under other settings; running again" in err and "reusing" not in err


def test_habit_phase_traces_answer_without_the_tool_for_the_chosen_share() -> None:
    from tracerl.envs.math.tasks import generate
    from tracerl.workflows.bootstrap.policy import (
        DIRECT_THOUGHT,
        answers_directly,
        habit_segments,
        trace_segments,
    )

    tasks = generate(400, seed=0)
    share = sum(answers_directly(t, 0.5) for t in tasks) / len(tasks)
    assert 0.4 < share < 0.6 and [answers_directly(t, 0.5) for t in tasks] == [
        answers_directly(t, 0.5) for t in tasks
    ]
    t = tasks[0]
    assert habit_segments(t, 0.0) == trace_segments(t)
    direct = habit_segments(t, 1.0)
    assert len(direct) == 2 and not direct[0].trainable and direct[1].trainable
    assert (
        direct[1].text == f"Thought: {DIRECT_THOUGHT}\nFinal Answer: {t.answer}\n"
        and "Action:" not in direct[1].text
    )


def test_an_unknown_registered_model_names_what_the_registry_holds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.model_registry import resolve_model_path

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlruns.db", artifact_location=str(tmp_path / "art"))
    with pytest.raises(
        FileNotFoundError,
        match=r"models:/nope@champion is not in the registry .*registered models: "
        r"none \(`tracerl register",
    ):
        resolve_model_path("models:/nope@champion", tracking)
