"""Processes taking turns a step each (workflows/ops/turns.py) and ``tracerl bench peer --interleave step``'s use of
them: real child processes under a real ``Conductor``, their steps' wall-clock windows compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import cast

import pytest

from tests.conftest import ROOT
from tracerl.config_loader import ConfigError, compose
from tracerl.workflows.experiments.config import BenchPeerConfig
from tracerl.workflows.experiments.peer_report import ProcessRun, SideRun, StepRecord, side_stats
from tracerl.workflows.experiments.peer_sides import SideJob, run_in_turns
from tracerl.workflows.ops import turns
from tracerl.workflows.ops.turns import ENV, Conductor, paused_within, take_turn

PEER = ROOT / "conf/bench/peer.yaml"

# A child that runs `steps` steps of ~0.2 s busy work, taking its turn before each, and writes each step's
# [begin, end] to `out`; it exits with `fail_at`'s code 3 when it reaches that step.
CHILD = """
import json, os, sys, time
from tracerl.workflows.ops.turns import take_turn
out, steps, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for step in range(steps):
    take_turn(step)
    if step == fail_at:
        print("boom at", step, flush=True)
        sys.exit(3)
    t0 = time.time()
    while time.time() - t0 < 0.2:
        pass
    rows.append([t0, time.time()])
    with open(out, "w") as f:
        json.dump(rows, f)
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), os.environ.get("PYTHONPATH", "")]),
    }


def _launch(out: Path, steps: int, fail_at: int = -1) -> Callable[[dict[str, str], tuple[int, ...]], Popen]:
    def start(extra: dict[str, str], fds: tuple[int, ...]) -> Popen:
        cmd = [sys.executable, "-c", CHILD, str(out), str(steps), str(fail_at)]
        return subprocess.Popen(cmd, env={**_env(), **extra}, pass_fds=fds)

    return start


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    return sum(max(0.0, min(x1, y1) - max(x0, y0)) for x0, x1 in a for y0, y1 in b)


def test_conducted_processes_compute_one_at_a_time_and_their_pauses_are_recorded(tmp_path: Path) -> None:
    conductor = Conductor(poll_s=0.05)
    outs = {n: tmp_path / f"{n}.json" for n in ("a", "b")}
    for n in outs:
        conductor.start(n, _launch(outs[n], 3))
    assert [t.asked for t in conductor.procs.values()] == [[0], [0]]  # both wait at their first step
    rounds = 0
    while any(t.alive for t in conductor.procs.values()):
        for n in outs:
            conductor.turn(n)
        rounds += 1
    assert rounds == 3  # the third turn runs the last step and on to the end
    rows = {n: json.loads(p.read_text()) for n, p in outs.items()}
    assert [len(r) for r in rows.values()] == [3, 3]
    assert _overlap(rows["a"], rows["b"]) == 0.0  # never both computing
    # the steps alternate: a0 b0 a1 b1 a2 b2
    order = sorted((t0, n) for n, r in rows.items() for t0, _ in r)
    assert [n for _, n in order] == ["a", "b"] * 3
    for n, t in conductor.procs.items():
        assert t.asked == [0, 1, 2] and len(t.pauses) == 3 and t.proc.wait(timeout=30) == 0
        # every pause ends before the step it let run begins, and no step falls inside a pause
        for (_, p1), (b0, _) in zip(t.pauses, rows[n]):
            assert p1 <= b0
        assert sum(paused_within(t.pauses, b0, b1) for b0, b1 in rows[n]) == 0.0
    # b's first pause lasts at least a's first step (0.2 s of busy work)
    assert t.pauses[0][1] - t.pauses[0][0] >= 0.2


def test_without_a_conductor_a_child_runs_freely(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    take_turn(0)  # returns at once
    env = {k: v for k, v in _env().items() if k != ENV}
    subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "o.json"), "2", "-1"], env=env, check=True, timeout=60
    )
    assert len(json.loads((tmp_path / "o.json").read_text())) == 2


