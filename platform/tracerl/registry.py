"""Named registries of components: allocators, advantage estimators, environments, predictors, samplers, ...

Every component kind has one registry and one call signature. A name is a registered key (``"trace"``), a
lazy built-in (``add_lazy("math", "tracerl.envs.math.env:MathEnv")``: listed by name at once, imported on first use, so
the platform names the built-ins of the layers above it without importing them), an import path
``"package.module:attr"`` to a user component, or the name of a Python entry point in the registry's group
(``tracerl.allocators``, ``tracerl.envs``, ``tracerl.predictors``), so research code and third-party packages
plug in without editing the platform. A package declares, in its ``pyproject.toml``::

    [project.entry-points."tracerl.allocators"]
    my_alloc = "mypkg.alloc:MyAllocator"

and ``allocator.name=my_alloc`` then finds it once the package is installed. Entry points are read lazily,
once, the first time a name is not among the registered ones, and an entry point is imported only when its
name is asked for (a broken plug-in cannot break runs that do not use it). A registered or lazy built-in name
wins over an entry point of the same name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name or a bad import path; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A name -> component map for one kind of component.

    Args:
        kind: what the registry holds, used in error messages ("allocator").
        group: the entry-point group third-party packages register under (None: none is read).
    """

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # built-in name -> "module:attr", imported by the first get
        self._plugins: dict[str, EntryPoint] | None = None  # read on the first unknown name

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; a duplicate name is an error."""

        def deco(obj: T) -> T:
            self._check_new(name)
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name`` (non-decorator form)."""
        self.register(name)(obj)

    def add_lazy(self, name: str, path: str) -> None:
        """Register the component at the import path ``path`` (``"module:attr"``) under ``name`` without importing
        it: ``names()`` lists it at once and the first ``get(name)`` imports it."""
        if ":" not in path:
            raise ValueError(f"{self.kind} {name!r}: a lazy entry is 'module:attr' (got {path!r})")
        self._check_new(name)
        self._lazy[name] = path

    def _check_new(self, name: str) -> None:
        if name in self._items or name in self._lazy:
            raise RegistryError(f"{self.kind} {name!r} is registered twice")

    def names(self) -> list[str]:
        """Known names, sorted: registered and lazy ones and, once they were read, those of installed entry points."""
        return sorted(set(self._items) | set(self._lazy) | set(self._plugins or {}))

    def __contains__(self, name: object) -> bool:
        """Registered or lazy (entry points are not read)."""
        return name in self._items or name in self._lazy

    def plugins(self) -> dict[str, EntryPoint]:
        """The installed entry points of this registry's group by name (read once, not imported)."""
        if self._plugins is None:
            found = entry_points(group=self.group) if self.group else ()
            self._plugins = {ep.name: ep for ep in found}
        return self._plugins

    def get(self, name: str) -> T:
        """Look up ``name``: a registered or lazy name, an import path ``module:attr``, or an entry point of the group.

        Raises:
            RegistryError: unknown name, unimportable path, or a lazy entry or entry point that fails to load;
                an unknown name's message lists the known names.
        """
        if name in self._items:
            return self._items[name]
        lazy = self._lazy.get(name)
        if lazy is not None:
            try:
                obj = cast(T, _import(lazy))
            except Exception as exc:  # e.g. a family's optional dependency is missing: say which and why
                raise RegistryError(
                    f"{self.kind} {name!r} ({lazy!r}) failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            self._items[name] = obj
            return obj
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise RegistryError(
                    f"cannot import module {module_name!r} for {self.kind} {name!r}: {exc}"
                ) from exc
            try:
                return cast(T, getattr(module, attr))
            except AttributeError as exc:
                raise RegistryError(
                    f"module {module_name!r} has no attribute {attr!r} ({self.kind} {name!r})"
                ) from exc
        plugin = self.plugins().get(name)
        if plugin is not None:
            try:
                obj = cast(T, plugin.load())
            except Exception as exc:  # a plug-in's import may fail in any way: say which one and why
                raise RegistryError(
                    f"{self.kind} {name!r} (entry point {plugin.value!r} in group {self.group!r}) "
                    f"failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            self._items[name] = obj
            return obj
        where = f", installed entry points in group {self.group!r}" if self.group else ""
        raise RegistryError(
            f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} "
            f"(or give an import path 'package.module:attr'{where})"
        )


def _import(path: str) -> object:
    """The attribute ``attr`` of the module ``module`` for ``path`` = ``"module:attr"``."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)
