"""Streaming steps (``pipeline.mode=streaming``, engine/stream.py, actors/stream_pool.py) against barrier steps.

The unit under test is the step's scheduling, so turns come from ``FakeSeededSampler`` (each turn a function of its
(seed, step, prompt, path, turn) seed alone): streaming must give the barrier's trees node for node, the same
Stage 2 decisions and leave the step's generator where the barrier leaves it; in process, on one sampler actor, on
two with every expansion re-encoded elsewhere, and on two when one actor dies mid-stream. The same with
``FakeAsyncSeededSampler`` (``agenerate``: the per-path driver, engine/paths.py), whose turns finish after delays
drawn from their seeds, so paths finish turns out of the round driver's order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TOOL_TIMEOUT_S
from tracerl.algos.allocators import build_allocator
from tracerl.config import AllocatorConfig, BudgetConfig, ModelConfig, PipelineMode, SamplerConfig, env_config
from tracerl.engine.step import StepOutcome, run_step, same_allocation
from tracerl.envs.math.config import MathEnvConfig
from tracerl.envs.sandbox import SandboxConfig
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt

# A long tool timeout: a sandboxed call timing out on a loaded machine would change one mode's trees.
ENV = env_config(
    "math",
    reward_timeout_s=TOOL_TIMEOUT_S,
    math=MathEnvConfig(sandbox=SandboxConfig(timeout_s=TOOL_TIMEOUT_S)),
)
SAMPLER = SamplerConfig(backend="tests.fake_seeded:FakeSeededSampler", max_turns=3, batch_size=4)
ASYNC_SAMPLER = SamplerConfig(backend="tests.fake_seeded:FakeAsyncSeededSampler", max_turns=3, batch_size=4)
BUDGET = BudgetConfig(num_leaves=None, num_roots=8, continuations=2, group_size=4, pool_factor=1)
SEED, STEP = 11, 4


class FakeDepthScorer:
    """Fake predictor (the unit under test is the step): p depends on the prefix's depth and first token, so the
    solver's choices depend on the trees; ``ready`` False makes the allocation uniform (ties drawn from the rng)."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        return np.array(
            [
                0.5
                if not a.history
                else (0.2 + 0.1 * len(a.history) + 0.01 * (a.history[0].token_ids[0] % 7))
                for a in anchors
            ]
        )


def records(trees: Sequence[RolloutTree]) -> dict[str, list[tuple[object, ...]]]:
    """Every tree's full structure and tokens."""
    return {
        t.prompt.prompt_id: [
            (
                n.node_id,
                n.parent,
                n.path_id,
                n.token_ids,
                n.model_mask,
                n.logprobs,
                n.status,
                n.reward,
                n.content,
            )
            for n in t.nodes
        ]
        for t in trees
    }


def decisions(out: StepOutcome, rng: np.random.Generator) -> tuple[object, ...]:
    return (
        records(out.trees),
        out.root_counts.tolist(),
        [(e.node_ids.tolist(), e.counts.tolist(), e.extra_bare) for e in out.expansions],
        out.prefix_scores,
        out.ledger.generated_tokens,
        rng.integers(1 << 30),  # the step left the generator in the same state
    )


def _step(backend: Any, mode: PipelineMode, ready: bool) -> tuple[StepOutcome, tuple[object, ...]]:
    from tracerl.workflows.lm.stack import task_prompts

    prompts = task_prompts(ENV)[:6]
    rng = np.random.default_rng(5)
    allocator = build_allocator(AllocatorConfig(name="trace"))
    out = run_step(prompts, allocator, FakeDepthScorer(ready), backend, BUDGET, rng, mode=mode)
    assert same_allocation(out, allocator)
    return out, decisions(out, rng)


def _engine(sampler_cls: Any) -> Any:
    """The in-process engine with a fake sampler and the policy's tokenizer (what the sampler actors build)."""
    from tracerl.engine.react import TEMPLATES
    from tracerl.engine.rollout import TreeRolloutEngine
    from tracerl.envs.registry import env_class
    from tracerl.models.hf import load_policy

    tok, _ = load_policy(ModelConfig())
    env = env_class(ENV.name).from_config(ENV)
    eng = TreeRolloutEngine(sampler_cls(tok), env, TEMPLATES.get(ModelConfig().template)(tok), tok, SAMPLER)
    eng.seed, eng.step = SEED, STEP
    return eng


