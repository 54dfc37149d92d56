"""The actor pools on a real local Ray: sharding, retries after real actor deaths, determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracerl.actors.envpool import EnvPool
from tracerl.actors.faults import Faults
from tracerl.actors.pools import RolloutPool, balanced_shards
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import ToolEnv, ToolResult
from tracerl.engine.react import Action, ActionKind
from tracerl.types import Prompt


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


def _math_env():  # type: ignore[no-untyped-def]
    from tracerl.envs.math.env import MathEnv
    from tracerl.envs.sandbox import SandboxConfig

    return MathEnv(
        SandboxConfig(timeout_s=120.0)
    )  # conftest.TOOL_TIMEOUT_S (this runs in an actor, not pytest)


def test_balanced_shards_are_deterministic_and_even() -> None:
    shards = balanced_shards([4, 2, 2, 8, 1, 1], 2)
    assert shards == [[3, 4], [0, 1, 2, 5]]  # loads 8 + 1 and 4 + 2 + 2 + 1
    loads = [sum([4, 2, 2, 8, 1, 1][i] for i in s) for s in shards]
    assert abs(loads[0] - loads[1]) <= 2 and sorted(i for s in shards for i in s) == list(range(6))
    assert balanced_shards([4, 2, 2, 8, 1, 1], 2) == shards


def test_a_pools_phase_times_add_the_slowest_worker_of_each_phase() -> None:
    """Workers of one phase run in parallel (the slowest one's time), phases one after the other (their sum): a
    barrier step's generate time is its bare phase's plus its expansion's, not the larger of the two."""
    pool = RolloutPool.__new__(RolloutPool)  # only the ledger: no actors
    pool.ledger = BudgetLedger()

    def led(generate: float, tools: float) -> BudgetLedger:
        out = BudgetLedger(generated_tokens=10)
        out.phase_s.update(generate=generate, tools=tools)
        return out

    pool._merge([led(1.0, 0.2), led(2.0, 0.1)])  # the bare rollouts on two workers
    pool._merge([led(0.5, 0.4), led(0.3, 0.0)])  # the expansion
    assert pool.ledger.phase_s == pytest.approx({"generate": 2.5, "tools": 0.6})
    assert pool.ledger.generated_tokens == 40


def test_env_pool_retries_a_call_whose_actor_died(ray_local: Any, tmp_path: Path) -> None:
    pool = EnvPool(_math_env, size=2, cpus=0.05, max_retries=2, faults=Faults(str(tmp_path), env_step=3))
    pool.step = 3
    calls = [
        (
            Prompt(f"p{i}"),
            (),
            Action(ActionKind.TOOL, "", tool="python", arguments={"code": f"print({i} * 7)"}),
        )
        for i in range(4)
    ]
    results = pool.execute_batch(calls)
    assert [r.observation.strip() for r in results] == ["0", "7", "14", "21"]
    assert sum(r.retried for r in results) >= 1  # the actor exited for real on its first call of step 3
    assert (tmp_path / "env-step3").exists()
    assert [r.retried for r in pool.execute_batch(calls)] == [0, 0, 0, 0]  # the fault fires once per run


def test_env_pool_without_faults_never_exits(ray_local: Any, tmp_path: Path) -> None:
    pool = EnvPool(
        _math_env, size=1, cpus=0.05, max_retries=0, faults=Faults(str(tmp_path))
    )  # env_step=-1: never
    assert pool.step == -1  # before the first step (held-out evaluation runs here)
    call = (Prompt("p"), (), Action(ActionKind.TOOL, "", tool="python", arguments={"code": "print(6 * 7)"}))
    assert pool.execute_batch([call])[0].observation.strip() == "42"
    assert not list(tmp_path.iterdir())
    assert pool.cpu_s() > 0  # the actor's CPU seconds since it started (its tool-call processes' included)


def test_a_fault_exits_its_process_once_per_run(tmp_path: Path) -> None:
    """faults.kill_*_at_step: the process exits for real at its step, once; a replacement reaching the step again
    (the marker file is there) carries on."""
    import subprocess
    import sys

    from tracerl.config import FaultConfig

    faults = Faults.from_config(FaultConfig(kill_rollout_worker_at_step=2), tmp_path / ".faults")
    assert (faults.sampler_step, faults.env_step, faults.trainer_step) == (2, -1, -1)
    code = (
        "from tracerl.actors.faults import Faults; import sys; "
        f"f = Faults({faults.fault_dir!r}, sampler_step=2); f.sampler(1); f.env(2); f.trainer(2); f.sampler(2); "
        "sys.exit(7)"
    )
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert first.returncode == 1 and "the sampler process exits during step 2" in first.stdout
    assert [p.name for p in (tmp_path / ".faults").iterdir()] == ["sampler-step2"]
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 7  # fired already


def _pool_step(workers: int, local: bool = False) -> dict[str, list[tuple[object, ...]]]:
    """One step (rollout, then expansion) on a real RolloutPool of ``workers`` sampler actors running the
    FakeSeededSampler (``local``: the in-process LocalPool running ``workers`` shards); every tree's nodes as
    records."""
    from tests.fake_seeded import FakeSeededSampler
    from tracerl.actors.local import LocalPool
    from tracerl.actors.pools import RolloutPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.algos.allocators import Expansion
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig
    from tracerl.workflows.lm.stack import task_prompts

    env = EnvConfig(name="math")
    pools = PoolConfig(rollout_workers=workers, rollout_cpus=0.05, env_workers=0)
    sampler = SamplerConfig(
        backend=f"tests.fake_seeded:{FakeSeededSampler.__name__}", max_turns=3, batch_size=4
    )
    spec = WorkerSpec(model=ModelConfig(), sampler=sampler, env=env, pools=pools)
    pool = LocalPool(spec, workers, seed=11) if local else RolloutPool(spec, workers, 0.05, 0.0, 0, seed=11)
    try:
        if isinstance(pool, LocalPool):  # tool calls on as many threads as the actor pool has samplers
            assert getattr(pool.worker.env, "workers", 1) == workers
        assert pool.cpu_s() == 0.0  # the first read sets where the counts start
        pool.begin_step(4)
        trees = pool.rollout(task_prompts(env)[:5], [2, 1, 3, 2, 1])
        expansions = []
        for t in trees:
            pre = t.bare_prefixes()[-1:]
            expansions.append(
                Expansion(np.array(pre, dtype=np.int64), np.array([2] * len(pre)), extra_bare=1)
            )
        pool.expand(trees, expansions)
        # The step's CPU seconds on the sampler actors (tools run in their processes); in-process the trainer's
        # own reading counts them.
        assert pool.cpu_s() > 0 if not local else pool.cpu_s() == 0.0
        return {
            t.prompt.prompt_id: [
                (n.node_id, n.parent, n.path_id, n.token_ids, n.logprobs, n.status, n.reward) for n in t.nodes
            ]
            for t in trees
        }
    finally:
        pool.shutdown()


def test_a_worker_drops_a_steps_trees_when_released_and_before_the_next_rollout() -> None:
    """The trees a worker keeps for the step's expansions (with their KV caches) go when the driver releases the
    step, keeping a later step's (an overlapped rollout running meanwhile), and an earlier step's go before the
    next rollout makes its own."""
    from tests.fake_seeded import FakeSeededSampler
    from tracerl.actors.local import LocalPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig
    from tracerl.workflows.lm.stack import task_prompts

    env = EnvConfig(name="math")
    sampler = SamplerConfig(backend=f"tests.fake_seeded:{FakeSeededSampler.__name__}", max_turns=2)
    spec = WorkerSpec(ModelConfig(), sampler, env, PoolConfig(rollout_workers=1, env_workers=0))
    pool = LocalPool(spec, 1, seed=11)
    try:
        prompts = task_prompts(env)[:2]
        pool.begin_step(4)
        pool.rollout(prompts, [2, 1])
        assert list(pool.worker.trees) == ["4/0/0"]
        pool.worker.trees["5/0/0"] = []  # as if step 5 had started ahead
        pool.release(4)
        assert list(pool.worker.trees) == ["5/0/0"]
        pool.begin_step(6)
        pool.rollout(prompts, [1, 1])
        assert list(pool.worker.trees) == ["6/0/0"]
    finally:
        pool.shutdown()


@pytest.mark.e2e
def test_one_and_three_rollout_workers_give_identical_trees(ray_local: Any) -> None:
    """Seeds are keyed by (seed, step, prompt, path, turn), not by worker shard or call: the same step on one
    sampler actor and on three (other shards, other batches, expansion on each owner) gives the same trees."""
    one, three = _pool_step(1), _pool_step(3)
    assert one == three
    assert len(one) == 5 and sum(len(nodes) for nodes in one.values()) > 5 * 3
    assert any(nodes[-1][2] >= 3 for nodes in one.values())  # continuations ran (path ids past the bare ones)


@pytest.mark.e2e
def test_the_in_process_pool_gives_the_actors_trees(ray_local: Any) -> None:
    """The in-process pool (no actors: one worker running the shards in turn, calls copied as across processes)
    gives the trees of the actor pool, on one shard and on three."""
    actors = _pool_step(3)
    assert _pool_step(1, local=True) == _pool_step(3, local=True) == actors
    assert sum(len(nodes) for nodes in actors.values()) > 5 * 3


class _FakeBarrierEnv(ToolEnv):
    """A fake environment (for ConcurrentEnv) whose every tool call waits at a barrier of ``parties`` calls."""

    def __init__(self, parties: int) -> None:
        import threading

        self.barrier = threading.Barrier(parties, timeout=120)
        self.threads: list[int] = []

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        import threading

        self.threads.append(threading.get_ident())
        self.barrier.wait()  # breaks (BrokenBarrierError) unless all parties run at once
        return ToolResult(observation=f"obs {state}", state=state)


def test_concurrent_env_runs_a_rounds_calls_at_once_and_keeps_their_order() -> None:
    """The in-process pool's tool threads (engine/concurrent_env.py): a round of 3 calls on 3 threads all reach the
    barrier together (one by one they could not), and the results come back in call order."""
    import threading

    from tracerl.engine.concurrent_env import ConcurrentEnv

    fake = _FakeBarrierEnv(3)
    env = ConcurrentEnv(fake, 3)
    prompt = Prompt(prompt_id="p", text="q")
    calls = [(prompt, i, Action(ActionKind.TOOL, "")) for i in range(3)]
    assert [r.observation for r in env.execute_batch(calls)] == ["obs 0", "obs 1", "obs 2"]
    assert len(set(fake.threads)) == 3 and threading.get_ident() not in fake.threads
    # One thread: the wrapped environment's own (one by one) path, in the caller's thread.
    one = _FakeBarrierEnv(1)
    assert [r.state for r in ConcurrentEnv(one, 1).execute_batch(calls)] == [0, 1, 2]
    assert set(one.threads) == {threading.get_ident()}
