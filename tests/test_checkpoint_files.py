"""Checkpoints written whole or not at all, checked before they are trusted, and a full disk in one line: the
manifest round trip, what each kind of damage is reported as, the fallback to the newest good checkpoint, a
checkpoint from before manifests, the classification of ENOSPC however it is wrapped, and (as root) a real full
tmpfs under a checkpoint write and under the MLflow store."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from tests.conftest import fill_disk, small_tmpfs
from tracerl.workflows.ops.disk import EXIT_CODE, DiskFull, no_space
from tracerl.workflows.tracking.checkpoint_files import STAGING, manifest_name, newest_good, problem, publish
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.runs import latest_checkpoint

WEIGHTS = "policy/model.safetensors"


def _files(d: Path, step: int, size: int = 64) -> None:
    """A checkpoint's files as the trainer writes them (small: a real safetensors policy, zip .pt files)."""
    import zipfile

    (d / "policy").mkdir(parents=True)
    save_file({"w": np.arange(size, dtype=np.float32)}, str(d / WEIGHTS))
    (d / "policy" / "config.json").write_text("{}")
    for name in ("predictor.pt", "trainer_rank0.pt"):
        with zipfile.ZipFile(d / name, "w") as z:
            z.writestr("data.pkl", b"x" * 100)
    CheckpointState(step, "run").write(d)


def _checkpoint(storage: Path, step: int, tmp: Path) -> Path:
    src = tmp / f"src{step}"
    _files(src, step)
    return publish(src, storage, f"checkpoint_{step:06d}", rank=0, world=1)


