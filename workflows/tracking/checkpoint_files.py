"""Training checkpoints on disk: written whole or not at all, and checked before they are trusted.

Writing (``publish``, Ray Train's ``checkpoint_upload_fn``): every rank copies its files into
``<storage>/.staging/<name>/``, computing each file's size and CRC-32 while it copies, fsyncs them, and writes its
manifest ``manifest_rank<R>.json`` last (file names, sizes, CRC-32s; rank 0's also the world size). After a barrier
rank 0 renames the staging directory into place as ``<storage>/<name>`` (a directory of that name left by an
earlier attempt is moved aside first). So a ``checkpoint_NNNNNN`` directory holds every rank's files and manifests
or does not exist; a write cut short (a crash, a full disk) leaves only a staging directory, which is not a
checkpoint and is removed by the next write.

Checking (``problem``): a checkpoint with manifests is complete when rank 0's manifest names the world size and
every rank's manifest lists files that exist with that size and CRC-32. CRC-32 (zlib), not sha256: it catches a
file cut short, overwritten or bit-flipped at a fraction of the cost, and a checkpoint is read whole anyway when it
is loaded; it is no defence against deliberate tampering. A checkpoint without manifests (written before they
existed) is trusted as far as it can be checked without loading it: the files a restore needs are there,
``state.json`` parses, each safetensors file is as long as its header says and each torch file's zip directory
reads (``tracerl.models.hf.weights_problem``).

Choosing (``newest_good``): the checkpoints under a run's storage, newest step first; the first that checks out,
with the reason each newer one was passed over (one line each, naming the file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.models.hf import weights_problem
from tracerl.workflows.tracking.checkpoint_state import STATE, CheckpointState

STAGING = ".staging"
SCRATCH = ".scratch"
"""Each rank's files of a checkpoint before they are published, under the run's storage (never the node's /tmp)."""
FORMAT = 1
NEEDED = ("policy/config.json", "predictor.pt", "trainer_rank0.pt", STATE)
"""Files a restore reads from every checkpoint (a LoRA run's adapters and trace_plus's allocator.pt besides)."""
_CHUNK = 1 << 20


def manifest_name(rank: int) -> str:
    return f"manifest_rank{rank}.json"


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: Path, dst: Path) -> tuple[int, int]:
    """Copy one file, fsynced; returns its (size, CRC-32)."""
    crc, size = 0, 0
    try:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    except OSError as exc:
        if (
            exc.filename is None
        ):  # a failed write names no file: say which one (a full disk's one line shows it)
            raise OSError(exc.errno, exc.strerror, str(dst)) from exc
        raise
    return size, crc


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def stage_files(src: Path, stage: Path, rank: int, world: int) -> dict[str, dict[str, int]]:
    """Copy the tree ``src`` into ``stage`` and write this rank's manifest there last; returns its file entries."""
    files: dict[str, dict[str, int]] = {}
    for p in sorted(src.rglob("*")):
        if p.is_dir() or p.name == manifest_name(rank):
            continue
        rel = p.relative_to(src).as_posix()
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        size, crc = _copy(p, stage / rel)
        files[rel] = {"size": size, "crc32": crc}
    for d in {(stage / rel).parent for rel in files}:
        _fsync_dir(d)
    body = {"format": FORMAT, "rank": rank, "world": world, "checksum": "crc32", "files": files}
    tmp = stage / f".{manifest_name(rank)}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, stage / manifest_name(rank))
    _fsync_dir(stage)
    return files


def scratch(storage: Path) -> Path:
    """The run's scratch folder for checkpoint files being written (created if missing)."""
    path = storage / SCRATCH
    path.mkdir(parents=True, exist_ok=True)
    return path


def publish(
    src: Path, storage: Path, name: str, rank: int, world: int, barrier: Callable[[], None] = lambda: None
) -> Path:
    """Write this rank's checkpoint files ``src`` as ``<storage>/<name>`` (see the module docstring); every rank
    calls it, ``barrier`` synchronises them (a no-op for one worker). Returns the checkpoint directory.

    Raises:
        OSError: a write failed (a full disk: ENOSPC); this rank's staged files are removed to give the space back.
    """
    stage, final = storage / STAGING / name, storage / name
    if rank == 0:  # what an attempt that died mid-write left
        shutil.rmtree(storage / STAGING, ignore_errors=True)
    barrier()
    try:
        stage.mkdir(parents=True, exist_ok=True)
        stage_files(src, stage, rank, world)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    barrier()
    if rank == 0:
        aside = storage / STAGING / f"{name}.replaced"
        if final.exists():  # an earlier attempt's checkpoint of the same step (it re-ran the step)
            os.replace(final, aside)
        os.replace(stage, final)
        _fsync_dir(storage)
        shutil.rmtree(aside, ignore_errors=True)
    barrier()
    return final


