"""Config schemas of ``bootstrap`` (the schemas of a room's commands live in its ``config.py``; the
platform holds only what the engine and the training step read: ``tracerl.config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tracerl.config import LMFields
from tracerl.schema import check, check_choices


@dataclass(frozen=True)
class BootstrapConfig:
    """``tracerl bootstrap``: build the tiny policy (tokenizer + small LM, supervised warm start)."""

    family: Literal["math", "search"] = "math"
    """Task family the policy is built for: 'math' (generated math tasks, Python tool) or 'search' (the generated
    multi-hop world, search tool; its world is the one of env.search.task_seed = seed)."""
    out_dir: str = "models/tiny-math"
    """Where the HF checkpoint directory goes."""
    seed: int = 0
    """Seeds tasks, initialisation and training (search: also the generated world)."""
    train_tasks: int = 6000
    """Generated training tasks (deduplicated, disjoint from the held-out split)."""
    eval_tasks: int = 200
    """Held-out generated tasks for pass@1."""
    vocab_size: int = 1024
    """BPE vocabulary size."""
    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 6
    intermediate_size: int = 512
    max_positions: int = 1024
    steps: int = 750
    """Optimiser steps (the schedule's length); fixed, so the policy is reproducible from the seed."""
    batch_size: int = 32
    lr: float = 3e-3
    time_budget_s: float | None = 900.0
    """Safety cap: stop training after this many seconds even if steps remain (then the result depends on speed);
    null: no cap (the recipe always runs its fixed number of steps)."""
    habit_steps: int = 0
    """Steps of a second supervised phase on traces where direct_answer_fraction of the answers come without the
    tool (the habit of answering from memory that RL then unlearns); 0 skips it."""
    habit_lr: float = 1e-3
    """Peak learning rate of the habit phase."""
    direct_answer_fraction: float = 0.0
    """Share of the habit phase's traces that answer at once without calling the tool (chosen by a hash of the
    question)."""
    late_answer_fraction: float = 0.0
    """Share of the habit phase's multi-step traces (math: two or more tool calls; search: three or more hops) that
    answer prematurely after an earlier step (math: the first tool output; search: the entity of the penultimate
    hop) instead of finishing, chosen by a hash of the question: the -late testbeds (workflows/bootstrap/habit.py)."""
    init_from: str | None = None
    """A tiny-policy checkpoint directory to start from (its tokenizer and weights) instead of building and
    supervised-training a new one: only the habit phase and the evaluation run (e.g. models/tiny-search, itself
    rebuilt from its seed by its own config)."""
    query_space: bool = False
    """search family: the traces write each query with a leading space (``search[ Name]``; the parser strips it), so
    a name is the same tokens in the query as in the question and the passages (byte-level BPE tokenizes ``" Name"``
    and ``"Name"`` differently, and a tiny model then slips when it copies the name into the query)."""
    eval_temperature: float = 1.0
    """Sampling temperature for sampled pass@1 (greedy accuracy is reported too)."""
    force: bool = False
    """Rebuild even if out_dir already holds a checkpoint."""
    top_k: int = 3
    """search family: passages per search in the rendered traces and the evaluation (match env.search.top_k)."""

    def __post_init__(self) -> None:
        check_choices(self, "")
        check(self.top_k >= 1, f"top_k must be >= 1 (got {self.top_k})")
        check(
            self.train_tasks >= 10 and self.eval_tasks >= 1,
            "bootstrap needs train_tasks >= 10 and eval_tasks >= 1",
        )
        check(self.hidden_size % self.num_heads == 0, "hidden_size must be a multiple of num_heads")
        check(
            self.steps >= 1 and self.batch_size >= 1 and self.lr > 0,
            "steps, batch_size and lr must be positive",
        )
        check(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s must be > 0 or null")
        check(self.habit_steps >= 0 and self.habit_lr > 0, "habit_steps must be >= 0 and habit_lr > 0")
        check(
            self.init_from is None or self.habit_steps > 0,
            "init_from re-uses a trained checkpoint: set habit_steps > 0 (otherwise there is nothing to train)",
        )
        check(
            0.0 <= self.direct_answer_fraction <= 1.0,
            f"direct_answer_fraction must be in [0, 1] (got {self.direct_answer_fraction})",
        )
        check(
            0.0 <= self.late_answer_fraction <= 1.0,
            f"late_answer_fraction must be in [0, 1] (got {self.late_answer_fraction})",
        )


@dataclass(frozen=True)
class SFTConfig(LMFields):
    """``tracerl sft``: warm-start a pretrained chat model on the environment's reference traces, rendered in the
    model's own chat template with ``model.template`` and ``model.system_prompt`` (the settings RL then runs with).

    ``model.path`` is where the warm-started checkpoint is written; ``init_from`` is the pretrained checkpoint."""

    init_from: str = "models/smollm2-135m-instruct"
    """The pretrained HF checkpoint directory to start from (``make smollm2`` writes SmolLM2-135M-Instruct here)."""
    seed: int = 0
    """Seeds the batch order (the traces are the environment's training tasks, env.math.num_tasks)."""
    steps: int = 60
    """Optimiser steps (AdamW, warm-up-stable-decay schedule)."""
    batch_size: int = 8
    lr: float = 5e-5
    """Peak learning rate."""
    max_tokens: int = 1024
    """A trace longer than this is cut (its tail gets no loss)."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward (less memory, about a third more compute)."""
    force: bool = False
    """Overwrite ``model.path`` if it already holds a checkpoint."""

    def __post_init__(self) -> None:
        check(
            self.steps >= 1 and self.batch_size >= 1 and self.lr > 0,
            "steps, batch_size and lr must be positive",
        )
        check(self.max_tokens >= 16, f"max_tokens must be >= 16 (got {self.max_tokens})")
        check(
            self.model.template == "chat",
            f"tracerl sft renders traces in the model's chat template: set model.template=chat (got "
            f"{self.model.template!r})",
        )