@pytest.fixture(scope="module")
def engine() -> Any:
    from tests.fake_seeded import FakeSeededSampler

    return _engine(FakeSeededSampler)


@pytest.fixture(scope="module")
def async_engine() -> Any:
    from tests.fake_seeded import FakeAsyncSeededSampler

    return _engine(FakeAsyncSeededSampler)


def _in_process(engine: Any, mode: PipelineMode, ready: bool) -> tuple[StepOutcome, tuple[object, ...]]:
    from tracerl.engine.ledger import BudgetLedger

    engine.ledger = BudgetLedger()
    out, rec = _step(engine, mode, ready)
    return out, (*rec[:4], engine.ledger.generated_tokens, rec[5])


@pytest.mark.parametrize("ready", [False, True])
def test_in_process_streaming_gives_the_barrier_trees_and_decisions(engine: Any, ready: bool) -> None:
    barrier, want = _in_process(engine, "barrier", ready)
    streaming, got = _in_process(engine, "streaming", ready)
    assert got == want
    assert streaming.ledger.continuations == barrier.ledger.continuations > 0
    assert sum(e.leaves for e in streaming.expansions) == 2 * int(streaming.root_counts.sum())
    assert engine.ledger.kv_local_continuations == streaming.ledger.continuations
    assert engine.ledger.kv_reencoded_continuations == 0


@pytest.mark.parametrize("ready", [False, True])
def test_the_per_path_driver_gives_the_round_drivers_trees_and_decisions(
    engine: Any, async_engine: Any, ready: bool
) -> None:
    """An async sampler in a streaming step: one task per path, turns finishing out of order; the trees (node ids
    included), Stage 2 decisions and counts are those of the round driver and of barrier mode."""
    from tracerl.engine.paths import drives_per_path

    assert drives_per_path(async_engine) and not drives_per_path(engine)
    barrier, want = _in_process(engine, "barrier", ready)
    rounds, got_rounds = _in_process(engine, "streaming", ready)
    per_path, got = _in_process(async_engine, "streaming", ready)
    assert got == got_rounds == want
    led, ref = async_engine.ledger, engine.ledger
    assert per_path.ledger.continuations == barrier.ledger.continuations > 0
    assert led.kv_local_continuations == per_path.ledger.continuations and led.kv_reencoded_continuations == 0
    assert (led.llm_calls, led.tool_calls, led.prefill_tokens_computed) == (
        ref.llm_calls,
        ref.tool_calls,
        ref.prefill_tokens_computed,
    )
    # no engine iteration counts from the fake: every request decodes alone (occupancy 1)
    assert led.decode_rows == led.decode_steps == led.generated_tokens > 0
    assert 0 < led.sampler_busy_s == led.phase_s["generate"] and led.phase_s["tools"] > 0


def test_reorder_renumbers_a_phase_in_creation_order() -> None:
    """``RolloutTree.reorder``: nodes added in another order than the round driver's come out with its ids,
    parents, children, leaves and fork states."""
    from tracerl.types import Status

    def build(order: list[tuple[str, str | None, int]]) -> RolloutTree:
        """Nodes (name, parent's name or None for the root, path id); a name ending in '!' is a leaf."""
        t = RolloutTree(Prompt("q"))
        t.new_path(True), t.new_path(True)
        ids = {None: 0}
        for name, parent, pid in order:
            leaf = name.endswith("!")
            status, reward = (Status.ANSWERED, 1.0) if leaf else (Status.TURN, None)
            node = t.add_node(ids[parent], pid, content=name, status=status, reward=reward)
            ids[name] = node.node_id
            t.fork_state[node.node_id] = name
        return t

    # the round driver's order: a1 (path 0), b1 (path 1), then a2! (path 0's leaf), b2! (path 1's leaf)
    want = build([("a1", None, 0), ("b1", None, 1), ("a2!", "a1", 0), ("b2!", "b1", 1)])
    got = build([("b1", None, 1), ("b2!", "b1", 1), ("a1", None, 0), ("a2!", "a1", 0)])
    got.reorder(1, [3, 1, 4, 2])
    assert [(n.node_id, n.parent, n.children, n.content) for n in got.nodes] == [
        (n.node_id, n.parent, n.children, n.content) for n in want.nodes
    ]
    assert [n.node_id for n in got.leaves()] == [3, 4] and got.fork_state == want.fork_state
    with pytest.raises(ValueError, match="order must hold each node id from 1 to 4 once"):
        got.reorder(1, [1, 2, 3])


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


