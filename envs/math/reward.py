"""Answer extraction and verification: an exact-match fast path in process, then math-verify in a grading worker.

math-verify (``verify(gold, pred)``) raises outside the main thread unless its own timeouts are off, so they are off
here (``parsing_timeout=None``, ``timeout_seconds=None``). Time is bounded from outside instead: with a
``tracerl.grading.Grader`` the math-verify step runs in a worker process that is killed past its wall-clock limit
(sympy spent over 40 s on the 17-character answer ``9^{9^{9^{9^9}}}``), and the call raises ``GradeTimeout``.
"""

from __future__ import annotations

import logging
import re

from tracerl.grading import GradeError, Grader, stated_answer

# Its "timeout is disabled" warning is expected here: we disable them on purpose (see above).
for _name in ("math_verify", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
PRELOAD = ("tracerl.envs.math.reward:warm_up",)
"""What a math grading worker runs before it counts as started (imports and math-verify's lazy set-up)."""


def normalize(ans: str) -> str:
    """Strip whitespace, a trailing period, thousands separators and $...$."""
    s = ans.strip().strip("$").strip().rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    return s


_NUMBER = re.compile(r"(?:(?<![\w.)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?")
_COMPUTATION = re.compile(r"[-+]?\s*\d+(?:\.\d+)?(?:\s*[-+*×xX÷]\s*-?\d+(?:\.\d+)?)+")
"""Numbers joined by +, -, *, x or ÷ (not /: ``3/4`` is a value): a restated computation, not an answer."""
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_WORDS = {
    "sqrt",
    "pi",
    "frac",
    "dfrac",
    "tfrac",
    "log",
    "ln",
    "sin",
    "cos",
    "tan",
    "infty",
    "inf",
    "mod",
}


def graded_answer(pred: str) -> str:
    """The answer a math turn states (docs/method.md, "The graded answer"): ``stated_answer`` (the last
    ``\\boxed{}``, else the text after the last final-answer marker, else the whole text), normalised; when that is
    a restated computation (``86 - 67``) or has words in it (``44 - 22 is 22.``), the number it ends on."""
    s = normalize(stated_answer(pred))
    words = [w for w in _WORD.findall(s) if w.lower() not in _MATH_WORDS]
    if _COMPUTATION.fullmatch(s) or words:
        numbers = _NUMBER.findall(s)
        return numbers[-1].replace(",", "") if numbers else s
    return s


def extract_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in ``text``."""
    found = _BOXED.findall(text)
    return found[-1] if found else None


def verify_equal(gold: str, pred: str) -> bool:
    """math-verify's verdict on two normalised answers (unbounded time: run it in a grading worker)."""
    try:
        from math_verify import parse, verify

        gold_parsed = parse(f"${gold}$", parsing_timeout=None)
        pred_parsed = parse(f"${pred}$", parsing_timeout=None) or parse(pred, parsing_timeout=None)
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a verifier crash on model text is a wrong answer, not a dead worker
        return False


def warm_up() -> None:
    """Import math-verify and run one verification, so a worker's first grade does not pay for the set-up (0.6 s)."""
    verify_equal("1/2", "0.5")


def is_correct(gold: str, pred: str | None, grader: Grader | None = None) -> bool:
    """True if the answer ``pred`` states (``graded_answer``) is mathematically equal to ``gold`` (exact match here,
    then math-verify).

    With ``grader``, math-verify runs in its worker under its time limit; without, in this process, unbounded.

    Raises:
        GradeTimeout: math-verify ran past the grader's limit.
    """
    if pred is None or not pred.strip():
        return False
    g, p = normalize(gold), graded_answer(pred)
    if not p:
        return False
    if g == p:
        return True
    if grader is None:
        return verify_equal(g, p)
    try:
        return bool(grader(verify_equal, g, p))
    except GradeError:  # the worker ran out of memory or died on this answer: a wrong answer
        return False
