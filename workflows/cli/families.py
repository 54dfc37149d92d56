"""The command families the CLI adds to ``tracerl bench`` without naming them: the built-in ones of
``tracerl.workflows.COMMAND_FAMILIES`` (the experiments) and those installed packages declare under the entry-point
group ``tracerl.commands``, both read through a ``tracerl.registry.Registry`` as allocators and environments are.
A package declares, in its ``pyproject.toml``::

    [project.entry-points."tracerl.commands"]
    mine = "mypkg.cli:FAMILY"   # a tracerl.workflows.cli.args.CommandFamily

A built-in family that fails to load is a bug and raises; an installed one that fails to load, or that names a
command already taken or one outside ``bench``, or runs a variant of a command (only the built-in families may), is
left out with a line on stderr, so a broken plug-in cannot break
the commands that do not use it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from tracerl.registry import Registry, RegistryError
from tracerl.workflows import COMMAND_FAMILIES
from tracerl.workflows.cli.args import CommandFamily

ENTRY_POINT_GROUP = "tracerl.commands"


def registry(builtins: dict[str, str] = COMMAND_FAMILIES) -> Registry[CommandFamily]:
    """The families' registry: ``builtins`` (name -> ``"module:attr"``) lazy, installed ones from the group."""
    found: Registry[CommandFamily] = Registry("command family", group=ENTRY_POINT_GROUP)
    for name, path in builtins.items():
        found.add_lazy(name, path)
    return found


def _check(family: object, taken: set[str], builtin: bool) -> CommandFamily:
    """``family`` if it is a CommandFamily of new ``bench`` commands, each with its help line (and variants of
    other commands only if it is ``builtin``); else ValueError."""
    if not isinstance(family, CommandFamily):
        raise ValueError(f"is a {type(family).__name__}, not a CommandFamily")
    if family.variants and not builtin:
        raise ValueError("runs variants of commands (only the built-in families may)")
    names = set(family.commands)
    outside = sorted(n for n in names if not n.startswith("bench "))
    if outside:
        raise ValueError(f"adds commands outside `tracerl bench`: {', '.join(outside)}")
    if names & taken:
        raise ValueError(f"names commands already taken: {', '.join(sorted(names & taken))}")
    if set(family.help) != names:
        raise ValueError("needs exactly one help line per command")
    if not set(family.after) <= names:
        raise ValueError(f"places commands it does not add: {', '.join(sorted(set(family.after) - names))}")
    return family


def load_families(taken: Iterable[str], found: Registry[CommandFamily] | None = None) -> list[CommandFamily]:
    """Every family of ``found`` (default: ``registry()``) in name order, none naming a command in ``taken`` or in
    an earlier family."""
    found = found if found is not None else registry()
    found.plugins()  # read the entry points, so that names() lists them
    used = set(taken)
    out = []
    for name in found.names():
        builtin = name in found
        try:
            family = _check(found.get(name), used, builtin)
        except (RegistryError, ValueError) as exc:
            if builtin and isinstance(exc, ValueError):
                raise ValueError(f"command family {name!r} {exc}") from exc
            if builtin:
                raise
            print(f"tracerl: command family {name!r} left out: {exc}", file=sys.stderr)
            continue
        used |= set(family.commands)
        out.append(family)
    return out
