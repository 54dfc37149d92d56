"""SQuAD-style answer scoring: normalisation, exact match and token F1 against one or more gold answers.

Normalisation (the SQuAD v1.1 evaluation script's recipe, rewritten here): lower-case, drop
punctuation, drop the articles a/an/the, collapse whitespace. EM is 1 when the normalised strings
are equal; F1 is the harmonic mean of token precision and recall. With several gold answers the
best score counts. Gold answers that are lists travel in ``Prompt.answer`` as a JSON list string
(see :func:`gold_answers`).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def gold_answers(answer: str | None) -> list[str]:
    """The gold answers stored in ``Prompt.answer``: a plain string, or a JSON list of strings."""
    if answer is None:
        return []
    if answer.startswith("[") and answer.endswith("]"):
        try:
            parsed = json.loads(answer)
        except json.JSONDecodeError:
            return [answer]
        if isinstance(parsed, list) and parsed:
            return [str(a) for a in parsed]
    return [answer]


def exact_match(gold: str, pred: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    """Token F1 of the normalised strings (0.0 when either is empty and they differ)."""
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not g or not p:
        return float(g == p)
    common = sum((Counter(g) & Counter(p)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_scores(answer: str | None, pred: str | None) -> dict[str, float]:
    """``{"em": ..., "f1": ...}``: the best over the gold answers (0 with no prediction or no gold)."""
    golds = gold_answers(answer)
    if pred is None or not golds:
        return {"em": 0.0, "f1": 0.0}
    return {"em": max(exact_match(g, pred) for g in golds), "f1": max(f1_score(g, pred) for g in golds)}