def test_only_the_conductors_own_child_takes_the_pipes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process further down that inherited the variable (a Ray worker, a subprocess) must not write its steps into
    whatever its own descriptors with those numbers are: it runs on, and the variable leaves its environment."""
    monkeypatch.setattr(turns, "_PIPES", [])
    with open(tmp_path / "f", "wb") as f:
        fd = f.fileno()
        monkeypatch.setenv(ENV, f"{os.getppid() + 1}:{fd},{fd}")  # another parent's
        take_turn(0)
        assert ENV not in os.environ
        monkeypatch.setenv(ENV, f"{os.getppid()}:{fd},{fd}")  # this parent's, but a file, not a pipe
        take_turn(1)
        assert ENV not in os.environ and turns._PIPES == []
    assert (tmp_path / "f").read_bytes() == b""


def test_a_child_runs_on_when_its_conductor_goes_away(tmp_path: Path) -> None:
    conductor = Conductor(poll_s=0.05)
    t = conductor.start("a", _launch(tmp_path / "a.json", 3))
    conductor.close()  # the pipes closed: take_turn reads end-of-file and the child runs its steps unconducted
    assert t.proc.wait(timeout=60) == 0
    assert len(json.loads((tmp_path / "a.json").read_text())) == 3


def _job(tmp_path: Path, name: str, steps: int, fail_at: int = -1) -> SideJob:
    out = tmp_path / f"{name}.json"

    def read(proc: ProcessRun) -> SideRun:
        rows = json.loads(out.read_text())
        recs = [
            StepRecord(
                step=k + 1, begin=b0, end=b1, eval_s=0.0, rollout_s=0.1, update_s=0.05, generated_tokens=10.0
            )
            for k, (b0, b1) in enumerate(rows)
        ]
        return SideRun(**proc, steps=recs, evals=[], threads={})

    cmd = [sys.executable, "-c", CHILD, str(out), str(steps), str(fail_at)]
    return SideJob(cmd, tmp_path / f"{name}.log", 1, read)


def test_bench_sides_in_turns_leave_their_waits_out_of_their_steps(tmp_path: Path) -> None:
    cfg = compose(
        BenchPeerConfig, PEER, [f"bench_out={tmp_path}", "interleave=step", "threads=1", "sample_s=0.05"]
    )
    runs = run_in_turns(cfg, {n: _job(tmp_path, n, 3) for n in ("x", "y", "z")})
    assert list(runs) == ["x", "y", "z"]
    for run in runs.values():
        assert run["rc"] == 0 and len(run["pauses"]) == 3
        st = side_stats(run, warmup=0)
        # each step is 0.2 s of busy work; waiting for two other sides' steps (>= 0.4 s) is not in it
        assert all(0.2 <= r["interval_s"] < 0.4 for r in st["per_step"])
        assert st["startup_s"] < st["per_step"][0]["begin"] - run["launch"]
    ends = sorted((r["end"], n) for n, run in runs.items() for r in run["steps"])
    assert [n for _, n in ends] == ["x", "y", "z"] * 3


def test_a_side_that_fails_in_turns_names_its_log_and_stops_the_others(tmp_path: Path) -> None:
    cfg = compose(
        BenchPeerConfig, PEER, [f"bench_out={tmp_path}", "interleave=step", "threads=1", "sample_s=0.05"]
    )
    t0 = time.time()
    with pytest.raises(RuntimeError, match=r"exited 3; see .*bad\.log: boom at 1"):
        run_in_turns(cfg, {"ok": _job(tmp_path, "ok", 50), "bad": _job(tmp_path, "bad", 3, fail_at=1)})
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert len(ok) < 50 and time.time() - t0 < 60  # stopped, not run to its end


def test_paused_within_counts_only_the_overlap() -> None:
    pauses = [[1.0, 2.0], [5.0, 7.0]]
    assert paused_within(pauses, 0.0, 10.0) == 3.0
    assert paused_within(pauses, 1.5, 6.0) == pytest.approx(1.5)
    assert paused_within(pauses, 2.0, 5.0) == 0.0


def test_side_stats_leave_pauses_out_of_steps_start_up_and_curve() -> None:
    steps = [
        {
            "step": 1,
            "begin": 15.0,
            "end": 17.0,
            "eval_s": 0.0,
            "rollout_s": 1.0,
            "update_s": 0.5,
            "generated_tokens": 10.0,
        },
        {
            "step": 2,
            "begin": 20.0,
            "end": 22.0,
            "eval_s": 0.0,
            "rollout_s": 1.0,
            "update_s": 0.5,
            "generated_tokens": 10.0,
        },
    ]
    # launched at 0, started up by 5, paused 5-15 (the others' start-ups and first steps) and 17-20
    run = {
        "launch": 0.0,
        "steps": steps,
        "evals": [{"step": 2, "accuracy": 0.5}],
        "peak_pss_mb": 1.0,
        "peak_processes": 1,
        "pauses": [[5.0, 15.0], [17.0, 20.0]],
    }
    st = side_stats(cast(SideRun, run), warmup=0, acc0=0.1)
    assert st["startup_s"] == pytest.approx(5.0)
    assert [r["interval_s"] for r in st["per_step"]] == pytest.approx([2.0, 2.0])
    assert st["curve"] == [[pytest.approx(5.0), 0.1], [pytest.approx(9.0), 0.5]]


def test_interleave_step_refuses_ray_sides() -> None:
    with pytest.raises(ConfigError, match="interleave=step runs in-process sides only; run grpo-ray with"):
        compose(BenchPeerConfig, PEER, ["interleave=step", "sides=[trl,grpo-ray]"])
    assert compose(BenchPeerConfig, PEER, ["interleave=step"]).interleave == "step"
