"""The environment registry: name -> environment class (a subclass of ``tracerl.engine.protocol.Env``, which
``tracerl.envs.base`` re-exports for environment authors).

An environment is found, in order, as a registered name (``ENVS.register``) or a built-in family (simulator,
math, search, bfcl: lazy entries, imported on first use, so ``ENVS`` never pulls in a family's dependencies
such as tantivy or bfcl-eval unless that family is asked for, and the platform names them without importing
the ``envs`` package), an entry point of the group ``tracerl.envs`` (how an installed third-party package adds
one: ``[project.entry-points."tracerl.envs"] toy = "toy_env:ToyEnv"``), or an import path ``module:attr``. The
class's ``config`` dataclass is the schema of its ``env.<name>`` section (for ``module:attr``: ``env.<attr>``);
docs/design.md, "Adding an environment", walks through one. ``tracerl.envs.registry`` re-exports this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tracerl.engine.protocol import Env, ToolEnv
from tracerl.env_config import section_key
from tracerl.registry import Registry, RegistryError

ENTRY_POINT_GROUP = "tracerl.envs"
ENVS: Registry[type[Env]] = Registry("environment", group=ENTRY_POINT_GROUP)
for _name, _path in {
    "simulator": "tracerl.envs.simulator:Simulator",
    "math": "tracerl.envs.math.env:MathEnv",
    "search": "tracerl.envs.search.env:SearchEnv",
    "bfcl": "tracerl.envs.bfcl.env:BfclEnv",
}.items():
    ENVS.add_lazy(_name, _path)
TOOL_ENVS = ("math", "search", "bfcl")
"""Built-in ReAct tool environments (the language-model workflows run on these)."""


def env_class(name: str) -> type[Env]:
    """The environment class called ``name``: built-in, registered, a ``tracerl.envs`` entry point, or ``module:attr``.

    Raises:
        RegistryError: unknown name (listing the known ones), or an import path, built-in or entry point that
            does not import.
        TypeError: what the name resolves to is not an ``Env`` subclass.
    """
    cls: Any = ENVS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(
            f"environment {name!r} is {cls!r}, not a subclass of tracerl.envs.base.Env (or ToolEnv): derive it from one"
        )
    return cls


def tool_env_class(name: str) -> type[ToolEnv]:
    """``env_class(name)``, checked to be a ReAct tool environment (what the language-model workflows run on).

    Raises:
        TypeError: it is not a ``ToolEnv`` (the simulator, say).
    """
    cls = env_class(name)
    if not issubclass(cls, ToolEnv):
        raise TypeError(
            f"environment {name!r} ({cls.__name__}) is not a ReAct tool environment (tracerl.envs.base.ToolEnv); "
            f"language-model workflows run on one of {', '.join(TOOL_ENVS)} or a ToolEnv plug-in"
        )
    return cls


def known_envs() -> list[str]:
    """Every environment name resolvable without an import path: built-in, registered and entry points."""
    ENVS.plugins()  # read the installed entry points (not imported)
    return ENVS.names()


def section_schema(key: str, chosen: str) -> type | None:
    """The dataclass of the section ``env.<key>`` when ``env.name`` is ``chosen`` (None: it has no settings).

    A section other than the chosen environment's is allowed if ``key`` names a known environment (saved configs
    hold every built-in section).

    Raises:
        KeyError: ``key`` names no environment (the message lists what is allowed under ``env``).
    """
    if key == section_key(chosen):
        return env_class(chosen).config
    if key in known_envs():
        return env_class(key).config
    raise KeyError(key)


def env_section(env_cfg: Any) -> Any:
    """The config section of the chosen environment (``env.<name>``), or None where the config holds none."""
    return env_cfg.sections().get(section_key(env_cfg.name))


def check_data(env_cfg: Any) -> None:
    """Check the chosen environment's data files now (its ``check_data``), before anything is started.

    Raises:
        FileNotFoundError: a configured file does not exist.
        ValueError: a file cannot be used (``tracerl.envs.files.DataFileError``: the message names the file and the record).
    """
    env_class(env_cfg.name).check_data(env_cfg)


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
    return dataclasses.replace(
        env_cfg, **{section_key(env_cfg.name): dataclasses.replace(section, **changes)}
    )


__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVS",
    "TOOL_ENVS",
    "RegistryError",
    "check_data",
    "env_class",
    "env_section",
    "known_envs",
    "resolve_env_paths",
    "section_schema",
    "tool_env_class",
]
