"""What assumed one host (issue 43, item 3): the tracking server's URI from the environment, the start-up check that
every trainer rank sees one run storage, checkpoint files staged under the run's storage, ``map_location`` on every
restore, and the warning for a weight push larger than the object store."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, UNHURRIED
from tracerl.config import TrainConfig
from tracerl.config_loader import compose, conf_dir

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)


@pytest.mark.parametrize(
    ("env", "override", "uri"),
    [
        (None, None, "http://127.0.0.1:5000"),
        ("http://mlflow.tracerl.svc:5000", None, "http://mlflow.tracerl.svc:5000"),
        ("http://mlflow.tracerl.svc:5000", "http://127.0.0.1:5001", "http://127.0.0.1:5001"),
    ],
    ids=["default", "env-wins-over-the-config", "command-line-wins-over-env"],
)
def test_the_server_config_takes_its_uri_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: str | None, override: str | None, uri: str
) -> None:
    if env is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    overrides = ["tracking=server", *([f"tracking.uri={override}"] if override else [])]
    cfg = compose(TrainConfig, conf_dir() / "train/default.yaml", overrides)
    assert cfg.tracking.uri == uri


def _torch_loads(path: Path) -> list[tuple[int, set[str]]]:
    tree = ast.parse(path.read_text())
    return [
        (node.lineno, {k.arg for k in node.keywords if k.arg})
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "load"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
    ]


def test_every_restore_says_where_tensors_go() -> None:
    """A tensor saved on one GPU is restored where the restoring process puts it (without ``map_location`` torch
    puts it on the saver's device index, which another node may not have)."""
    calls = {
        f"{p.relative_to(ROOT)}:{line}": kw
        for top in ("platform", "workflows", "envs", "predictors")
        for p in (ROOT / top).rglob("*.py")
        for line, kw in _torch_loads(p)
    }
    assert len(calls) >= 3, calls  # the trainer ranks', the LoRA adapters', the predictor's and allocator's
    assert not [where for where, kw in calls.items() if "map_location" not in kw]


def test_a_weight_push_larger_than_the_object_store_is_warned_about() -> None:
    from tracerl.actors.pools import push_too_big, state_bytes

    state = {"w": torch.zeros(1024, 1024), "b": torch.zeros(1024, dtype=torch.bfloat16)}
    assert state_bytes(state) == 4 * 1024 * 1024 + 2 * 1024
    msg = push_too_big(600 * 2**20, 512 * 2**20)
    assert msg == (
        "a weight push to the samplers holds 600 MiB in the Ray object store at once but this node's store holds "
        "512 MiB: Ray spills "
        "every push to disk; raise cluster.object_store_memory_mb (the embedded Ray) or the nodes' "
        "--object-store-memory (a cluster)"
    )
    assert push_too_big(512 * 2**20, 512 * 2**20) is None and push_too_big(10, 0) is None


def _rank(rank: int, world: int, init: str, storages: list[str], out: str) -> None:
    """One trainer rank of the probe: a real gloo process group; its own view of the run storage."""
    import torch.distributed as dist

    from tracerl.workflows.train.setup import _all_gather
    from tracerl.workflows.train.shared_storage import check_shared

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        check_shared(Path(storages[rank]), rank, world, _all_gather, dist.barrier, node=f"node{rank + 1}")
        result = "ok"
    except Exception as e:  # what the rank raised, for the test to read
        result = f"{type(e).__name__}: {e}"
    Path(out, f"rank{rank}").write_text(result)
    dist.destroy_process_group()


@pytest.mark.parametrize("shared", [True, False], ids=["one-filesystem", "node-local-disks"])
def test_every_rank_must_see_the_run_storage(tmp_path: Path, shared: bool) -> None:
    """Two ranks in two processes (gloo over a file rendezvous). Node-local disks: rank 1's view of the storage path
    is another directory, as on a node whose out_dir is its own disk; both ranks then fail in one line naming the
    other's node."""
    import torch.multiprocessing as mp

    views = (
        [tmp_path / "shared" / "run"] * 2
        if shared
        else [tmp_path / "node1" / "run", tmp_path / "node2" / "run"]
    )
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(
        _rank,
        args=(2, init, [str(v) for v in views], str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    results = [(tmp_path / f"rank{r}").read_text() for r in range(2)]
    if shared:
        assert results == ["ok", "ok"]
        assert not (views[0] / ".probe").exists()  # cleaned up
        return
    assert results[0].startswith(
        f"SetupError: rank 1 on node node2 wrote {views[0] / '.probe' / 'rank1.json'}, and rank 0 on node node1 "
        "cannot see it: the run storage"
    ), results[0]
    assert "set out_dir= a path every node mounts" in results[0] and "\n" not in results[0]
    assert results[1].startswith("SetupError: rank 0 on node node1 wrote"), results[1]


def test_checkpoint_files_are_staged_under_the_run_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real (in-process) smoke run's checkpoint: its files were staged under the run's storage, not in /tmp."""
    import tracerl.workflows.tracking.checkpoint_files as cf
    from tracerl.workflows.cli.app import main

    staged: list[tuple[Path, Path]] = []
    real = cf.publish

    def spy(src: Path, storage: Path, *args: object, **kw: object) -> Path:
        staged.append((Path(src), Path(storage)))
        return real(src, storage, *args, **kw)  # type: ignore[arg-type]

    import tracerl.workflows.train.loop as loop

    monkeypatch.setattr(loop, "publish", spy)  # the name the loop's checkpoint step calls
    rc = main(
        [
            "train",
            "--config",
            str(ROOT / "conf" / "train" / "smoke.yaml"),
            "cluster=inprocess",
            "steps=1",
            "eval_at_start=false",
            "eval_at_end=false",
            "tracking=off",
            *UNHURRIED,
            "--out",
            str(tmp_path / "runs"),
        ]
    )
    assert rc == 0
    assert staged, "no checkpoint was published"
    for src, storage in staged:
        assert src.parent == storage / cf.SCRATCH, (src, storage)
        assert str(storage).startswith(str(tmp_path / "runs"))
    assert not list((staged[0][1] / cf.SCRATCH).iterdir())  # each staging folder removed once published
    assert json.loads((staged[0][1] / "checkpoint_000001" / "state.json").read_text())["step"] == 1
