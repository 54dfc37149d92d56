"""Shared test helpers: small hand-built trees, the repository paths, and waits that do not depend on speed.

No test may depend on wall-clock speed (the suite runs beside other work on 2 cores): hypothesis runs without
deadlines or its too-slow health check, and waits poll for a condition with generous limits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# One OpenMP / BLAS thread (set before numpy and torch load, so the Ray workers and subprocesses the tests start
# inherit it): the tests' tensors are tiny, and on 2 cores shared with other work torch's intra-op threads spin
# against each other and against that work (test_learned_trace_beats_grpo_and_treepo_at_equal_budget: 302 s with
# 2 threads on 2 busy cores, 12 s with 1; 19.9 s -> 16.7 s on a near-idle machine).
# Sampler actors still set their own `torch.set_num_threads` from their spec, as in a real run; an OMP_NUM_THREADS
# set by the caller (`make test-vllm`, `make test-bfcl-slow`) is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tracerl.tree import RolloutTree  # noqa: E402
from tracerl.types import Prompt, Status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("tracerl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tracerl")

# Ray's own start-up limits, generous for the Rays the tests start (the workers inherit them): on a loaded machine a
# Train worker group (Train V2 default: 60 s) or a worker process registering with its raylet (Ray core default:
# 60 s) can take longer, and Train then fails or retries the start.
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
os.environ.setdefault("RAY_worker_register_timeout_seconds", "600")
# Ray Train's controller polls its workers every 2 s (Train V2's health-check interval) and only then sees a run's
# loop return or a rank die: up to 2 s idle at the end of each of the suite's ~15 Train attempts. A poll that does not
# answer in time is a missed check, retried, not a failure (a worker is declared dead after
# RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 600 s), so a shorter interval costs a few cheap calls, never a restart.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Ray starts its worker processes at nice 15 (its `worker_niceness`), below the pytest process that waits for them: on
# a machine with other CPU-bound work at nice 0 the workers got a few per cent of a core and a suite that takes
# ~20 min idle took hours. The suite's workers run at the priority of the suite (what Ray Jobs does for a job).
os.environ.setdefault("RAY_worker_niceness", "0")

FRESH_CLI = """
import json, sys
from tracerl.workflows.cli.app import main
rc = main(json.loads(sys.argv[1]))
print(json.dumps({"rc": rc, "ray": sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))}))
"""
"""``python -c FRESH_CLI '[args]'``: a ``tracerl`` command in a fresh interpreter; its last line holds the exit code and
every Ray module the command imported (an in-process run imports none)."""

WAIT_LIMIT_S = 300.0
"""How long a test waits for a condition (a server up, a process gone) before it fails: generous, since a loaded
machine is slow, and only reached when something is really wrong."""


TOOL_TIMEOUT_S = 120.0
"""Sandbox wall-clock limit for tests whose cells must finish (a default 5 s can run out on a busy machine)."""

UNHURRIED = [f"env.math.sandbox.timeout_s={TOOL_TIMEOUT_S:g}", f"env.reward_timeout_s={TOOL_TIMEOUT_S:g}"]
"""Overrides for runs whose trees a test relies on (a mixed group, a resumed run repeating the first): the tool's and
the grader's wall-clock limits are the only things a busy machine can change in a seeded tree. A loaded `make test`
(two busy loops beside it) had a 5 s sandbox call time out in the LoRA run's first step, and its updates then saw no
mixed group."""


def run_tracerl(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``tracerl ARGS`` in a fresh process (``python -m tracerl.workflows.cli``), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "tracerl.workflows.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(
    condition: Callable[[], bool], what: str, limit_s: float = WAIT_LIMIT_S, every_s: float = 0.5
) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``limit_s`` seconds."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s:g} s"
        time.sleep(every_s)


def stop_process(proc: subprocess.Popen[bytes], group: bool = False, limit_s: float = WAIT_LIMIT_S) -> None:
    """Stop a server a test started: SIGTERM (to its process group with ``group``), poll for its exit for up to
    ``limit_s`` seconds, then SIGKILL whatever is left. Never raises: a slow shutdown is not a test failure."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    send(signal.SIGKILL)  # the process if it is still up, and with ``group`` any child it left behind
    proc.wait()


def pytest_configure(config: pytest.Config) -> None:
    """torch in the pytest process on the same threads, even where a plugin imported it before this file."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


HEAVY_FIRST = (
    "test_chaos.py",
    "test_train.py",
    "test_sweep.py",
    "test_study.py",
    "test_submit.py",
    "test_overlap.py",
    "test_learner.py",
    "test_study_curves.py",
    "test_step_limit.py",
    "test_inprocess.py",
    "test_push_restarts.py",
)
"""Files with end-to-end runs (a Ray Train run, a sweep, a study, a cluster), longest first. ``make test`` runs the
suite in two lanes (pytest-xdist, whole files per lane): handed out first, they run beside each other and the many
short files fill the gaps, so neither lane is left with a long file at the end while the other idles."""


def heavy_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the ``HEAVY_FIRST`` files in that order, then the rest as collected."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: a file's own order is kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy files first (``heavy_first``); tests marked ``gpu`` skip cleanly on machines without CUDA."""
    import torch

    heavy_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def file_keeps_its_tracking_uri() -> Iterator[None]:
    """Each test file ends with the MLflow tracking URI it started with. ``mlflow.set_tracking_uri`` also sets
    ``$MLFLOW_TRACKING_URI`` (so that subprocesses inherit it): a file that points MLflow at its own server would
    otherwise send the next file of its lane, whose order differs from run to run, and the jobs that file starts,
    to a server that is gone."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(before)  # None unsets both the global and the variable
    elif before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def sqlite_client(tmp: Path) -> Any:
    """An MLflow client on the SQLite store ``<tmp>/mlruns.db`` that a test's runs wrote (MLflow pointed there too)."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlruns.db")
    return mlflow.MlflowClient()


