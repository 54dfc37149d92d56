"""Every config error is one line naming the file, line and column where there is one, and what to change; exit 2,
before Ray or MLflow start. Real files with each fault, run through the CLI's ``main`` (and once as a real
``tracerl`` subprocess, to see that nothing was started or written)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_tracerl
from tracerl.workflows.cli.app import main

# (file text, expected line after "tracerl: config error: FILE:")
FAULTS = [
    (
        "steps: 3\nseed: 1\n\tout_dir: x\n",
        "3:1: not valid YAML: a tab character; YAML indents with spaces only: replace the tab with spaces",
    ),
    (
        "steps: 3\noptim:\n  betas: [0.9, 0.99\n  lr: 1.0\n",
        "3:10: not valid YAML: this '[' is not closed before line 4, column 5: add ']' (and a ',' between items)",
    ),
    (
        "steps: 3\nbudget: {num_leaves: 6\n",
        "2:9: not valid YAML: this '{' is not closed before line 3, column 1: add '}' (and a ',' between items)",
    ),
    ('run_name: "abc\n', "1:11: not valid YAML: this quote is never closed: add the closing quote"),
    (
        "steps: 3\n  seed: 2\n",
        "2:7: not valid YAML: a 'key: value' where none can start: indent the key like its siblings, or quote a "
        "value that holds ': '",
    ),
    (
        "optim:\n  lr: 0.1\n weight_decay: 0.0\n",
        "3:2: not valid YAML: this line's indentation matches no key above it: indent it exactly like its "
        "sibling keys",
    ),
    (
        "steps: 3\nsteps: 4\n",
        "2:1: key 'steps' is set twice in this mapping (first at line 1); keep one of them",
    ),
    (
        "steps: 3\noptim:\n  lrr: 0.1\n",
        "3:3: unknown config key 'optim.lrr'; allowed under 'optim': lr, weight_decay, betas, warmup_steps, "
        "schedule, min_lr_ratio, grad_clip (did you mean 'lr'?)",
    ),
    (
        "steps: 3\noptim:\n  lr: abc\n",
        "3:3: bad value for 'optim.lr': Value 'abc' of type 'str' could not be converted to Float: set it to a "
        "number",
    ),
    ("seed: 1\nsteps: -3\n", "2:1: steps must be >= 1 or null (got -3)"),
    ("pipeline:\n  mode: fast\n", "2:3: pipeline.mode must be one of 'barrier', 'streaming' (got 'fast')"),
    (
        "budget:\n  num_leaves: 100\n",
        "2:3: budget.num_leaves=100 must be a positive multiple of 1 + continuations = 3",
    ),
    (
        "defaults:\n  budget: huge\n",
        "2:3: no file conf/budget/huge.yaml for 'budget=huge'; available: default, lm_small, paper_1024x2, "
        "paper_512x2, paper_512x6. To set a field instead, use 'budget.<field>=<value>'",
    ),
]


@pytest.mark.parametrize(("text", "line"), FAULTS)
def test_a_config_file_fault_is_one_line_at_its_place_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: str
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("defaults: {budget: lm_small}\n" + text if text.startswith("budget:") else text)
    if text.startswith("budget:"):
        line = f"{int(line.split(':')[0]) + 1}:{line.split(':', 1)[1]}"  # the defaults line above it
    assert main(["train", "--config", str(path)]) == 2
    assert capsys.readouterr().err == f"tracerl: config error: {path}:{line}\n"


def test_an_override_wins_over_the_file_and_is_named_by_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("steps: 3\noptim:\n  lr: 0.1\n")
    assert main(["train", "--config", str(path), "optim.lr=abc"]) == 2
    assert capsys.readouterr().err == (
        "tracerl: config error: bad value for 'optim.lr': Value 'abc' of type 'str' could not be converted to "
        "Float: set it to a number\n"
    )


def test_a_key_from_a_group_file_is_reported_in_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "budget" / "odd.yaml").write_text("# an odd budget\nnum_roots: 8\ncontinuations: -1\n")
    monkeypatch.setenv("TRACERL_CONF_DIR", str(conf))
    assert main(["train", "budget=odd"]) == 2
    assert capsys.readouterr().err == (
        f"tracerl: config error: {conf / 'budget/odd.yaml'}:3:1: budget.continuations must be >= 0 (got -1)\n"
    )


def test_the_command_starts_nothing_on_a_bad_file(tmp_path: Path) -> None:
    """A real ``tracerl train`` process: one line on stderr, exit 2, and no store, run folder or Ray session
    written (it stopped before Ray and MLflow)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\n\tseed: 1\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'platform'}", "RAY_TMPDIR": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = run_tracerl("train", "--config", str(bad), cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"tracerl: config error: {bad}:2:1: not valid YAML: a tab character; YAML indents with spaces only: "
        "replace the tab with spaces\n"
    )
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
