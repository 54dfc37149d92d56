"""Grading under a wall-clock limit (issue 13, item 1): hostile answers for every reward end within the limit.

Unbounded, ``9^{9^{9^{9^9}}}`` held a rollout in sympy for over 40 s and nested braces for minutes. Every bound
below is generous (a grade must *end*, not be fast): ``LIMIT`` plus a worker start-up on a busy machine.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import require_bfcl
from tracerl.config import SamplerConfig, env_config
from tracerl.engine.react import PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.math.env import MathEnv
from tracerl.envs.math.reward import is_correct
from tracerl.envs.search.config import SearchEnvConfig
from tracerl.grading import GradeError, Grader, GradeTimeout
from tracerl.samplers.scripted import ByteTokenizer, ScriptedSampler
from tracerl.types import Prompt, Status

LIMIT = 2.0
ENDS_WITHIN = 60.0
"""A grade that ends within this many seconds ended (unbounded, these ran for minutes)."""
TOWER = "9^{9^{9^{9^9}}}"
HOSTILE_MATH = [
    TOWER,
    "{" * 200 + "1" + "}" * 200,
    "\\frac{" * 60 + "1" + "}{2}" * 60,
    "2^{" * 40 + "2" + "}" * 40,
]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    try:
        out = fn(*args)
    except GradeTimeout as exc:
        out = exc
    return out, time.monotonic() - t0


def test_a_grade_past_the_limit_is_killed_and_the_next_one_runs_on_a_fresh_worker() -> None:
    g = Grader(LIMIT)
    assert g(pow, 2, 10) == 1024
    first = g._proc
    out, took = _timed(g, _sleep, 3600.0)
    assert isinstance(out, GradeTimeout) and "past 2 s" in str(out)
    assert took < ENDS_WITHIN and g.timeouts == 1
    assert first is not None and first.poll() is not None  # the stuck worker is gone, not left running
    assert g(pow, 3, 3) == 27 and g.restarts == 1
    with pytest.raises(GradeError, match="ValueError: invalid literal"):
        g(int, "x")
    g.close()


def test_a_worker_killed_from_outside_is_replaced_without_failing_the_grade() -> None:
    g = Grader(LIMIT)
    assert g(pow, 2, 3) == 8
    assert g._proc is not None
    os.kill(g._proc.pid, signal.SIGKILL)
    g._proc.wait()
    assert g(pow, 2, 4) == 16 and g.timeouts == 0
    g.close()


def test_a_worker_that_cannot_import_its_modules_is_a_clear_error() -> None:
    g = Grader(LIMIT, preload=("no_such_module_h1",))
    with pytest.raises(
        RuntimeError, match="could not start: preload 'no_such_module_h1': ModuleNotFoundError"
    ):
        g(pow, 2, 2)


@pytest.fixture(scope="module")
def math_env() -> MathEnv:
    return MathEnv(reward_timeout_s=LIMIT)


def test_the_exact_match_fast_path_never_starts_a_worker(math_env: MathEnv) -> None:
    env = MathEnv(reward_timeout_s=LIMIT)
    assert env.reward(Prompt("p", "q", "1,000"), " 1000. ") == 1.0
    assert env.grader._proc is None


@pytest.mark.parametrize("answer", HOSTILE_MATH)
def test_hostile_math_answers_end_within_the_limit(math_env: MathEnv, answer: str) -> None:
    out, took = _timed(math_env.reward, Prompt("p", "q", "3"), answer)
    assert out == 0.0 or isinstance(out, GradeTimeout)
    assert took < ENDS_WITHIN, f"{answer!r} took {took:.1f} s"


def test_math_verify_still_grades_equal_forms(math_env: MathEnv) -> None:
    assert math_env.reward(Prompt("p", "q", "\\frac{1}{2}"), "0.5") == 1.0
    assert is_correct("3", "3.0") and not is_correct("3", "4")  # in process, without a grader


def test_the_tower_times_out_off_the_main_thread(math_env: MathEnv) -> None:
    with ThreadPoolExecutor(1) as pool:
        out, took = pool.submit(_timed, math_env.reward, Prompt("p", "q", "3"), TOWER).result()
    assert isinstance(out, GradeTimeout) and took < ENDS_WITHIN


class FakeAsyncScriptedSampler(ScriptedSampler):
    """Fake async sampler (the unit under test is grading in the per-path driver): the scripted turns, awaited."""

    async def agenerate(
        self,
        context: list[int],
        max_new_tokens: int,
        stop: Any,
        temperature: float,
        seed: int,
        cache: Any = None,
    ) -> Any:
        return self.generate([context], max_new_tokens, stop, temperature, [seed])[0]


@pytest.mark.parametrize("driver", ["rounds", "per_path"])
def test_a_timed_out_grade_is_reward_0_flagged_and_counted_by_the_engine(driver: str) -> None:
    """In rounds, and per path (engine/paths.py: grading on a worker thread, counted on the loop)."""
    from tracerl.engine.paths import AsyncStreamRun

    env = MathEnv(reward_timeout_s=LIMIT)
    prompts = [Prompt("tower", "What is 3?", "3"), Prompt("fine", "What is 4?", "4")]
    tok, template = ByteTokenizer(), PlainTemplate()
    sampler = ScriptedSampler(tok) if driver == "rounds" else FakeAsyncScriptedSampler(tok)
    for p, answer in zip(prompts, (TOWER, "4")):
        sampler.add_script(template.prompt(p.text, env.tools), [template.answer_turn("so", answer)])
    engine = TreeRolloutEngine(
        sampler,
        env,
        template,
        tok,
        SamplerConfig(max_turn_tokens=10**6, max_episode_tokens=10**6, max_context_tokens=10**6),
    )
    t0 = time.monotonic()
    if driver == "rounds":
        tower, fine = engine.rollout(prompts, [1, 1])
    else:
        run = AsyncStreamRun(engine, [0, 1], prompts, [1, 1])
        reported: list[int] = []
        while len(reported) < 2:
            reported += run.serve([]).bare
        run.close()
        tower, fine = run.trees[0], run.trees[1]
    assert time.monotonic() - t0 < ENDS_WITHIN
    leaf = tower.leaves()[0]
    assert leaf.status is Status.GRADE_TIMEOUT and leaf.reward == 0.0
    assert fine.leaves()[0].status is Status.ANSWERED and fine.leaves()[0].reward == 1.0
    assert engine.ledger.grade_timeouts == 1
    metrics = engine.ledger.as_metrics()
    assert metrics["budget/grade_timeouts"] == 1.0 and metrics["time/grade_s"] > 0


def test_huge_search_answers_end_within_the_limit() -> None:
    from tracerl.envs.search.env import FAST_ANSWER_CHARS, SearchEnv

    env = SearchEnv.from_config(
        env_config(name="search", search=SearchEnvConfig(reward="f1"), reward_timeout_s=LIMIT)
    )
    prompt = Prompt("p", "q", '["Ada Lovelace", "Lovelace"]')
    assert env.reward(prompt, "Ada Lovelace") == 1.0 and env.grader._proc is None  # short: in process
    for answer in ("Ada Lovelace " * 1000, "x" * 20_000_000, "the a an " * 2_000_000):
        assert len(answer) > FAST_ANSWER_CHARS
        out, took = _timed(env.reward, prompt, answer)
        assert (out in (0.0, 1.0) or isinstance(out, GradeTimeout)) and took < ENDS_WITHIN
    assert (
        env.reward(prompt, "Ada Lovelace " * 1000) == 0.0
    )  # precision 2/2000: F1 below 0.3, graded in the worker
    assert env.scores(prompt, None) == {"em": 0.0, "f1": 0.0}


def test_pathological_bfcl_episodes_end_within_the_limit() -> None:
    require_bfcl()
    from tracerl.envs.bfcl.env import BfclEnv, BfclState

    env = BfclEnv(("base",), reward_timeout_s=LIMIT)
    task = next(iter(env.tasks.values()))
    turns = len(task.ground_truth)
    calls = tuple(f"echo(content={'x' * 1000!r})" for _ in range(20_000))  # far more work than any episode
    flooded = BfclState(turns - 1, tuple(((calls,),) for _ in range(turns)))
    hostile = BfclState(
        turns - 1, tuple(((("ls(a=" + "[" * 500 + "]" * 500 + ")",),),) for _ in range(turns))
    )
    for state in (flooded, hostile):
        out, took = _timed(env.score, task, state)
        assert (out == 0.0 or isinstance(out, GradeTimeout)) and took < ENDS_WITHIN


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


def test_the_tower_times_out_inside_a_ray_actor(ray_local: Any) -> None:
    ray = ray_local

    @ray.remote(num_cpus=0.1)
    class Grading:
        def __init__(self) -> None:
            self.env = MathEnv(reward_timeout_s=LIMIT)

        def grade(self, answer: str) -> tuple[str, float]:
            out, took = _timed(self.env.reward, Prompt("p", "q", "3"), answer)
            return type(out).__name__ if isinstance(out, Exception) else repr(out), took

    actor = Grading.remote()  # type: ignore[attr-defined]
    kind, took = ray.get(actor.grade.remote(TOWER), timeout=300)
    assert kind == "GradeTimeout" and took < ENDS_WITHIN
    assert ray.get(actor.grade.remote("3.0"), timeout=300)[0] == "1.0"  # the replacement worker grades
    ray.kill(actor)


def test_a_pathological_bfcl_tool_call_is_stopped_and_not_recorded() -> None:
    require_bfcl()
    from tracerl.engine.react import Action, ActionKind
    from tracerl.envs.bfcl.env import BfclEnv, task_prompt

    env = BfclEnv(("base",), call_timeout_s=LIMIT)
    task = next(t for t in env.tasks.values() if "MathAPI" in t.entry["involved_classes"])
    prompt = task_prompt(task)
    state = env.initial_state(prompt)
    huge = Action(ActionKind.TOOL, "", tool="power", arguments={"base": 9, "exponent": 387420489})
    out, took = _timed(env.execute, prompt, state, huge)  # unbounded: minutes in BFCL's MathAPI
    assert "ran past 2 s and were stopped; nothing was recorded" in out.observation and took < ENDS_WITHIN
    assert out.state == state and out.timed_out  # counted in the ledger (budget/tool_timeouts)
    fine = env.execute(prompt, state, Action(ActionKind.TOOL, "", tool="add", arguments={"a": 1, "b": 2}))
    assert "3" in fine.observation and fine.state.num_calls == 1
