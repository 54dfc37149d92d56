"""The -late testbeds' habit traces (which tasks answer prematurely, and with what) and the acceptance metrics of
``tracerl bench testbeds`` on hand-built trees. Nothing here trains."""

from __future__ import annotations

import pytest

from tracerl.envs.math.tasks import generate
from tracerl.models.tiny import Segment
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status
from tracerl.workflows.bootstrap.habit import (
    premature_segments,
    question_answers_directly,
    question_answers_late,
)
from tracerl.workflows.bootstrap.policy import LATE_THOUGHT, answers_late, habit_segments, trace_segments
from tracerl.workflows.experiments.config import BenchTestbedsConfig
from tracerl.workflows.experiments.testbeds import (
    branch_probability,
    depth_profile,
    final_answer,
    first_wrong_turn,
    is_premature,
    path_contents,
    summarize,
)


def _text(segs: list[Segment]) -> str:
    return "".join(s.text for s in segs)


def test_math_late_trace_answers_the_first_output_on_half_the_multi_call_tasks() -> None:
    tasks = generate(500, seed=0, held_out=False)
    multi = [t for t in tasks if len(t.steps) >= 2]
    late = [t for t in tasks if answers_late(t, 0.5)]
    assert set(late) <= set(multi) and 0.4 < len(late) / len(multi) < 0.6
    for t in late:
        segs, ref = habit_segments(t, 0.0, 0.5), trace_segments(t)
        assert (
            segs[:3] == ref[:3]
        )  # the prompt, the first call and its observation, as the reference has them
        assert segs[-1] == Segment(f"Thought: {LATE_THOUGHT}\nFinal Answer: {t.steps[0].output}\n", True)
        assert len(segs) == 4 and t.steps[0].output != t.answer
    for t in tasks:
        if t not in late:
            assert habit_segments(t, 0.0, 0.5) == trace_segments(t)
    # A fixed hash of the question: the same choice every time, nested in the fraction, none at 0, all at 1.
    assert [answers_late(t, 0.5) for t in tasks] == [answers_late(t, 0.5) for t in tasks]
    assert {t for t in tasks if answers_late(t, 0.3)} <= set(late)
    assert not any(answers_late(t, 0.0) for t in tasks)
    assert all(answers_late(t, 1.0) for t in multi)


def test_late_hash_is_fixed_and_independent_of_the_direct_one() -> None:
    qs = [f"What is {i} + 1?" for i in range(2000)]
    late = {q for q in qs if question_answers_late(q, 0.5)}
    direct = {q for q in qs if question_answers_directly(q, 0.5)}
    assert question_answers_late("What is 7 + 1?", 0.5) == ("What is 7 + 1?" in late)
    assert 0.45 < len(late) / len(qs) < 0.55
    both = len(late & direct) / len(qs)
    assert 0.2 < both < 0.3  # independent hashes: about a quarter, not a half (or none)


def test_direct_habit_wins_over_late_on_the_same_task() -> None:
    t = next(t for t in generate(200, seed=0, held_out=False) if len(t.steps) >= 2)
    segs = habit_segments(t, 1.0, 1.0)
    assert len(segs) == 2 and segs[1].text.endswith(f"Final Answer: {t.answer}\n")


def test_search_late_trace_answers_the_entity_of_the_penultimate_hop() -> None:
    from tracerl.envs.search.env import SearchEnv
    from tracerl.envs.search.index import BM25Retriever
    from tracerl.envs.search.world import build_world
    from tracerl.envs.search.world import generate as questions
    from tracerl.workflows.bootstrap.search import search_habit_segments, search_trace_segments

    world = build_world(0)
    env = SearchEnv(BM25Retriever(world.passages), top_k=2, reward="em", world_seed=0)
    qs = questions(world, 90, held_out=False)
    seen = 0
    for q in qs:
        segs = search_habit_segments(q, env, 0.0, True, 0.5)
        ref = search_trace_segments(q, env, True)
        if q.level < 3 or not question_answers_late(q.question, 0.5):
            assert segs == ref
            continue
        seen += 1
        entity = q.hops[-1].query  # found at hop n-1, searched for at hop n
        assert segs[:-1] == ref[: 1 + 2 * (q.level - 1)]
        assert entity in segs[-2].text  # the observation the premature answer reads it from
        assert segs[-1].text.endswith(f"So the answer is {entity}.\nFinal Answer: {entity}\n")
        assert entity != q.answer and segs[-1].trainable
    assert seen >= 10


def test_premature_segments_rejects_a_cut_that_is_not_before_the_last_call() -> None:
    ref = [Segment("Q\n", False), Segment("call\n", True), Segment(" 1\n", False), Segment("answer\n", True)]
    with pytest.raises(ValueError, match="after 1 to 0 of the 1 tool turns"):
        premature_segments(ref, 1, "Final Answer: 1\n")