def _pool_run(
    workers: int,
    mode: PipelineMode,
    tmp: Path | None = None,
    reencode: int = 128,
    sampler: SamplerConfig = SAMPLER,
) -> tuple[Any, tuple[object, ...]]:
    from tracerl.actors.faults import Faults
    from tracerl.actors.pools import RolloutPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import PoolConfig

    pools = PoolConfig(rollout_workers=workers, rollout_cpus=0.05, env_workers=0)
    faults = Faults(str(tmp), sampler_step=STEP) if tmp is not None else Faults()
    spec = WorkerSpec(model=ModelConfig(), sampler=sampler, env=ENV, pools=pools, faults=faults)
    pool = RolloutPool(spec, workers, 0.05, 0.0, max_retries=2, seed=SEED, reencode_queue=reencode)
    try:
        pool.begin_step(STEP)
        out, rec = _step(pool, mode, True)
        return pool.ledger, (*rec[:4], pool.ledger.generated_tokens, rec[5])
    finally:
        pool.shutdown()


@pytest.fixture(scope="module")
def barrier(engine: Any) -> tuple[object, ...]:
    return _in_process(engine, "barrier", True)[1]


@pytest.mark.e2e
def test_streaming_on_one_and_two_sampler_actors_gives_the_barrier_trees(
    ray_local: Any, barrier: tuple[object, ...]
) -> None:
    """One actor: every continuation runs where its prefix's KV lives. Two actors with reencode_queue=0: a busy
    owner hands expansions to the idle actor, which re-encodes; the trees are the same, the ledger counts both."""
    from tracerl import metrics as M

    one, got_one = _pool_run(1, "streaming")
    assert got_one == barrier
    assert one.kv_reencoded_continuations == 0 and one.kv_local_continuations > 0
    two, got_two = _pool_run(2, "streaming", reencode=0)
    assert got_two == barrier
    # Whether an owner is busier than the other actor when a tree's rollouts end depends on timing: the counts
    # add up either way (the placement rule itself: test_a_busy_owner_hands_the_expansion_to_the_least_loaded).
    assert two.kv_local_continuations + two.kv_reencoded_continuations == one.kv_local_continuations
    rates = {k: v for k, v in two.as_metrics().items() if k.startswith(M.KV_HIT_RATE)}
    assert rates and all(0.0 <= v <= 1.0 for v in rates.values())
    hits = sum(h for h, _ in two.kv_depth.values())
    assert (
        hits == two.kv_local_continuations
        and sum(n for _, n in two.kv_depth.values()) == one.kv_local_continuations
    )
    assert two.decode_steps > 0 and two.decode_rows >= two.decode_steps and two.sampler_busy_s > 0


def test_a_busy_owner_hands_the_expansion_to_the_least_loaded_actor() -> None:
    """pipeline.reencode_queue: an expansion stays with the actor holding its tree's KV caches unless that actor has
    more paths running or queued than the limit and another has fewer; -1 never moves it."""
    from types import SimpleNamespace

    from tracerl.actors.stream_pool import PoolStream
    from tracerl.algos.allocators import Expansion

    ex = Expansion(np.array([1, 2]), np.array([2, 1]), extra_bare=1)  # 4 leaves

    def place(limit: int, queue: list[int]) -> tuple[int, list[int]]:
        pool = SimpleNamespace(reencode_queue=limit)
        prompts = [Prompt("a"), Prompt("b")]
        stream = PoolStream(pool, [[0], [1], []], prompts, [1, 1], lambda ids, trees: [])
        stream.queue = list(queue)
        stream._place(0, ex)
        return stream.home[0], stream.queue

    assert place(8, [8, 0, 3]) == (0, [12, 0, 3])  # at the limit: the owner keeps it
    assert place(8, [9, 5, 3]) == (2, [9, 5, 7])  # past it: the least-loaded actor re-encodes
    assert place(0, [1, 1, 1]) == (0, [5, 1, 1])  # nobody has fewer: the owner keeps it
    assert place(-1, [100, 0, 0]) == (0, [104, 0, 0])  # -1: never moved


