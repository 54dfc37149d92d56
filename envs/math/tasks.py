"""A built-in, generated family of math tasks that need the Python tool, graded from easy to hard.

Levels (larger numbers and more steps as they rise; distractor facts from level 3):

1. one operation of two 2-3 digit numbers (1 tool call);
2. two operations on three numbers (1 tool call);
3. a word problem with a distractor fact (2 tool calls);
4. a linear equation a x + b = c with an integer root (1 tool call, then reasoning);
5. a chain of three definitions ending in a remainder (3 tool calls), with a distractor.

Every task carries its reference solution as ReAct steps (thought, code, the output the code
prints) and a final thought, from which supervised traces are rendered. Generation is a pure
function of (seed, index); :func:`generate` deduplicates by question text and
:func:`split` assigns train / held-out by a hash of the question, so the held-out set never
overlaps training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEVELS = (1, 2, 3, 4, 5)
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_ITEMS = ["apples", "books", "coins", "bolts", "tickets", "stamps", "marbles", "bottles"]
_PLACES = ["warehouse", "library", "shop", "factory", "school", "museum"]


@dataclass(frozen=True)
class Step:
    """One tool-using turn of a reference solution."""

    thought: str
    code: str
    output: str


@dataclass(frozen=True)
class MathTask:
    task_id: str
    question: str
    answer: str
    level: int
    steps: tuple[Step, ...]
    final_thought: str


def _num(rng: np.random.Generator, level: int) -> int:
    lo, hi = {1: (10, 100), 2: (10, 500), 3: (10, 1000), 4: (2, 60), 5: (100, 5000)}[level]
    return int(rng.integers(lo, hi))


def _level1(rng: np.random.Generator) -> tuple[str, str, list[Step], str]:
    a, b, op = _num(rng, 1), _num(rng, 1), str(rng.choice(list(_OPS)))
    r = _OPS[op](a, b)
    code = f"print({a} {op} {b})"
    return (
        f"What is {a} {op} {b}?",
        str(r),
        [Step(f"I will compute {a} {op} {b} with Python.", code, str(r))],
        f"The result is {r}.",
    )


def _level2(rng: np.random.Generator) -> tuple[str, str, list[Step], str]:
    a, b, c = (_num(rng, 2) for _ in range(3))
    o1, o2 = (str(rng.choice(list(_OPS))) for _ in range(2))
    r = _OPS[o2](_OPS[o1](a, b), c)
    expr = f"({a} {o1} {b}) {o2} {c}"
    return (
        f"Compute {expr}.",
        str(r),
        [Step("I will evaluate the expression with Python.", f"print({expr})", str(r))],
        f"The value is {r}.",
    )


def _level3(rng: np.random.Generator) -> tuple[str, str, list[Step], str]:
    boxes, per, out = int(rng.integers(12, 90)), int(rng.integers(6, 40)), 0
    total = boxes * per
    out = int(rng.integers(1, total))
    item, place = str(rng.choice(_ITEMS)), str(rng.choice(_PLACES))
    workers = int(rng.integers(3, 60))
    q = (
        f"A {place} has {boxes} boxes with {per} {item} in each box. It has {workers} workers. "
        f"Then {out} {item} are given away. How many {item} are left?"
    )
    steps = [
        Step(f"First I find how many {item} there are in total.", f"print({boxes} * {per})", str(total)),
        Step(
            f"Now I subtract the {out} {item} given away; the workers do not matter.",
            f"print({total} - {out})",
            str(total - out),
        ),
    ]
    return q, str(total - out), steps, f"There are {total - out} {item} left."


def _level4(rng: np.random.Generator) -> tuple[str, str, list[Step], str]:
    a, x = _num(rng, 4), int(rng.integers(-40, 90))
    b = int(rng.integers(-300, 300))
    c = a * x + b
    q = f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {c}."
    step = Step(f"x = ({c} - ({b})) / {a}, which I compute exactly.", f"print(({c} - ({b})) // {a})", str(x))
    return q, str(x), [step], f"So x = {x}."


def _level5(rng: np.random.Generator) -> tuple[str, str, list[Step], str]:
    a, b, c, m = _num(rng, 5), int(rng.integers(11, 99)), _num(rng, 5), int(rng.integers(7, 97))
    p = a * b
    d = p - c
    r = d % m
    noise = int(rng.integers(100, 999))
    q = f"Let p = {a} * {b} and d = p - {c}. The number {noise} is unrelated. What is the remainder of d divided by {m}?"
    steps = [
        Step("First I compute p.", f"print({a} * {b})", str(p)),
        Step("Next d = p - c.", f"print({p} - {c})", str(d)),
        Step(f"Finally the remainder of d divided by {m}.", f"print({d} % {m})", str(r)),
    ]
    return q, str(r), steps, f"The remainder is {r}."


_MAKERS: dict[int, Callable[[np.random.Generator], tuple[str, str, list[Step], str]]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
    5: _level5,
}


def make_task(seed: int, index: int, level: int | None = None) -> MathTask:
    """The task (seed, index); its level cycles 1..5 unless given."""
    rng = np.random.default_rng([seed, index])
    level = level or LEVELS[index % len(LEVELS)]
    q, a, steps, final = _MAKERS[level](rng)
    tid = "gen-" + hashlib.sha1(q.encode()).hexdigest()[:12]
    return MathTask(tid, q, a, level, tuple(steps), final)


def is_held_out(task: MathTask, held_out_fraction: float = 0.2) -> bool:
    """Stable train / held-out assignment by a hash of the question (never both)."""
    h = int(hashlib.sha1(("split:" + task.question).encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < held_out_fraction


def generate(
    n: int, seed: int = 0, held_out: bool | None = None, levels: tuple[int, ...] = LEVELS
) -> list[MathTask]:
    """``n`` distinct tasks (by question), cycling levels, optionally only one side of the split."""
    out: list[MathTask] = []
    seen: set[str] = set()
    index = 0
    while len(out) < n:
        task = make_task(seed, index, levels[index % len(levels)])
        index += 1
        if task.question in seen or (held_out is not None and is_held_out(task) != held_out):
            continue
        seen.add(task.question)
        out.append(task)
        if index > 50 * n + 1000:
            raise ValueError(f"could not generate {n} distinct tasks; lower n or widen the levels")
    return out
