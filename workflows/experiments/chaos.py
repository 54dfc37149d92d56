"""The chaos drill: ``tracerl train --config conf/train/chaos.yaml`` (``chaos.enabled: true``).

The command starts an MLflow tracking server on loopback (SQLite backend and artifacts under
``<out_dir>/<run name>.mlflow``), points the run at it, and runs a controller thread beside the training run. The
controller SIGKILLs real processes at seeded random times: sampler and environment actors (``chaos.actor_kills``,
each aimed at a seeded phase of the step: rollout, weight sync, evaluation or checkpoint save, read from the phase
the run's rank 0 marks in ``<storage>/.phase``), a Ray Train worker (``chaos.trainer_kills``), and the tracking
server (``chaos.server_restarts``: killed, left down ``server_down_s``, started again on the same port; the run
spools its metrics meanwhile). Processes are found through Ray's State API (their pids), so the drill runs on the
machine that holds them. After the run the drill resumes its final checkpoint for ``chaos.resume_steps`` more
steps, checks that every per-step metric has exactly one value per step in every report reader, writes
``<storage>/chaos.json`` and stops the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.config import ChaosConfig, TrainConfig
from tracerl.workflows.tracking.runs import (
    HOLD,
    PENDING,
    PHASE,
    RunSummary,
    metric_series,
    read_phase,
    run_summary,
)
from tracerl.workflows.tracking.spool import SPOOL, MetricLog, spooled_records
from tracerl.workflows.tracking.ui import server_env
from tracerl.workflows.train.run import train

PHASES = ("rollout", "sync_weights", "eval", "save")  # what a kill can be aimed at
# Per-step metrics defined only at steps where their condition holds (docs/metrics.md): the prefix-group effective
# ratio needs expanded prefixes (at that depth), the KV hit rate continuations (at that depth), so such a key may skip
# steps; where it is logged it is read once. The compute stop's overshoot is logged at the last step only.
CONDITIONAL = (M.PREFIX_GROUP_ER, M.KV_HIT_RATE, M.OVERSHOOT_TOKENS, M.OVERSHOOT_CPU_S)
ONCE = (M.TIME_STARTUP, *(M.startup_phase(p) for p in M.STARTUP_PHASES))
"""Logged once per launch, with its first step (not per step, and not again by a restarted attempt): not checked."""
ACTORS = {"sampler": "RolloutWorker", "env": "EnvWorker", "trainer": "RayTrainWorker"}


def attempts(storage: Path) -> int:
    d = storage / ".attempts"
    return len(list(d.iterdir())) if d.is_dir() else 0


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite backend and proxied artifacts under ``root``."""

    def __init__(self, root: Path, start_timeout_s: float = 300.0) -> None:
        self.root, self.timeout = root, start_timeout_s
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--backend-store-uri",
                    f"sqlite:///{self.root / 'mlflow.db'}",
                    "--artifacts-destination",
                    str(self.root / "artifacts"),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=server_env(),
            )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.proc.returncode}; see {self.root / 'server.log'}"
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"mlflow server on {self.uri} not healthy after {self.timeout:.0f} s")

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None


def _alive(cls: str) -> list[Any]:
    # slow to import: ray
    import ray
    from ray.util.state import list_actors

    # This run's cluster by its GCS address (other Ray instances on the machine make "auto" ambiguous).
    return list(
        list_actors(
            address=ray.get_runtime_context().gcs_address,
            filters=[("class_name", "=", cls), ("state", "=", "ALIVE")],
            limit=1000,
            raise_on_missing_output=False,
        )
    )