def require_bfcl() -> None:
    """Skip the calling test when the ``bfcl-eval`` package is missing (``make install`` adds it)."""
    try:
        from tracerl.envs.bfcl.data import import_bfcl

        import_bfcl()
    except ImportError as exc:
        pytest.skip(f"bfcl-eval is not installed ({exc})")


def chain(
    tree: RolloutTree, parent: int, rewards_depths: Sequence[tuple[float, int]], bare: bool = True
) -> list[int]:
    """Add rollouts below ``parent``: each (reward, turns) adds a chain of that many turns; returns leaf ids."""
    leaves = []
    for reward, turns in rewards_depths:
        pid = tree.new_path(bare)
        cur = parent
        for t in range(turns):
            last = t == turns - 1
            node = tree.add_node(
                cur, pid, status=Status.ANSWERED if last else Status.TURN, reward=reward if last else None
            )
            cur = node.node_id
        leaves.append(cur)
    return leaves


def bootstrap_tiny(out_dir: Path, hidden_size: int, **fields: Any) -> dict[str, Any]:
    """``tracerl bootstrap`` of a tiny policy into ``out_dir`` (rebuilt if there), with no time budget: the steps
    are fixed, however busy the machine. 80 training tasks, 2 layers, an MLP twice ``hidden_size`` wide and
    batches of 8 unless ``fields`` (more of ``BootstrapConfig``'s) say otherwise; returns bootstrap's metrics."""
    from tracerl.workflows.bootstrap.config import BootstrapConfig
    from tracerl.workflows.bootstrap.policy import bootstrap

    sizes = {
        "train_tasks": 80,
        "num_layers": 2,
        "intermediate_size": 2 * hidden_size,
        "batch_size": 8,
        **fields,
    }
    return bootstrap(
        BootstrapConfig(
            out_dir=str(out_dir), hidden_size=hidden_size, time_budget_s=None, force=True, **sizes
        )
    )


def tiny_llama(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_positions: int,
    seed: int = 0,
    **extra: Any,
) -> Any:
    """A freshly initialised LlamaForCausalLM (torch seeded with ``seed`` first): an MLP twice ``hidden_size`` wide,
    as many key-value heads as heads, and ``extra`` (more ``LlamaConfig`` fields)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        **extra,
    )
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained tiny policy (real tokenizer, LlamaForCausalLM, SFT on rendered traces), built once."""
    out = tmp_path_factory.mktemp("tiny") / "policy"
    metrics = bootstrap_tiny(out, hidden_size=48, num_heads=4, eval_tasks=6, steps=40)
    assert (
        metrics["train_steps"] == 40 and metrics["final_loss"] < 4.5
    )  # it learned something (from ln(vocab) ~ 6)
    assert {"accuracy", "by_level", "well_formed_turns"} <= set(metrics["sampled"])
    return out


@pytest.fixture(scope="module")
def parts() -> tuple[Any, Any]:
    """An untrained 2-layer Llama and its tokenizer, fitted to rendered math traces (the hf sampler's tests)."""
    from tracerl.envs.math.tasks import generate as gen_tasks
    from tracerl.models.tiny import build_model, build_tokenizer
    from tracerl.workflows.bootstrap.config import BootstrapConfig
    from tracerl.workflows.bootstrap.policy import trace_segments

    texts = ["".join(s.text for s in trace_segments(t)) for t in gen_tasks(200, seed=4)]
    tok = build_tokenizer(texts, vocab_size=400)
    model = build_model(
        tok, BootstrapConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=1)
    )
    return tok, model


@pytest.fixture
def small_tree() -> RolloutTree:
    """Root with two bare rollouts (2 turns each) and two continuations from the first one's turn 1.

    0 (root)
    ├── 1 ── 2 (r=0)            bare path 0
    │   ├── 5 (r=1)             continuation path 2 from node 1
    │   └── 6 (r=1)             continuation path 3 from node 1
    └── 3 ── 4 (r=1)            bare path 1
    """
    tree = RolloutTree(Prompt("p0"))
    chain(tree, 0, [(0.0, 2), (1.0, 2)])
    chain(tree, 1, [(1.0, 1), (1.0, 1)], bare=False)
    return tree


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A ``size_mb`` MiB tmpfs mounted at ``where`` (created), unmounted at the end; the calling test is skipped
    where mounting needs a root or a capability it lacks."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    where.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True
    ).returncode:
        pytest.skip("mount -t tmpfs failed (no CAP_SYS_ADMIN in this container)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(disk: Path) -> None:
    """Write zeros to ``disk/filler`` until the file system is full (ENOSPC). Unbuffered: a buffered file would
    raise ENOSPC again when it flushes on close; a disk the run already filled is full as well."""
    try:
        with open(disk / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