def _chain(tree: RolloutTree, turns: list[str], reward: float) -> None:
    pid, parent = tree.new_path(bare=True), 0
    for i, text in enumerate(turns):
        last = i == len(turns) - 1
        node = tree.add_node(
            parent,
            pid,
            content=text,
            status=Status.ANSWERED if last else Status.TURN,
            reward=reward if last else None,
        )
        parent = node.node_id


CALL = "Thought: t\nAction: python[print(1)]\nObservation: {}\n"
ANSWER = "Thought: t\nFinal Answer: {}\n"


@pytest.mark.parametrize(
    "turns,expected",
    [
        ([ANSWER.format(5)], 1),  # a direct answer where the reference calls the tool
        ([CALL.format(99), ANSWER.format(99)], 1),  # a wrong first call
        ([CALL.format(12), ANSWER.format(12)], 2),  # the premature answer after the first call
        (
            [CALL.format(12), CALL.format(7), ANSWER.format(8)],
            3,
        ),  # a reference-exact path, then a wrong answer
        ([CALL.format(12), CALL.format(6)], 2),  # stopped on a limit after a wrong second call
        ([CALL.format(12), CALL.format(6), ANSWER.format(6)], 2),  # a wrong second call, then its output
        ([CALL.format(12), CALL.format(7), CALL.format(7), ANSWER.format(7)], 3),  # one call too many
    ],
)
def test_first_wrong_turn_on_hand_built_trees(turns: list[str], expected: int) -> None:
    tree = RolloutTree(Prompt("p", "Q", "7"))
    _chain(tree, turns, 0.0)
    assert path_contents(tree) == turns
    assert first_wrong_turn(path_contents(tree), ["12", "7"]) == expected
    # The late habit's failure: the reference's first call, then an answer where the reference calls again.
    assert is_premature(turns, expected, 1) == (expected == 2 and "Final Answer" in turns[1])
    assert not is_premature(turns, expected, None)


def test_final_answer_of_a_turn() -> None:
    assert final_answer(ANSWER.format(" 12 ")) == "12"
    assert final_answer(CALL.format(12)) is None


def test_depth_profile_and_acceptance() -> None:
    cfg = BenchTestbedsConfig(testbeds={"x": {"family": "math", "model_path": "m", "late": True}})
    assert depth_profile([2, 1, 2, 3]) == {1: 0.25, 2: 0.5, 3: 0.25}
    ok = summarize([1, 0, 0, 0, 1], [2, 2, 1], [0.1, 0.2], [0.4, 0.5, 0.9], True, cfg, premature=2)
    assert (
        ok["accuracy"] == 0.4
        and ok["failures_premature"] == pytest.approx(2 / 3)
        and ok["failures_turn2_or_later"] == pytest.approx(2 / 3)
    )
    assert ok["p_late_median"] == 0.5 and ok["p_direct_median"] == pytest.approx(0.15)
    assert ok["checks"] == {"accuracy": True, "failures_turn2_or_later": True, "p_late_median": True}
    assert ok["accepted"]
    early = summarize([1, 0, 0, 0, 1], [1, 1, 2], [], [0.2, 0.25, 0.9], True, cfg)
    assert early["checks"] == {"accuracy": True, "failures_turn2_or_later": False, "p_late_median": False}
    assert not early["accepted"]
    habit = summarize([0, 0, 0, 0, 1], [1, 1, 1, 1], [0.5], [], False, cfg)
    assert habit["checks"] == {"accuracy": True} and habit["depth_profile"] == {1: 1.0}
    assert not summarize([1, 1, 1], [], [], [], False, cfg)["accepted"]  # accuracy 1.0 is out of range


class FakeCharTokenizer:
    """One token per character (its code point)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_branch_probability_reads_the_first_token_where_the_turns_differ() -> None:
    import math

    seen: list[list[int]] = []

    def fake_score(ids: list[int]) -> list[list[float]]:
        seen.append(ids)
        row = [math.log(1e-9)] * 128
        row[ord("A")], row[ord("B")] = math.log(0.3), math.log(0.6)
        return [row] * len(ids)

    p = branch_probability(fake_score, FakeCharTokenizer(), ["Q: x\n", "obs\n"], "T: A1\n", "T: B2\n")
    assert p == pytest.approx(0.3)
    assert seen == [[ord(c) for c in "Q: x\nobs\nT: "]]  # the context, then the shared words of the two turns
    with pytest.raises(ValueError, match="do not differ"):
        branch_probability(fake_score, FakeCharTokenizer(), ["Q"], "same", "same")


def test_bench_testbeds_config_says_what_to_fix() -> None:
    with pytest.raises(ValueError, match="needs family"):
        BenchTestbedsConfig(testbeds={"x": {"family": "chess", "model_path": "m"}})
    with pytest.raises(ValueError, match="unknown testbeds"):
        BenchTestbedsConfig(testbeds={"x": {"family": "math", "model_path": "m"}}, only="y")
