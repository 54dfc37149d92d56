"""The graded answer is the final answer the policy states (docs/method.md, "The graded answer"), never an expression
found in text that restates the question: math through ``is_correct``, search through ``stated_answer`` and
``qa_scores`` as ``SearchEnv.scores`` applies them."""

from __future__ import annotations

import pytest

from tracerl.envs.math.reward import graded_answer, is_correct
from tracerl.envs.search.reward import qa_scores
from tracerl.grading import stated_answer


@pytest.mark.parametrize(
    ("gold", "text", "correct"),
    [
        # The cases of issue 41 (SmolLM2 restating the question was graded correct, stating the answer wrong).
        ("19", "86 - 67", False),
        ("128", "The answer to the question of 80 + 48 is 244.", False),
        ("22", "44 - 22 is 22.", True),
        # A restated computation is not an answer, boxed or after a marker; the number a sentence ends on is.
        ("19", r"\boxed{86 - 67}", False),
        ("19", "Final Answer: 86-67", False),
        ("7", "3 + 4", False),
        ("5", "8-3", False),
        ("336", "6 * 56", False),
        ("19", "So 86 - 67 = 19.", True),
        ("128", "80 + 48 = 128", True),
        ("128", "What is 80 + 48? Let me think.", False),
        ("-5", "The result is -5.", True),
        ("42", "The final answer is 42 apples.", True),
        ("42", "Final Answer: 42", True),
        ("1234", "In total there are 1,234 coins.", True),
        # Values stay values: fractions, LaTeX, a boxed answer after restated working.
        ("3/4", "3/4", True),
        (r"\frac{3}{4}", r"The ratio is 6/8, so \boxed{\frac{3}{4}}", True),
        (r"2\sqrt{3}", r"\boxed{2\sqrt{3}}", True),
        ("19", r"86 - 67 = \boxed{19}", True),
        ("19", r"\boxed{19} (since 86 - 67 = 19, check: 67 + 19 = 86)", True),
        ("86", r"\boxed{19} (since 67 + 19 = 86)", False),
    ],
)
def test_math_grades_the_answer_the_policy_states(gold: str, text: str, correct: bool) -> None:
    assert is_correct(gold, text) is correct, graded_answer(text)


@pytest.mark.parametrize(
    ("text", "stated"),
    [
        (r"so \boxed{12} and later \boxed{13}", "13"),
        ("Thought: easy\nFinal Answer: Paris\nmore text", "Paris"),
        ("Who wrote it? The answer is Ada Vale.", "Ada Vale."),
        ("The final answer is: Tarn", "Tarn"),
        ("  Tarn  ", "Tarn"),
    ],
)
def test_stated_answer_takes_the_last_box_then_the_last_marker_then_the_text(text: str, stated: str) -> None:
    assert stated_answer(text) == stated


@pytest.mark.parametrize(
    ("gold", "text", "em"),
    [
        ("Ada Vale", "Who wrote The Long Tide? The answer is Ada Vale.", 1.0),
        ("Ada Vale", r"\boxed{Ada Vale}", 1.0),
        ("Ada Vale", "Final Answer: Ada Vale", 1.0),
        # A restated question earns nothing, and a box decides over names mentioned before it.
        ("Ada Vale", "Who wrote The Long Tide, Ada Vale or Tom Reed? \\boxed{Tom Reed}", 0.0),
        ("Tarn", "The capital of Veloria is asked. The answer is Osk.", 0.0),
    ],
)
def test_search_scores_the_answer_the_policy_states(gold: str, text: str, em: float) -> None:
    assert qa_scores(gold, stated_answer(text))["em"] == em
