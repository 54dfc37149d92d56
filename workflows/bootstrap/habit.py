"""The habits a bootstrap's habit phase teaches, chosen per training question by a fixed hash of its text, so the
choice is the same in every build and for every family (math and search bootstraps share it):

- *direct* (the -habit testbeds): answer at once, without the tool; the decisive choice is at turn 1;
- *late* (the -late testbeds): on questions that need several steps, call the tool as the reference does, then
  answer prematurely with an intermediate result (a common agent failure); the decisive choice sits mid-trajectory,
  where branching from a later turn's prefix can resample it.
"""

from __future__ import annotations

import hashlib

from tracerl.models.tiny import Segment


def _unit_hash(salt: str, question: str) -> float:
    return int(hashlib.sha256(f"{salt}\x00{question}".encode()).hexdigest()[:8], 16) / 16**8


def question_answers_directly(question: str, fraction: float) -> bool:
    """Whether the habit-phase trace of ``question`` answers without the tool (a fixed hash of its text)."""
    return _unit_hash("direct", question) < fraction


def question_answers_late(question: str, fraction: float) -> bool:
    """Whether the habit-phase trace of a multi-step ``question`` answers prematurely (a fixed hash of its text,
    independent of :func:`question_answers_directly`'s)."""
    return _unit_hash("late", question) < fraction


def premature_segments(reference: list[Segment], steps: int, answer_turn: str) -> list[Segment]:
    """The reference trace cut after its first ``steps`` tool turns (and their observations), then ``answer_turn``.

    ``reference`` is a rendered reference solution: the prompt, then (tool turn, observation) pairs, then the answer
    turn, as ``trace_segments`` and ``search_trace_segments`` build it.
    """
    tool_turns = (len(reference) - 2) // 2
    if not 1 <= steps < tool_turns:
        raise ValueError(
            f"a premature answer comes after 1 to {tool_turns - 1} of the {tool_turns} tool turns (got {steps})"
        )
    return [*reference[: 1 + 2 * steps], Segment(answer_turn, True)]
