"""The ``env.search`` section: questions, corpus, retrieval and reward of the search environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tracerl.schema import check, check_choices


@dataclass(frozen=True)
class SearchEnvConfig:
    """The search environment (envs/search): multi-hop QA with a BM25 ``search`` tool."""

    tasks: str = "generated"
    """'generated' (the built-in multi-hop world) or a question file (HotpotQA / 2Wiki JSON, Bamboogle CSV)."""
    corpus: str | None = None
    """A FlashRAG / Search-R1 JSONL corpus; needed with a question file (the generated world brings its own)."""
    num_tasks: int = 256
    """Training questions (generated: the training side of the split; file: the first N)."""
    eval_tasks: int = 200
    """Held-out questions for evaluation (never overlap training)."""
    task_seed: int = 0
    """Seed of the generated world and its questions."""
    top_k: int = 3
    """Passages a search returns."""
    reward: Literal["em", "f1"] = "f1"
    """'em' (exact match) or 'f1' (token F1 at or above f1_threshold counts as a success)."""
    f1_threshold: float = 0.3
    """F1 that counts as a success with reward=f1 (the paper uses 0.3)."""
    held_out_fraction: float = 0.2
    """Share of questions (by a stable hash of their text) on the held-out side; the rest are for training."""

    def __post_init__(self) -> None:
        check_choices(self, "env.search")
        check(
            self.num_tasks >= 1 and self.eval_tasks >= 1, "env.search.num_tasks and eval_tasks must be >= 1"
        )
        check(
            0.0 < self.held_out_fraction < 1.0,
            f"env.search.held_out_fraction must be in (0, 1) (got {self.held_out_fraction})",
        )
        check(
            self.tasks == "generated" or bool(self.corpus),
            f"env.search.tasks={self.tasks!r} is a question file: set env.search.corpus to a FlashRAG/Search-R1 "
            "JSONL corpus (the generated world brings its own)",
        )
        check(self.top_k >= 1, f"env.search.top_k must be >= 1 (got {self.top_k})")
        check(
            0.0 <= self.f1_threshold <= 1.0,
            f"env.search.f1_threshold must be in [0, 1] (got {self.f1_threshold})",
        )
