"""BFCL v4 multi-turn tasks from the ``bfcl-eval`` package: loading, tool specs, the seeded train/test split.

The package is imported lazily (``import_bfcl``): only the BFCL environment and its tests need it. Its
``bfcl_eval.constants.model_config`` imports every vendor SDK to build a model table the checkers never use
for multi-turn scoring, so a stand-in module with an empty table is installed before the first import.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.engine.react import ToolSpec

CATEGORIES: dict[str, str] = {
    "base": "multi_turn_base",
    "miss_func": "multi_turn_miss_func",
    "miss_param": "multi_turn_miss_param",
    "long_context": "multi_turn_long_context",
}
"""Config name -> BFCL v4 category (data file ``BFCL_v4_<category>.json``)."""

INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0"
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""BFCL's user message at a turn that adds held-out functions (miss_func)."""


def import_bfcl() -> types.ModuleType:
    """The ``bfcl_eval`` package, with its vendor-SDK model table replaced by an empty stand-in.

    Raises:
        ImportError: bfcl-eval is not installed (the message says how to install it).
    """
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.__dict__["MODEL_CONFIG_MAPPING"] = {}
        sys.modules[name] = stub
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as exc:
        raise ImportError(
            f"the BFCL environment needs the bfcl-eval package: {INSTALL_HINT} ({exc})"
        ) from exc


@dataclass(frozen=True)
class BfclTask:
    """One multi-turn task: user turns, the API backends' initial state, functions and ground truth."""

    task_id: str
    category: str
    """Config name of the category (base, miss_func, miss_param, long_context)."""
    user_turns: tuple[str, ...]
    """The user's message at each turn ('' at a turn that only adds held-out functions)."""
    entry: Mapping[str, Any]
    """The raw BFCL entry (id, initial_config, involved_classes, ...), as the checker reads it."""
    functions: tuple[str, ...]
    """Functions available from the first turn."""
    added: Mapping[int, tuple[str, ...]]
    """Held-out functions added at a turn (miss_func)."""
    ground_truth: tuple[tuple[str, ...], ...]
    """Per user turn, the reference calls (python-style strings)."""

    @property
    def long_context(self) -> bool:
        """Whether the backends load their long-context scenario."""
        return "long_context" in self.entry["id"]

    def functions_at(self, turn: int) -> tuple[str, ...]:
        """Functions available at user turn ``turn``."""
        extra = [f for t, names in sorted(self.added.items()) if t <= turn for f in names]
        return (*self.functions, *extra)


def _data_dir() -> Path:
    return Path(str(import_bfcl().__file__)).parent / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@cache
def function_docs() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every multi-turn function: name -> (backend class, BFCL doc)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    docs: dict[str, tuple[str, dict[str, Any]]] = {}
    for cls, file in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items():
        if cls.startswith(("MemoryAPI", "WebSearch")):  # other BFCL suites (need faiss, network)
            continue
        for doc in _read_jsonl(_data_dir() / "multi_turn_func_doc" / file):
            docs.setdefault(doc["name"], (cls, doc))
    return docs


def _class_functions(classes: Sequence[str]) -> list[str]:
    return [name for name, (cls, _) in function_docs().items() if cls in classes]


@cache
def load_tasks(category: str) -> tuple[BfclTask, ...]:
    """Every task of one category (config name), in file order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from {', '.join(CATEGORIES)}")
    bfcl = CATEGORIES[category]
    entries = _read_jsonl(_data_dir() / f"BFCL_v4_{bfcl}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in _read_jsonl(_data_dir() / "possible_answer" / f"BFCL_v4_{bfcl}.json")
    }
    tasks = []
    for e in entries:
        missed = {int(t): tuple(names) for t, names in e.get("missed_function", {}).items()}
        held = {n for names in missed.values() for n in names}
        turns = tuple(
            " ".join(m["content"] for m in msgs if m.get("role") == "user") for msgs in e["question"]
        )
        entry = {k: v for k, v in e.items() if k != "question"}
        tasks.append(
            BfclTask(
                e["id"],
                category,
                turns,
                entry,
                tuple(f for f in _class_functions(e["involved_classes"]) if f not in held),
                missed,
                tuple(tuple(t) for t in answers[e["id"]]),
            )
        )
    return tuple(tasks)


def split(
    tasks: Sequence[BfclTask], seed: int, test_fraction: float
) -> tuple[list[BfclTask], list[BfclTask]]:
    """A seeded train/test split of each category (the same seed always gives the same disjoint halves).

    Returns:
        (train, test), each in a seeded shuffled order.
    """
    train: list[BfclTask] = []
    test: list[BfclTask] = []
    for category in sorted({t.category for t in tasks}):
        group = sorted((t for t in tasks if t.category == category), key=lambda t: t.task_id)
        salt = sum(category.encode())  # categories shuffle independently
        order = np.random.default_rng([seed, salt]).permutation(len(group))
        n_test = int(round(test_fraction * len(group)))
        test += [group[i] for i in order[:n_test]]
        train += [group[i] for i in order[n_test:]]
    return train, test


def _schema(spec: Any) -> Any:
    """BFCL's parameter types as JSON schema (dict -> object, float -> number, tuple -> array, any -> untyped)."""
    if isinstance(spec, list):
        return [_schema(s) for s in spec]
    if not isinstance(spec, dict):
        return spec
    out = {k: _schema(v) for k, v in spec.items()}
    t = spec.get("type")
    if t in ("dict", "float", "tuple", "any"):
        mapped = {"dict": "object", "float": "number", "tuple": "array"}.get(t)
        if mapped is None:
            out.pop("type")
        else:
            out["type"] = mapped
    return out


def _strip_descriptions(spec: Any) -> Any:
    if isinstance(spec, list):
        return [_strip_descriptions(s) for s in spec]
    if not isinstance(spec, dict):
        return spec
    return {k: _strip_descriptions(v) for k, v in spec.items() if k != "description"}


DOC_STYLES = ("full", "brief")


@cache
def tool_spec(name: str, docs: str = "full") -> ToolSpec:
    """The tool spec of one multi-turn function: the documented schema, parameters in the backend's
    signature order (so positional arguments bind as in Python), required ones from the doc.

    ``docs='brief'`` keeps the function's own sentence (without the API's shared preamble) and the parameter
    names and types, without parameter descriptions: about a third of the tokens, for small context windows.
    """
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    if docs not in DOC_STYLES:
        raise ValueError(f"docs must be one of {', '.join(DOC_STYLES)} (got {docs!r})")
    cls, doc = function_docs()[name]
    backend = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)
    params = tuple(p for p in inspect.signature(getattr(backend, name)).parameters if p != "self")
    schema = _schema(doc["parameters"])
    description = doc["description"]
    if docs == "brief":
        schema = _strip_descriptions(schema)
        description = description.split("Tool description: ")[-1]
    return ToolSpec(name, description, params, tuple(doc["parameters"].get("required", [])), schema=schema)
