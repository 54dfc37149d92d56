"""SIGTERM and SIGHUP unwind the driver like Ctrl-C (``tracerl.workflows.ops.ray_utils.end_on_signals``): every ``finally``
runs once, a second signal does not interrupt the clean-up, and the CLI's exit code is 128 + signum."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import os, signal, sys
from tracerl.workflows.ops.ray_utils import Terminated, end_on_signals, exit_code
end_on_signals()
cleaned = []
try:
    try:
        os.kill(os.getpid(), signal.{sig})
        signal.pause()
    finally:
        os.kill(os.getpid(), signal.{sig})  # a second one while unwinding is ignored
        cleaned.append(1)
except Terminated as exc:
    print(exc, exc.signum, exit_code(exc), len(cleaned))
    sys.exit(exit_code(exc))
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_unwinds_once_and_exits_128_plus_signum(sig: str, code: int) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHILD.format(sig=sig)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == code, res.stderr
    assert res.stdout.split() == ["stopped", "by", sig, str(code - 128), str(code), "1"]


def test_ctrl_c_keeps_130() -> None:
    from tracerl.workflows.ops.ray_utils import exit_code

    assert exit_code(KeyboardInterrupt()) == 130


def test_the_embedded_cluster_trains_without_the_placement_group_cleaner() -> None:
    # The cleaner's state-API queries found a second Ray instance on the machine: "Found multiple active Ray
    # instances" and a traceback every few seconds, and it could remove this run's placement group. The embedded
    # cluster ends with the driver, so it has none; a joined cluster keeps Ray's default.
    from ray.train import ScalingConfig

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import torch_trainer

    def names(address: str) -> list[str]:
        trainer = torch_trainer(ClusterConfig(address=address))(lambda: None, scaling_config=ScalingConfig())
        return [type(c).__name__ for c in trainer._create_default_callbacks()]

    assert "PlacementGroupCleanerCallback" not in names("local")
    assert "BackendSetupCallback" in names("local")  # everything else kept
    assert "PlacementGroupCleanerCallback" in names("auto")
    # no run passes Ray Datasets: no DatasetManager actor (a process importing Ray Data) on any cluster
    assert "DatasetsCallback" not in names("local") + names("auto")