def _read_manifest(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
        raise ValueError("no file list")
    return raw


def problem(ckpt: Path) -> str | None:
    """Why the checkpoint directory ``ckpt`` cannot be trusted (one clause naming the file), or None when it checks
    out; see the module docstring for what is checked with and without manifests."""
    if not (ckpt / manifest_name(0)).is_file():
        return legacy_problem(ckpt)
    manifests: list[dict[str, Any]] = []
    world = 1
    r = 0
    while r < world:
        path = ckpt / manifest_name(r)
        if not path.is_file():
            return f"{path.name} is missing (rank 0's manifest says {world} ranks wrote this checkpoint)"
        try:
            m = _read_manifest(path)
            if r == 0:
                world = int(m["world"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{path.name} is not a manifest ({type(exc).__name__}: {exc})"
        manifests.append(m)
        r += 1
    entries = [(rel, info) for m in manifests for rel, info in m["files"].items()]
    for rel, info in entries:  # sizes first: cheap, and what a copy cut short gets wrong
        p = ckpt / rel
        if not p.is_file():
            return f"{rel} is missing (listed in its manifest)"
        size = p.stat().st_size
        if size != int(info["size"]):
            return f"{rel} is {size} bytes, its manifest says {int(info['size'])}"
    for rel, info in entries:
        crc = file_crc(ckpt / rel)
        if crc != int(info["crc32"]):
            return f"{rel} does not match its manifest (CRC-32 {crc:08x}, expected {int(info['crc32']):08x})"
    return _state_problem(ckpt)


def _state_problem(ckpt: Path) -> str | None:
    try:
        CheckpointState.read(ckpt)
    except ValueError as exc:
        return str(exc).replace(str(ckpt / STATE), STATE)
    return None


def legacy_problem(ckpt: Path) -> str | None:
    """A checkpoint written before manifests: what can be checked without loading it."""
    for rel in NEEDED:
        if not (ckpt / rel).is_file():
            return f"{rel} is missing (and there is no manifest)"
    why = _state_problem(ckpt)
    if why is not None:
        return why
    for p in sorted(
        [*ckpt.glob("*.pt"), *(ckpt / "policy").glob("*.safetensors"), *(ckpt / "policy").glob("*.bin")]
    ):
        why = weights_problem(p)
        if why is not None:
            return why.replace(p.name, p.relative_to(ckpt).as_posix(), 1) + " (and there is no manifest)"
    return None


@dataclass(frozen=True)
class Choice:
    """The newest complete checkpoint of a run (None: there is none) and the newer ones passed over."""

    path: Path | None
    step: int
    skipped: tuple[tuple[Path, str], ...] = ()

    def notes(self, skip: Iterable[str] = ()) -> list[str]:
        """One line per checkpoint passed over (leaving out those named in ``skip``, already reported)."""
        then = (
            f"falling back to {self.path.name} (step {self.step})"
            if self.path is not None
            else "no complete checkpoint is left"
        )
        done = set(skip)
        return [damaged(p, why, then) for p, why in self.skipped if p.name not in done]


def damaged(path: Path, why: str, then: str) -> str:
    """The line that reports a checkpoint passed over: which, why (the file), and what is done instead."""
    return f"checkpoint {path} is damaged, skipped: {why}; {then}"


def _step_key(d: Path) -> int:
    try:
        return CheckpointState.read(d).step
    except ValueError:
        digits = re.findall(r"\d+", d.name)
        return int(digits[-1]) if digits else -1


def newest_good(storage: Path) -> Choice:
    """The newest checkpoint under ``storage`` that checks out (``problem``), and why newer ones did not."""
    found = sorted(
        (d for d in storage.glob("checkpoint_*") if d.is_dir()),
        key=lambda d: (_step_key(d), d.name),
        reverse=True,
    )
    skipped: list[tuple[Path, str]] = []
    for d in found:
        why = problem(d)
        if why is None:
            return Choice(d, CheckpointState.read(d).step, tuple(skipped))
        skipped.append((d, why))
    return Choice(None, 0, tuple(skipped))


def prune(storage: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` checkpoints under ``storage`` (by step, as ``newest_good`` orders them),
    as Ray Train's ``CheckpointConfig(num_to_keep)`` does for a run it drives (the in-process mode has no Ray);
    returns those removed. A checkpoint is renamed aside before it is deleted, so a crash mid-delete leaves no
    half-deleted ``checkpoint_*`` directory that looks like one."""
    found = sorted(
        (d for d in storage.glob("checkpoint_*") if d.is_dir()),
        key=lambda d: (_step_key(d), d.name),
        reverse=True,
    )
    gone = found[keep:]
    for d in gone:
        aside = storage / STAGING / f"{d.name}.pruned"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(d, aside)
        shutil.rmtree(aside, ignore_errors=True)
    return gone
