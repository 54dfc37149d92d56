import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, TOOL_TIMEOUT_S
from tracerl.envs.math.datasets import load_math_file
from tracerl.envs.math.reward import extract_boxed, is_correct
from tracerl.envs.math.tasks import LEVELS, generate, is_held_out, make_task
from tracerl.envs.sandbox import Sandbox, SandboxConfig

DATA = ROOT.parent / "shared" / "data" / "math"


def test_reference_solutions_run_in_the_sandbox_and_reach_the_answer() -> None:
    sandbox = Sandbox(SandboxConfig(timeout_s=TOOL_TIMEOUT_S))
    for level in LEVELS:
        task = make_task(7, level, level)
        assert task.level == level and 1 <= len(task.steps) <= 3
        for step in task.steps:
            assert sandbox.run(step.code).observation() == step.output  # the trace tells the truth
        assert task.answer in task.final_thought and is_correct(task.answer, task.steps[-1].output)


def test_generation_is_deterministic_distinct_and_split() -> None:
    a, b = generate(300, seed=1), generate(300, seed=1)
    assert [t.question for t in a] == [t.question for t in b]
    assert len({t.question for t in a}) == 300
    assert {t.level for t in a} == set(LEVELS)
    train, held = generate(400, seed=2, held_out=False), generate(200, seed=2, held_out=True)
    assert not {t.question for t in train} & {t.question for t in held}
    assert all(is_held_out(t) for t in held) and not any(is_held_out(t) for t in train)


def test_harder_levels_need_more_tool_calls_and_bigger_numbers() -> None:
    tasks = generate(500, seed=3)
    calls = {
        lv: sum(len(t.steps) for t in tasks if t.level == lv) / sum(t.level == lv for t in tasks)
        for lv in LEVELS
    }
    assert calls[1] == calls[2] == 1 and calls[3] == 2 and calls[5] == 3


@pytest.mark.parametrize(
    ("gold", "pred", "ok"),
    [
        ("396", "396", True),
        ("396", "396.", True),
        ("1000", "1,000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("10", "11", False),
        ("10", "", False),
        ("10", None, False),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("x", "}{{bad", False),
    ],
)
def test_is_correct(gold: str, pred: str | None, ok: bool) -> None:
    assert is_correct(gold, pred) is ok


def test_extract_boxed() -> None:
    assert extract_boxed("so \\boxed{1} then \\boxed{\\frac{3}{4}}.") == "\\frac{3}{4}"
    assert extract_boxed("no box") is None


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")
def test_real_files_load_and_their_gold_answers_verify() -> None:
    counts = {}
    for name in ["test_aime", "test_amc", "test_math", "test_olympiad_bench"]:
        prompts = load_math_file(DATA / f"{name}.json")
        counts[name] = len(prompts)
        assert all(p.text and p.answer for p in prompts)
        assert all(is_correct(p.answer or "", p.answer) for p in prompts[:50])
    assert counts == {"test_aime": 30, "test_amc": 83, "test_math": 500, "test_olympiad_bench": 675}
    olymp = load_math_file(DATA / "test_olympiad_bench.json", limit=5)
    assert not any(p.answer and p.answer.startswith("[") for p in olymp)  # list-strings unwrapped


def test_jsonl_parquet_and_errors(tmp_path: Path) -> None:
    rows = [{"question": "1+1?", "answer": 2}, {"question": "Half?", "solution": "It is \\boxed{\\frac12}."}]
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows))
    got = load_math_file(jl)
    assert [(p.text, p.answer) for p in got] == [("1+1?", "2"), ("Half?", "\\frac12")]
    import datasets

    datasets.Dataset.from_list([{"problem": "3*3?", "answer": "9"}]).to_parquet(str(tmp_path / "t.parquet"))
    assert load_math_file(tmp_path / "t.parquet")[0].answer == "9"
    with pytest.raises(FileNotFoundError, match="math task file not found"):
        load_math_file(tmp_path / "missing.json")
    (tmp_path / "t.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported extension '.csv'"):
        load_math_file(tmp_path / "t.csv")
    (tmp_path / "noq.jsonl").write_text(json.dumps({"text": "x", "answer": "1"}))
    with pytest.raises(ValueError, match="no question field"):
        load_math_file(tmp_path / "noq.jsonl")