def _truncate(path: Path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_a_published_checkpoint_checks_out_and_leaves_no_staging(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "run", 2, tmp_path)
    assert ckpt == tmp_path / "run" / "checkpoint_000002"
    assert problem(ckpt) is None
    assert (ckpt / manifest_name(0)).is_file() and not (tmp_path / "run" / STAGING / ckpt.name).exists()


def test_truncated_newest_falls_back_to_the_older_naming_the_file(tmp_path: Path) -> None:
    storage = tmp_path / "run"
    _checkpoint(storage, 2, tmp_path)
    newest = _checkpoint(storage, 4, tmp_path)
    full = (newest / WEIGHTS).stat().st_size
    _truncate(newest / WEIGHTS, full - 10)
    said: list[str] = []
    assert latest_checkpoint(storage, said.append) == storage / "checkpoint_000002"
    assert said == [
        f"checkpoint {newest} is damaged, skipped: {WEIGHTS} is {full - 10} bytes, its manifest says {full}; "
        "falling back to checkpoint_000002 (step 2)"
    ]


def test_a_restart_restores_the_newest_good_checkpoint_saying_so_once(tmp_path: Path) -> None:
    """Ray's registered checkpoint (after a restart) is the damaged newest: rank 0 restores the one before it."""
    from tracerl.workflows.train.setup import restore_dir

    class FakeRayCheckpoint:  # the one field restore_dir reads from ray.train.Checkpoint on local storage
        def __init__(self, path: Path) -> None:
            self.path = str(path)

    storage = tmp_path / "run"
    _checkpoint(storage, 2, tmp_path)
    newest = _checkpoint(storage, 4, tmp_path)
    _truncate(newest / WEIGHTS, 30)
    said: list[str] = []
    assert restore_dir(FakeRayCheckpoint(newest), storage, said.append) == str(storage / "checkpoint_000002")
    assert len(said) == 1 and said[0].startswith(
        f"checkpoint {newest} is damaged, skipped: {WEIGHTS} is 30 bytes"
    )
    assert said[0].endswith("; restoring from checkpoint_000002 (step 2)")
    said.clear()  # the driver already said it (resume): not again
    assert restore_dir(FakeRayCheckpoint(newest), storage, said.append, ["checkpoint_000004"]) is not None
    assert said == []
    assert restore_dir(None, tmp_path / "empty", said.append) is None


def test_each_kind_of_damage_is_named(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "run", 1, tmp_path)
    data = bytearray((ckpt / "predictor.pt").read_bytes())
    data[-1] ^= 0xFF  # same size, one bit pattern changed
    (ckpt / "predictor.pt").write_bytes(bytes(data))
    assert "predictor.pt does not match its manifest (CRC-32" in str(problem(ckpt))
    (ckpt / "trainer_rank0.pt").unlink()
    assert problem(ckpt) == "trainer_rank0.pt is missing (listed in its manifest)"
    (ckpt / manifest_name(0)).write_text('{"world": 2, "files": {}}')
    assert (
        problem(ckpt)
        == "manifest_rank1.json is missing (rank 0's manifest says 2 ranks wrote this checkpoint)"
    )


def test_every_rank_writes_its_manifest(tmp_path: Path) -> None:
    """Two ranks (run one after the other here; a barrier orders them in a run): rank 1's files and manifest land in
    the same checkpoint, which rank 0 renames into place."""
    storage, name = tmp_path / "run", "checkpoint_000003"
    src0, src1 = tmp_path / "r0", tmp_path / "r1"
    _files(src0, 3)
    src1.mkdir()
    (src1 / "trainer_rank1.pt").write_bytes(b"rank one")
    from tracerl.workflows.tracking.checkpoint_files import stage_files

    (storage / STAGING / name).mkdir(parents=True)
    stage_files(src1, storage / STAGING / name, rank=1, world=2)
    os.replace(
        storage / STAGING / name, tmp_path / "held"
    )  # rank 0 clears staging first: keep rank 1's aside

    def rank1_staged() -> None:  # what the first barrier waits for: rank 1 has staged its files
        (storage / STAGING).mkdir(exist_ok=True)
        os.replace(tmp_path / "held", storage / STAGING / name)

    steps = iter([rank1_staged, lambda: None, lambda: None])
    ckpt = publish(src0, storage, name, rank=0, world=2, barrier=lambda: next(steps)())
    assert problem(ckpt) is None and (ckpt / "trainer_rank1.pt").read_bytes() == b"rank one"
    (ckpt / "trainer_rank1.pt").write_bytes(b"rank 1")
    assert problem(ckpt) == "trainer_rank1.pt is 6 bytes, its manifest says 8"


def test_a_write_cut_short_is_no_checkpoint(tmp_path: Path) -> None:
    """What a Ray Train restart after a failed write sees: the older checkpoint, nothing half written."""
    storage = tmp_path / "run"
    good = _checkpoint(storage, 2, tmp_path)
    src = tmp_path / "src4"
    _files(src, 4)
    (src / "zz_vanished.pt").symlink_to(tmp_path / "nowhere")  # copied last: the write fails after the others
    with pytest.raises(FileNotFoundError):
        publish(src, storage, "checkpoint_000004", 0, 1)
    assert (
        not (storage / "checkpoint_000004").exists()
        and not (storage / STAGING / "checkpoint_000004").exists()
    )
    assert newest_good(storage).path == good and newest_good(storage).skipped == ()


def test_a_checkpoint_from_before_manifests_is_checked_as_far_as_it_can_be(tmp_path: Path) -> None:
    old, older = tmp_path / "checkpoint_000004", tmp_path / "checkpoint_000002"
    _files(old, 4)
    _files(older, 2)
    assert problem(old) is None  # no manifest: trusted, its structure checked
    size = (old / WEIGHTS).stat().st_size
    _truncate(old / WEIGHTS, size - 4)
    assert problem(old) == (
        f"{WEIGHTS} is {size - 4} bytes, its safetensors header says {size} (and there is no manifest)"
    )
    _truncate(older / "trainer_rank0.pt", 50)
    assert str(problem(older)).startswith("trainer_rank0.pt cannot be read (BadZipFile")
    choice = newest_good(tmp_path)
    assert choice.path is None and [p.name for p, _ in choice.skipped] == [old.name, older.name]
    assert choice.notes()[0].endswith("; no complete checkpoint is left")


def test_a_republished_step_replaces_the_old_one(tmp_path: Path) -> None:
    storage = tmp_path / "run"
    first = _checkpoint(storage, 2, tmp_path)
    _truncate(first / WEIGHTS, 20)
    src = tmp_path / "again"
    _files(src, 2, size=8)
    assert publish(src, storage, first.name, 0, 1) == first and problem(first) is None
    assert not (storage / STAGING / f"{first.name}.replaced").exists()


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_damaged_model_path_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Before any model loads (train: before Ray starts or a run exists)."""
    from tests.conftest import ROOT
    from tracerl.workflows.cli.app import main

    model = tmp_path / "policy"
    model.mkdir()
    for f in (ROOT / "models" / "tiny-math").iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    size = (model / "model.safetensors").stat().st_size
    _truncate(model / "model.safetensors", size // 2)
    args = [f"model.path={model}", f"tracking.uri=sqlite:///{tmp_path}/mlruns.db", "env.math.eval_tasks=2"]
    if command == "train":
        args = ["--config", str(ROOT / "conf" / "train" / "smoke.yaml"), *args]
    rc = main([command, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tracerl:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(
        f"tracerl: checkpoint {model} is damaged: model.safetensors is {size // 2} bytes"
    )
    assert "point model.path at an intact checkpoint" in errors[0]


def test_a_torch_write_on_a_full_disk_is_no_space_there(tmp_path: Path) -> None:
    """torch's writer fails on a full disk with no errno (a RuntimeError): given the folder written to, whose
    filesystem is full, ``no_space`` names it; on a folder with room, or without a folder, it is no full disk."""
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        fill_disk(disk)
        with pytest.raises(RuntimeError) as err:
            torch.save({"w": torch.zeros(1 << 16)}, disk / "x.pt")
        assert no_space(err.value) is None
        assert no_space(err.value, disk) == str(disk)
        assert no_space(err.value, tmp_path) is None


def test_no_space_is_found_however_it_is_wrapped() -> None:
    plain = OSError(errno.ENOSPC, "No space left on device", "/data/runs/x.bin")
    assert no_space(plain) == "/data/runs/x.bin"
    assert no_space(OSError(errno.EDQUOT, "Disk quota exceeded")) == ""
    assert no_space(OSError(errno.EACCES, "Permission denied", "/x")) is None
    assert no_space(ValueError("bad value")) is None
    try:  # as MLflow's SQL store raises it: the DB-API error as the cause
        try:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full")
        except RuntimeError as inner:
            raise ValueError("SQLAlchemy database error") from inner
    except ValueError as outer:
        assert no_space(outer) == ""

    class FakeWorkerGroupError(RuntimeError):  # Ray Train's shape: per-rank errors in worker_failures
        def __init__(self) -> None:
            super().__init__("Training failed due to worker errors")
            self.worker_failures = {1: ConnectionError("peer gone"), 0: DiskFull("/data/runs")}

    assert no_space(FakeWorkerGroupError()) == "/data/runs"
    # pyarrow's text, no errno attribute to go by
    assert (
        no_space(
            OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
        )
        == ""
    )
    assert str(DiskFull("/data")) == (
        "no space left on device at /data: free space or point out_dir/tracking.uri elsewhere"
    )
    import pickle

    back = pickle.loads(pickle.dumps(DiskFull("/d")))  # it crosses Ray's process boundaries
    assert isinstance(back, DiskFull) and back.path == "/d" and back.errno == errno.ENOSPC == EXIT_CODE


def test_a_full_disk_is_not_retried_by_ray_train() -> None:
    """The controller callback: a polled worker error that is a full disk turns Ray Train's RETRY into an error
    (which the controller does not retry); other errors, and a RAISE, are left to the failure policy."""
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    from tracerl.workflows.ops.disk_callback import StopOnDiskFull

    class FakePollStatus:  # the one field the callback reads from Ray's WorkerGroupPollStatus
        def __init__(self, errors: dict[int, BaseException]) -> None:
            self.errors = errors

    cb = StopOnDiskFull()
    cb.after_worker_group_poll_status(FakePollStatus({0: ConnectionError("peer gone")}))
    cb.before_controller_execute_failure_decision(FailureDecision.RETRY)  # a fault a restart can get past
    cb.after_worker_group_poll_status(
        FakePollStatus({1: OSError(errno.ENOSPC, "No space left on device", "/d/f")})
    )
    cb.before_controller_execute_failure_decision(FailureDecision.RAISE)
    with pytest.raises(DiskFull, match="no space left on device at /d/f"):
        cb.before_controller_execute_failure_decision(FailureDecision.RETRY)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (needs root: mount)."""
    with small_tmpfs(tmp_path / "tiny", 2) as mnt:
        yield mnt


def test_a_full_disk_under_a_checkpoint_write_leaves_the_last_good_one(
    tiny_disk: Path, tmp_path: Path
) -> None:
    storage = tiny_disk / "run"
    good = _checkpoint(storage, 2, tmp_path)
    src = tmp_path / "big"
    _files(src, 4, size=1 << 20)  # 4 MiB of weights: more than the disk has
    with pytest.raises(OSError) as caught:
        publish(src, storage, "checkpoint_000004", 0, 1)
    assert str(no_space(caught.value)).startswith(
        f"{storage / STAGING}/checkpoint_000004/"
    )  # the file it met
    assert (
        not (storage / "checkpoint_000004").exists()
        and not (storage / STAGING / "checkpoint_000004").exists()
    )
    assert latest_checkpoint(storage) == good


def test_a_store_too_full_for_the_final_status_keeps_it_for_later(tiny_disk: Path) -> None:
    """The MLflow SQLite store on a disk that fills during the run: the status goes to the storage's marker (written
    at the start, overwritten in place), one line's worth of path comes back, and a later command sends it."""
    import mlflow

    from tracerl.workflows.tracking.runs import end_run
    from tracerl.workflows.tracking.spool import PendingStatus, replay_statuses

    uri = f"sqlite:///{tiny_disk}/mlruns.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(f"full-{uuid.uuid4().hex[:6]}", artifact_location=str(tiny_disk / "art"))
    run_id = client.create_run(exp).info.run_id
    storage = tiny_disk / "runs" / "r"
    storage.mkdir(parents=True)
    PendingStatus(storage).reserve()
    fill_disk(tiny_disk)
    said: list[str] = []
    where = end_run(client, run_id, storage, "FAILED", said.append, uri, failed_note=False)
    assert where == f"{tiny_disk}/mlruns.db" and said == []
    assert client.get_run(run_id).info.status == "RUNNING"  # the store could not take it ...
    assert PendingStatus(storage).pending() == ("FAILED", run_id)  # ... the marker did
    (tiny_disk / "filler").unlink()
    replay_statuses(client, tiny_disk / "runs", said.append)
    assert client.get_run(run_id).info.status == "FAILED" and PendingStatus(storage).pending() is None
    assert said == [
        f"MLflow run {run_id}: its final status, kept in {storage}/status.pending, is now recorded (its metrics "
        "before it)"
    ]
