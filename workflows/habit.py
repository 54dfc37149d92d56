"""Which training questions a habit phase answers without the tool: a fixed hash of the question's text, so the
choice is the same in every build and for every family (math and search bootstraps share it)."""

from __future__ import annotations

import hashlib


def question_answers_directly(question: str, fraction: float) -> bool:
    """Whether the habit-phase trace of ``question`` answers without the tool (a fixed hash of its text)."""
    h = int(hashlib.sha256(f"direct\x00{question}".encode()).hexdigest()[:8], 16) / 16**8
    return h < fraction