@pytest.mark.e2e
def test_per_path_streaming_on_two_sampler_actors_gives_the_barrier_trees(
    ray_local: Any, barrier: tuple[object, ...]
) -> None:
    """The async fake sampler on two actors (reencode_queue=0): each actor runs its paths as tasks between the
    driver's calls and reports trees as they end; the barrier's trees, decisions and counts."""
    led, got = _pool_run(2, "streaming", reencode=0, sampler=ASYNC_SAMPLER)
    assert got == barrier
    assert led.kv_local_continuations + led.kv_reencoded_continuations > 0
    assert led.decode_rows == led.decode_steps == led.generated_tokens and led.sampler_busy_s > 0


@pytest.mark.e2e
@pytest.mark.parametrize("sampler", [SAMPLER, ASYNC_SAMPLER], ids=["rounds", "per_path"])
def test_a_sampler_actor_dying_mid_stream_is_replaced_and_the_step_completes(
    ray_local: Any, barrier: tuple[object, ...], tmp_path: Path, sampler: SamplerConfig
) -> None:
    """faults.kill_rollout_worker_at_step in streaming mode: an actor exits for real on its second call of the
    step (it has rolled out one round, or per path: reported a tree); a fresh actor redoes its share, the trees are
    unchanged, the retry counted."""
    ledger, got = _pool_run(2, "streaming", tmp=tmp_path, sampler=sampler)
    assert (tmp_path / f"sampler-step{STEP}").exists()
    assert ledger.retried >= 1
    assert got[:4] == barrier[:4] and got[5] == barrier[5]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pipeline.mode=async"], "pipeline.mode must be one of 'barrier', 'streaming' (got 'async')"),
        (["pipeline.reencode_queue=-2"], "pipeline.reencode_queue must be >= 0, or -1 for never (got -2)"),
        (
            ["modes=[barrier,overlap]"],
            "bad value for 'modes[1]': Invalid value 'overlap', expected one of ['barrier', 'streaming']",
        ),
    ],
)
def test_bad_pipeline_settings_fail_with_a_message_naming_the_key(overrides: list[str], message: str) -> None:
    from tracerl.config_loader import ConfigError, compose, conf_dir
    from tracerl.workflows.pipeline.config import BenchPipelineConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(BenchPipelineConfig, conf_dir() / "bench/pipeline.yaml", overrides)


def test_the_pipeline_bench_summary_has_the_issues_cpu_schema() -> None:
    """Means over seeds of each run's mean step per mode; same_allocation over every step; overlap measured in the
    train runs (tests/test_overlap.py)."""
    from tracerl.config_loader import compose, conf_dir
    from tracerl.workflows.pipeline.bench import format_table, summarize
    from tracerl.workflows.pipeline.config import BenchPipelineConfig

    cfg = compose(BenchPipelineConfig, conf_dir() / "bench/pipeline.yaml", ["seeds=2", "steps=2"])
    assert cfg.train.pipeline.mode == "barrier" and cfg.modes == ["barrier", "streaming"]
    assert cfg.train.pools.rollout_workers == 2 and cfg.train.sampler.backend == "hf"

    def step(s: float, same: bool = True) -> dict[str, Any]:
        return {
            "step_s": s,
            "rollout_s": s / 2,
            "busy": 0.5,
            "occupancy": 3.0,
            "generated_tokens": 10,
            "same_allocation": same,
        }

    runs = [
        {"mode": "barrier", "seed": 0, "steps": [step(4.0), step(6.0)]},
        {"mode": "streaming", "seed": 0, "steps": [step(3.0), step(3.0)]},
        {"mode": "barrier", "seed": 1, "steps": [step(2.0), step(2.0)]},
        {"mode": "streaming", "seed": 1, "steps": [step(1.0), step(1.0, same=False)]},
    ]
    cpu = summarize(cfg, runs)["cpu"]
    assert set(cpu) == {"barrier", "streaming", "overlap", "same_allocation"}
    assert cpu["barrier"] == {
        "step_s": 3.5,
        "rollout_s": 1.75,
        "busy": 0.5,
        "occupancy": 3.0,
        "generated_tokens": 10,
    }
    assert cpu["streaming"]["step_s"] == 2.0 and cpu["same_allocation"] is False
    assert cpu["overlap"]["status"] == "measured with the update"
    assert "streaming / barrier step time: 0.571" in format_table(summarize(cfg, runs))
