"""Starting or joining Ray the way this platform needs it (docs/pitfalls.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tracerl.config import ClusterConfig
from tracerl.models.hf import SetupError


def init_ray(cfg: ClusterConfig) -> None:
    """Join ``cfg.address`` or start an embedded Ray; a no-op if Ray is already up.

    Raises:
        SetupError: ``cluster.address=inprocess``, ``tracerl train``'s mode without Ray, asked of a command that runs
            on Ray (a sweep, the benches that start actors; a study runs its cells in-process instead).
    """
    import ray  # slow to import: ray (the CLI imports this module at start-up, for exit_code)

    if cfg.in_process:
        raise SetupError(
            "cluster.address=inprocess runs `tracerl train` without Ray; this command runs on Ray: "
            "set cluster.address=local (or a cluster's address)"
        )
    if ray.is_initialized():
        return
    if cfg.address == "local":
        # address="local" never attaches to a stale /tmp/ray/ray_current_cluster of a killed head.
        with loopback_node():
            ray.init(
                address="local",
                num_cpus=cfg.num_cpus,
                include_dashboard=cfg.include_dashboard,
                dashboard_host=LOOPBACK,
                _node_ip_address=LOOPBACK,
                object_store_memory=cfg.object_store_memory_mb * 1024 * 1024,
                log_to_driver=True,
                configure_logging=False,
            )
    else:
        ray.init(address=cfg.address)
    end_on_signals()


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """Start the embedded Ray as a node whose address is 127.0.0.1, so that every one of its services listens on
    loopback only (docs/reliability.md, "What a cluster exposes").

    Ray 2.60 turns a node address of 127.0.0.1 into the machine's primary address unless it runs in its
    single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the macOS and Windows default, read once when
    Ray is imported): with that address the GCS, the raylet and the workers bound all interfaces and the metrics
    exporter answered anyone. In the single-machine mode the node's address is 127.0.0.1, and the GCS, raylet,
    workers, agents and metrics exporter all bind it. The switch is on only while ``ray.init`` starts the node
    (afterwards Ray asks the node for its address), so a later ``ray.init`` that joins a cluster in the same
    process is not affected. Token authentication is untouched: on unless ``RAY_AUTH_MODE`` says otherwise.
    """
    import ray._private.ray_constants as ray_constants  # slow to import: ray

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


EMBEDDED_TRAIN_ENV = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}
"""Ray Train helpers an embedded cluster has no use for: the preemption watcher (an actor process per run that polls
for draining nodes; the one node here ends with the driver) and the controller's and workers' Prometheus metrics
(nothing scrapes them without the dashboard). A value the caller set is kept."""


def torch_trainer(cluster: ClusterConfig) -> type:
    """Ray Train's ``TorchTrainer`` without the helpers a ``tracerl train`` run has no use for; on the embedded
    cluster also without the placement-group cleaner, the preemption watcher and Train's own metrics
    (``EMBEDDED_TRAIN_ENV``), so it needs no dashboard.

    Every run: no ``DatasetsCallback``. It starts a ``DatasetManager`` actor per worker group even when the trainer
    is given no Ray Datasets (ours never is: rank 0's samplers make the data), a process that imports Ray Data and
    holds its memory for the whole run, and the workers wait for it before their training function starts.

    The cleaner is a detached actor that removes a run's placement group once the Train controller dies. It asks
    the state API, which finds its cluster by scanning the machine: with a second Ray instance on the machine it
    printed "Found multiple active Ray instances" and a traceback every few seconds, and it could ask the other
    cluster, find no such controller and remove this run's placement group. The embedded cluster ends with the
    driver, placement groups included, so there it has nothing to do; a cluster joined by address keeps it.
    """
    # slow to import: ray.train (and torch)
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    local = cluster.address == "local"
    if local:  # read by the trainer here and by its controller (Train propagates them from this process)
        for k, v in EMBEDDED_TRAIN_ENV.items():
            os.environ.setdefault(k, v)
    unused = (DatasetsCallback, PlacementGroupCleanerCallback) if local else (DatasetsCallback,)

    class RunTorchTrainer(TorchTrainer):
        def _create_default_callbacks(self) -> list[Any]:  # Ray Train v2's; v1 stubs lack it
            parent: Any = super()
            return [c for c in parent._create_default_callbacks() if not isinstance(c, unused)]

    return RunTorchTrainer


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the driver: it unwinds like Ctrl-C (every ``finally`` runs, a run is marked
    KILLED) and the command exits ``128 + signum`` (143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def end_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``Terminated`` in the main thread, once (later ones are ignored while it unwinds).

    Called after ``ray.init``, which leaves the C++ failure-signal handler on SIGTERM: it printed a stack dump, and
    the driver then died of SIGABRT (exit 134) instead of unwinding. Python's own handler replaces it for these two
    signals only (a crash still gets Ray's dump). No-op outside the main thread (signals cannot be set there).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def exit_code(exc: KeyboardInterrupt) -> int:
    """What a shell reports for the signal: 128 + signum (130 for Ctrl-C)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def check_resources(
    demand: list[tuple[str, int, float, float]], cfg: ClusterConfig, knobs: str, warn: Callable[[str], None]
) -> None:
    """Fail fast when the actors a job asks for cannot all fit in the Ray cluster at once.

    ``demand`` rows are (what, how many, CPUs each, GPUs each). Ray would queue the actors that do not fit and wait
    for them for ever while the others hold their share (nothing errors, nothing moves), so on an embedded Ray,
    which cannot grow, this is a ``SetupError`` naming the shares and the ``knobs`` that set them; on a joined
    cluster it is a warning, since an autoscaler may still add nodes.
    """
    import ray  # slow to import: ray

    have = ray.cluster_resources()
    local = cfg.address == "local"
    for kind, rows in (
        ("CPU", [(w, n, c) for w, n, c, _ in demand]),
        ("GPU", [(w, n, g) for w, n, _, g in demand]),
    ):
        need = sum(n * each for _, n, each in rows)
        avail = float(have.get(kind, 0.0))
        if need <= avail + 1e-9:
            continue
        shares = ", ".join(f"{w} {n} x {each:g}" for w, n, each in rows if each)
        where = "the embedded Ray has" if local else f"the Ray cluster at {cfg.address} has"
        fix = (
            f"lower {knobs}"
            + (", or raise cluster.num_cpus" if kind == "CPU" and local else "")
            + ("" if local else ", or add nodes")
        )
        msg = (
            f"this job needs {need:g} {kind}s at once ({shares}) but {where} {avail:g}, and Ray would wait for "
            f"the rest for ever: {fix}"
        )
        if local:
            raise SetupError(msg)
        warn(msg + " (going ahead in case an autoscaler adds them)")