class Controller(threading.Thread):
    """Kills processes of the run under ``out_dir/<name>-*`` on a seeded schedule; ``events`` records each kill."""

    def __init__(
        self,
        chaos: ChaosConfig,
        seed: int,
        out_dir: Path,
        name: str,
        server: MlflowServer,
        say: Callable[[str], None],
        steps: int,
    ) -> None:
        super().__init__(name="chaos", daemon=True)
        self.chaos, self.out_dir, self.name, self.server, self.say = chaos, out_dir, name, server, say
        self.steps = steps
        self.rng = np.random.default_rng([seed, 0xC4A05])
        kinds = ["sampler" if i % 2 == 0 else "env" for i in range(chaos.actor_kills)]
        plan = [(k, PHASES[i % len(PHASES)]) for i, k in enumerate(kinds)]
        plan += [("trainer", str(self.rng.choice(PHASES))) for _ in range(chaos.trainer_kills)]
        # The server restarts come first (in an early rollout), so the run still has steps to spool and send.
        self.plan = [("server", "") for _ in range(chaos.server_restarts)] + [
            plan[i] for i in self.rng.permutation(len(plan))
        ]
        self.events: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.storage: Path | None = None
        self.server_thread: threading.Thread | None = None

    def _wait(self, cond: Callable[[], Any], limit_s: float) -> Any:
        deadline = time.monotonic() + limit_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.01)
        return None

    def run(self) -> None:
        found = self._wait(
            lambda: next(iter(sorted(self.out_dir.glob(f"{self.name}-*/config.yaml"))), None), 1e9
        )
        if found is None:
            return
        self.storage = storage = found.parent
        pending = storage / PENDING  # the run's last step waits for the plan (tracking.runs.phase_marker)
        pending.touch()
        try:
            self._wait(lambda: read_phase(storage)[0] in PHASES, 1e9)  # the first step is under way
            for kind, phase in self.plan:
                if self.stop.wait(float(self.rng.uniform(self.chaos.min_gap_s, self.chaos.max_gap_s))):
                    return
                try:
                    self._do(kind, phase, storage)
                except Exception as e:  # noqa: BLE001 - a drill step that could not be done is recorded, not fatal
                    self.events.append(
                        {"kind": kind, "aimed_at": phase, "error": f"{e.__class__.__name__}: {e}"}
                    )
        finally:
            pending.unlink(missing_ok=True)

    def _restart_server(self, storage: Path) -> None:
        t0 = time.monotonic()
        spool = storage / SPOOL
        before = spool.stat().st_size if spool.is_file() else 0
        at = read_phase(storage)
        self.server.kill()
        self.say(
            f"chaos: tracking server killed during {at[0]} of step {at[1]}; down for "
            f"{self.chaos.server_down_s:.0f} s and until the run has spooled metrics"
        )
        self.stop.wait(self.chaos.server_down_s)
        self._wait(
            lambda: (spool.is_file() and spool.stat().st_size > before) or read_phase(storage)[0] == "done",
            self.chaos.phase_wait_s,
        )
        try:
            self.server.start()
        except (RuntimeError, TimeoutError) as e:
            self.events.append({"kind": "server", "error": str(e)})
            return
        self.events.append(
            {"kind": "server", "phase": at[0], "step": at[1], "down_s": round(time.monotonic() - t0, 1)}
        )
        self.say("chaos: tracking server up again")

    def join_all(self) -> None:
        self.join()
        if self.server_thread is not None:
            self.server_thread.join()

    def _do(self, kind: str, phase: str, storage: Path) -> None:
        if (
            kind == "server"
        ):  # down and up again beside the other kills (a start takes a while on a busy machine)
            # aimed at a rollout before the last step, so the run spools metrics and still needs the server after
            self._wait(
                lambda: (
                    read_phase(storage)[0] == HOLD
                    or (read_phase(storage)[0] == "rollout" and 0 < read_phase(storage)[1] < self.steps)
                ),
                self.chaos.phase_wait_s,
            )
            self.server_thread = threading.Thread(target=self._restart_server, args=(storage,), daemon=True)
            self.server_thread.start()
            return
        # the aimed-at phase, or the last step's hold (the run waits there for what is left of the plan)
        self._wait(lambda: read_phase(storage)[0] in (phase, HOLD), self.chaos.phase_wait_s)
        actors = self._wait(lambda: _alive(ACTORS[kind]), 600.0)
        if not actors:
            return
        victim = actors[int(self.rng.integers(len(actors)))]
        at, step = read_phase(storage)
        attempt = attempts(storage)
        try:
            os.kill(int(victim.pid), signal.SIGKILL)
        except ProcessLookupError:
            return
        self.events.append(
            {
                "kind": kind,
                "aimed_at": phase,
                "phase": at,
                "step": step,
                "attempt": attempt,
                "pid": int(victim.pid),
            }
        )
        self.say(f"chaos: killed {kind} pid {victim.pid} during {at} of step {step}")
        if kind == "trainer":  # the restarted run marks its own phases; no kill aims at the dead one's
            (storage / PHASE).write_text("restart -1")


