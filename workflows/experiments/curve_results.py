"""The learning-curve report's results, typed until curves.json is written (``as_json``): per testbed
(``TestbedStats``) per allocator (``AllocatorStats``) its curve against grpo's in tokens and in CPU seconds
(``CurveVerdict``), its final-accuracy difference and sigmoid fit (``Fit``); the Monte-Carlo headroom
(``Headroom``); the config's hypotheses (``Hypothesis``). Computed by workflows/experiments/curves_report.py, written by
workflows/experiments/curves_doc.py. An undefined or infinite bound (never reached) is NaN or inf here, None in JSON."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.workflows.study.bootstrap import Interval


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float as None (strict JSON; None: never reached or not measured)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # a numpy scalar
        return finite(obj.item())
    return obj


def as_json(obj: Any) -> Any:
    """A result as JSON: a dataclass as a dict of its fields in order, an ``Interval`` by its ``to_json``, a
    ``TestbedStats`` by its own; non-finite floats as None."""
    if isinstance(obj, (Interval, TestbedStats)):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): as_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_json(v) for v in obj]
    return finite(obj)


@dataclass(frozen=True)
class CurveVerdict:
    """An allocator's curve against a baseline's on one compute axis, and the decision rule's verdict."""

    ratio: Interval
    """Tokens (or CPU seconds) to the target over the baseline's."""
    auc_difference: Interval
    tokens_to_target: Interval
    vs_tokens_to_target: Interval
    auc: Interval
    reached: float
    paired: bool
    verdict: str
    """'win', 'loss', 'tie' or 'n/a' (no target, or no bound)."""

    @property
    def only_it_reaches(self) -> bool:
        """Whether the ratio is 0 only because the baseline's mean curve never reaches the target."""
        return not math.isfinite(self.vs_tokens_to_target.estimate) and math.isfinite(
            self.tokens_to_target.estimate
        )


@dataclass(frozen=True)
class Fit:
    """ScaleRL's sigmoid fitted to an allocator's mean curve (NaN: not fitted), and why it is poor if it is."""

    asymptote: float
    midpoint: float
    exponent: float
    r2: float
    rmse: float
    identified: bool
    poor: bool
    why_poor: str


@dataclass(frozen=True)
class AllocatorStats:
    """One allocator on one testbed."""

    seeds: int
    final_accuracy: float | None
    final_std: float | None
    tokens: CurveVerdict | None
    """Against grpo in generated tokens (None: no seed paired with grpo's)."""
    cpu_s: CurveVerdict | None
    final_difference: Interval | None
    """Final full-set accuracy minus grpo's (None for grpo, or with no paired task)."""
    fit: Fit
    mean_cpu_s: float


@dataclass(frozen=True)
class Headroom:
    """The Monte-Carlo ceiling (trace_mc*) against trace."""

    tokens: CurveVerdict | None
    cpu_s: CurveVerdict | None
    final_difference: Interval | None


@dataclass(frozen=True)
class TestbedStats:
    """One testbed's statistics. Without a finished grpo cell there is no target: only ``note`` is set."""

    __test__ = False  # not a pytest test class, whatever its name

    budget_tokens: float
    allocators: dict[str, AllocatorStats] = field(default_factory=dict)
    """grpo first, then by name."""
    headroom: Headroom | None = None
    start: float | None = None
    grpo_final: float | None = None
    target: float | None = None
    ceiling: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "budget_tokens": self.budget_tokens,
            "allocators": as_json(self.allocators),
            "headroom": as_json(self.headroom),
        }
        if self.target is None:
            return out | ({"note": self.note} if self.note else {})
        assert self.start is not None and self.grpo_final is not None
        out |= {
            "start": self.start,
            "grpo_final": self.grpo_final,
            "target": self.target,
            "grpo_gain": self.grpo_final - self.start,
        }
        return (
            out
            | ({"ceiling": self.ceiling} if self.ceiling else {})
            | ({"note": self.note} if self.note else {})
        )


@dataclass(frozen=True)
class Hypothesis:
    """A hypothesis of the config checked testbed by testbed: 'held', 'failed', 'partly held', 'not decided' or
    'not measured'."""

    claim: str
    """As the config states it."""
    allocator: str
    vs: str
    expect: str
    """The verdict the claim expects of ``allocator`` against ``vs``."""
    state: str
    cases: Sequence[HypothesisCase]


@dataclass(frozen=True)
class HypothesisCase:
    """One testbed of a hypothesis: the decision rule's verdict and the ratio it was read off."""

    testbed: str
    """One of the testbeds the hypothesis names."""
    verdict: str
    """'win', 'loss', 'tie' or 'n/a'."""
    ratio: Interval


__all__ = [
    "AllocatorStats",
    "CurveVerdict",
    "Fit",
    "Headroom",
    "Hypothesis",
    "HypothesisCase",
    "TestbedStats",
    "as_json",
    "finite",
]
