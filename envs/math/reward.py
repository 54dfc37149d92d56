"""Answer extraction and verification with math-verify (exact-match fast path first).

math-verify (``verify(gold, pred)``) raises outside the main thread unless its own timeouts are off,
so they are off here (``parsing_timeout=None``, ``timeout_seconds=None``); the caller bounds time
(environment actors run one episode step at a time and the answers are short).
"""

from __future__ import annotations

import logging
import re

# Its "timeout is disabled" warning is expected here: we disable them on purpose (see above).
for _name in ("math_verify", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def normalize(ans: str) -> str:
    """Strip whitespace, a trailing period, thousands separators and $...$."""
    s = ans.strip().strip("$").strip().rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    return s


def extract_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in ``text``."""
    found = _BOXED.findall(text)
    return found[-1] if found else None


def is_correct(gold: str, pred: str | None) -> bool:
    """True if ``pred`` is mathematically equal to ``gold`` (exact match, then math-verify)."""
    if pred is None or not pred.strip():
        return False
    g, p = normalize(gold), normalize(pred)
    if g == p:
        return True
    try:
        from math_verify import parse, verify

        gold_parsed = parse(f"${g}$", parsing_timeout=None)
        pred_parsed = parse(f"${p}$", parsing_timeout=None) or parse(p, parsing_timeout=None)
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a verifier crash on model text is a wrong answer, not a dead worker
        return False
