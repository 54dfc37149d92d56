"""The cells of a ``tracerl study`` grid: their coordinates, the ``--only`` selection, and the plan of which to run,
resume or skip from the study's child runs."""

from __future__ import annotations

import dataclasses

from tracerl.workflows.study.config import StudyConfig

COORDS = ("testbed", "budget", "allocator", "seed")
TAG = "tracerl.study"


@dataclasses.dataclass(frozen=True)
class Cell:
    testbed: str
    budget: str
    allocator: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.testbed}/{self.budget}/{self.allocator}/s{self.seed}"

    def tags(self) -> dict[str, str]:
        return {f"{TAG}.{k}": str(getattr(self, k)) for k in COORDS}


def enumerate_cells(cfg: StudyConfig) -> list[Cell]:
    """Every cell of the grid groups, in config order, each once."""
    seen: dict[str, Cell] = {}
    for g in cfg.groups:
        for tb in g["testbeds"]:
            for b in g["budgets"]:
                for a in g["allocators"]:
                    for s in g["seeds"]:
                        c = Cell(str(tb), str(b), str(a), int(s))
                        seen.setdefault(c.key, c)
    return list(seen.values())


def parse_only(only: str | None) -> dict[str, set[str]]:
    """'testbed=a,allocator=grpo,allocator=trace' -> {testbed: {a}, allocator: {grpo, trace}}."""
    out: dict[str, set[str]] = {}
    for item in (only or "").split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or k not in COORDS or not v.strip():
            raise ValueError(
                f"--only takes k=v items with k one of {', '.join(COORDS)} (got {item!r}), "
                "e.g. --only testbed=math-habit,allocator=grpo"
            )
        out.setdefault(k, set()).add(v.strip())
    return out


def select(cells: list[Cell], only: str | None) -> list[Cell]:
    """The cells matching every key of ``only`` (any of its values per key)."""
    want = parse_only(only)
    picked = [c for c in cells if all(str(getattr(c, k)) in vs for k, vs in want.items())]
    if want and not picked:
        raise ValueError(f"--only {only} selects no cell of the grid")
    return picked


@dataclasses.dataclass(frozen=True)
class Child:
    """A cell's earlier child run, as read from MLflow."""

    run_id: str
    status: str
    resumable: bool  # its storage holds a saved config: train can resume it
    start_time: int = 0


def plan(
    cells: list[Cell], children: dict[str, list[Child]], fresh: bool
) -> tuple[list[tuple[Cell, str | None]], list[Cell]]:
    """(to run with the run id to resume or None, skipped): a FINISHED cell is skipped unless ``fresh``; the newest
    unfinished resumable run of a cell is resumed."""
    todo: list[tuple[Cell, str | None]] = []
    skipped: list[Cell] = []
    for c in cells:
        runs = sorted(children.get(c.key, []), key=lambda r: r.start_time, reverse=True)
        if fresh:
            todo.append((c, None))
        elif any(r.status == "FINISHED" for r in runs):
            skipped.append(c)
        else:
            cut = next((r for r in runs if r.resumable), None)
            todo.append((c, cut.run_id if cut else None))
    return todo, skipped