def check_steps(client: Any, run_id: str, steps: int) -> list[str]:
    """Problems with the exactly-once rule for steps 1..``steps``; empty when every per-step metric has one value
    per step, from the log call of the attempt that completed the step (the last attempt to log it)."""
    from tracerl.workflows.tracking.compare import collect  # slow to import: pandas (tracking.compare)

    problems: list[str] = []
    att_hist = client.get_metric_history(run_id, M.ATTEMPT)
    completing: dict[int, Any] = {}
    for m in att_hist:
        if m.step not in completing or (m.value, m.timestamp) > (
            completing[m.step].value,
            completing[m.step].timestamp,
        ):
            completing[m.step] = m
    if sorted(completing) != list(range(1, steps + 1)):
        return [f"{M.ATTEMPT} logged at steps {sorted(completing)}, not 1..{steps}"]
    run = client.get_run(run_id)
    first = {k for k in run.data.metrics if any(m.step == 1 for m in client.get_metric_history(run_id, k))}
    keys = sorted(k for k in first if not k.startswith(M.EVAL) and k not in ONCE)
    for key in keys:
        hist: dict[int, list[Any]] = {}
        for m in client.get_metric_history(run_id, key):
            hist.setdefault(m.step, []).append(m)
        series = {
            s: v for s, v in metric_series(client, run_id, key).items() if s >= 1
        }  # step 0: before training
        if not key.startswith(CONDITIONAL) and sorted(series) != list(range(1, steps + 1)):
            problems.append(f"{key}: values at steps {sorted(series)}, not 1..{steps}")
            continue
        for s in sorted(series):
            want = [m.value for m in hist[s] if m.timestamp == completing[s].timestamp]
            if want != [series[s]]:
                problems.append(f"{key} step {s}: read {series[s]}, the completing attempt logged {want}")
    er = metric_series(client, run_id, M.EFFECTIVE_RATIO)
    rows = collect(client, [run])
    if er and (rows[0]["steps"] != steps or rows[0]["series"]["effective_ratio"] != er):
        problems.append(f"compare reads {rows[0]['steps']} steps, not {steps}")
    return problems


def run_drill(cfg: TrainConfig, overrides: list[str], progress: Callable[[str], None]) -> RunSummary:
    """The drill around ``tracerl.workflows.train.run.train``; returns the run's summary with the drill's report under 'chaos'."""
    import mlflow  # slow to import: mlflow

    out = Path(cfg.out_dir).resolve()
    name = cfg.run_name or f"chaos-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    server = MlflowServer(out / f"{name}.mlflow")
    server.start()
    progress(f"chaos: MLflow server {server.uri} (store {server.root}); plan over seed {cfg.seed}")
    tracking = dataclasses.replace(cfg.tracking, uri=server.uri)
    cfg = dataclasses.replace(cfg, run_name=name, out_dir=str(out), tracking=tracking)
    ctl = Controller(cfg.chaos, cfg.seed, out, name, server, progress, cfg.num_steps)
    t0 = time.perf_counter()
    ctl.start()
    try:
        summary = train(cfg, overrides, progress=progress)
    finally:
        ctl.stop.set()
        ctl.join_all()
        if server.proc is None:  # stopped mid-restart: the summary and resume need it
            server.start()
    try:
        wall = time.perf_counter() - t0
        run_id, storage, steps = summary["run_id"], Path(summary["storage"]), cfg.num_steps
        mlflow.set_tracking_uri(server.uri)
        client = mlflow.MlflowClient()
        MetricLog(
            client, run_id, storage, 0, progress, fail_fast=False
        ).flush()  # what the run's end could not send
        if cfg.chaos.resume_steps:
            steps += cfg.chaos.resume_steps
            train(
                dataclasses.replace(cfg, resume=run_id),
                [f"steps={steps}", "chaos.enabled=false"],
                progress=progress,
            )
            summary.update(run_summary(run_id, tracking))
        spooled = spooled_records(storage)
        missing = [
            r
            for r in spooled
            if not any(
                m.timestamp == r["timestamp"] and m.value == r["value"]
                for m in client.get_metric_history(run_id, r["key"])
                if m.step == r["step"]
            )
        ]
        report = {
            "seed": cfg.seed,
            "status": client.get_run(run_id).info.status,
            "steps": steps,
            "wall_s": round(wall, 1),
            "kills": {
                k: sum(e["kind"] == k and "error" not in e for e in ctl.events) for k in (*ACTORS, "server")
            },
            "kills_by_phase": {p: sum(e.get("phase") == p for e in ctl.events) for p in PHASES},
            "planned": len(ctl.plan),
            "events": ctl.events,
            "attempts": attempts(storage),
            "retried": summary.get("retried", 0),
            "spooled": len(spooled),
            "spooled_missing": len(missing),
            "exactly_once_problems": check_steps(client, run_id, steps),
        }
        (storage / "chaos.json").write_text(json.dumps(report, indent=2))
        summary["chaos"] = report
        progress(f"chaos: {json.dumps({k: v for k, v in report.items() if k != 'events'})}")
        progress(
            f"chaos: the run's store is {server.root / 'mlflow.db'} (server stopped; "
            f"`mlflow server --backend-store-uri sqlite:///{server.root / 'mlflow.db'}` to browse)"
        )
        return summary
    finally:
        server.kill()


def drill_ok(report: dict[str, Any]) -> bool:
    """The drill's targets: the run finished, every planned kill was done, nothing spooled was lost, and every
    per-step metric reads exactly one value per step."""
    done = sum(report["kills"].values())
    return (
        report["status"] == "FINISHED"
        and done >= report["planned"]
        and report["spooled_missing"] == 0
        and not report["exactly_once_problems"]
    )
