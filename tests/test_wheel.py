"""The built wheel is the whole package: one top-level name, ``tracerl``, with the shipped configs and tiny
policies inside, so ``tracerl train`` on a shipped config runs from any directory of a fresh environment
(tests/wheel_venv.py builds both).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.conftest import sqlite_client
from tests.wheel_venv import build_wheel, run, wheel_venv

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)


def test_the_wheel_installs_one_package_that_trains_from_any_directory(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tracerl"}  # no envs/, predictors/, workflows/ or conf/ beside it in site-packages
    for inside in (
        "tracerl/workflows/cli/app.py",
        "tracerl/workflows/experiments/commands.py",
        "tracerl/envs/math/env.py",
        "tracerl/predictors/__init__.py",
        "tracerl/share/conf/train/smoke.yaml",
        "tracerl/share/models/tiny-math/config.json",
    ):
        assert inside in names, inside

    env = wheel_venv(wheel, tmp_path / "venv")
    python, site = env.python, env.site

    where = tmp_path / "elsewhere"
    where.mkdir()
    found = run([str(python), "-c", "import tracerl; print(tracerl.__file__)"], where)
    assert found.stdout.strip().startswith(str(site / "tracerl")), found.stdout + found.stderr
    # the experiments reach the installed CLI as a command family (no entry point needed) and find their profiles
    sim = run([str(env.bin / "tracerl"), "bench", "pipeline", "--sim", "--samplers", "2"], where)
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert [x for x in sim.stdout.split() if x.endswith(("-vllm", "-cpu"))] == [
        "qwen3-8b-h100-vllm",
        "tiny-cpu",
    ]
    smoke = site / "tracerl" / "share" / "conf" / "train" / "smoke.yaml"
    train = run(
        [
            str(env.bin / "tracerl"),  # the console script the wheel installed
            "train",
            "--config",
            str(smoke),
            "--steps",
            "1",
            "cluster=inprocess",
            "eval_at_start=false",
            "eval_at_end=false",
            f"tracking.uri=sqlite:///{where}/mlruns.db",
            f"tracking.artifact_location={where}/art",
            "--out",
            str(where / "runs"),
        ],
        where,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    client = sqlite_client(where)
    (done,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    assert done.info.status == "FINISHED"
    assert done.data.params["model.path"] == str(site / "tracerl" / "share" / "models" / "tiny-math")
    assert (
        len(client.get_metric_history(done.info.run_id, "key/effective_ratio")) == 1
    )  # one step, logged once
