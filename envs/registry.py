"""The environment registry (name -> environment class) and the interface a tool environment offers to workflows.

A ReAct tool environment class (see ``tracerl.engine.protocol.ToolEnv`` for the per-episode part) also offers:

- ``from_config(env_cfg) -> env``: one instance from its config section (called in every environment actor);
- ``prompts(env_cfg, held_out) -> list[Prompt]``: the training prompts, or the held-out evaluation prompts
  (never overlapping training);
- ``tools``: the tool specs shown to the policy (per-task tools: the optional ``tools_for(prompt, state)``, and
  multi-turn tasks: ``on_answer``; both described in ``tracerl.engine.protocol.ToolEnv``);
- ``warnings`` (optional, on instances): protections or features the machine does not provide;
- ``services(env_cfg) -> {name: factory}`` (optional, static): objects a run builds once and shares between all its
  environment actors (one Ray actor each, ``tracerl.actors.services``); they reach ``from_config(env_cfg,
  services={name: proxy})``, and ``from_config(env_cfg)`` without them builds its own;
- ``scores(prompt, answer) -> {metric: value}`` (optional, on instances): answer metrics beyond the reward (search:
  em, f1), kept on every leaf (``Node.scores``) and logged as ``rollout/<metric>`` and ``eval/<metric>``;
- ``check_data(env_cfg)`` (optional, static): read the configured data files (task files, corpora) and raise a clear
  error (``FileNotFoundError``, ``envs.files.DataFileError``) naming the file and the record; workflows call it
  through ``check_data`` before they start Ray or open an MLflow run;
- ``gold_turns(prompt, template) -> list[str]`` (optional, on instances): the reference turns as model text in the
  template's format (``tracerl.engine.gold``), replayed by ``tracerl bench env --gold``.

Built-in environments are imported on first use, so ``ENVS`` never pulls in a family's dependencies
(tantivy, bfcl-eval) unless that family is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from tracerl.registry import Registry

ENVS: Registry = Registry("environment")

_BUILTIN = {
    "simulator": "envs.simulator",
    "math": "envs.math.env",
    "search": "envs.search.env",
    "bfcl": "envs.bfcl.env",
}
TOOL_ENVS = ("math", "search", "bfcl")
"""Built-in ReAct tool environments (the language-model workflows run on these)."""


def env_class(name: str) -> Any:
    """The environment class registered as ``name`` (importing a built-in family on first use) or ``module:attr``."""
    module = _BUILTIN.get(name)
    if module is not None and name not in ENVS:
        importlib.import_module(module)
    return ENVS.get(name)


def env_section(env_cfg: Any) -> Any:
    """The config section of the chosen environment (``env.<name>``), or None for a user environment without one."""
    return getattr(env_cfg, env_cfg.name, None)


def check_data(env_cfg: Any) -> None:
    """Check the chosen environment's data files now (its optional ``check_data``), before anything is started.

    Raises:
        FileNotFoundError: a configured file does not exist.
        ValueError: a file cannot be used (``envs.files.DataFileError``: the message names the file and the record).
    """
    check = getattr(env_class(env_cfg.name), "check_data", None)
    if check is not None:
        check(env_cfg)


_PATH_FIELDS = ("tasks", "corpus")


def resolve_env_paths(env_cfg: Any) -> Any:
    """``env_cfg`` with the chosen section's file fields (tasks, corpus) made absolute where they exist here,
    so Ray workers with another working directory read the same files."""
    section = env_section(env_cfg)
    if section is None or not dataclasses.is_dataclass(section) or isinstance(section, type):
        return env_cfg
    changes = {}
    for f in _PATH_FIELDS:
        value = getattr(section, f, None)
        if isinstance(value, str) and value not in ("generated", "") and Path(value).exists():
            changes[f] = str(Path(value).resolve())
    if not changes:
        return env_cfg
    return dataclasses.replace(env_cfg, **{env_cfg.name: dataclasses.replace(section, **changes)})
