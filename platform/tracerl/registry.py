"""Named registries of components: allocators, advantage estimators, predictors, environments, ...

Every component kind has one registry and one call signature. A name is either a registered key
(``"trace"``) or an import path ``"package.module:attr"`` to a user component, so research code can
plug in without editing the platform.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name or a bad import path; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A name -> component map for one kind of component.

    Args:
        kind: what the registry holds, used in error messages ("allocator").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; a duplicate name is an error."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name`` (non-decorator form)."""
        self.register(name)(obj)

    def names(self) -> list[str]:
        """Known names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str) -> T:
        """Look up ``name``, or import ``module:attr``.

        Raises:
            RegistryError: unknown name or unimportable path, listing the known names.
        """
        if name in self._items:
            return self._items[name]
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise RegistryError(
                    f"cannot import module {module_name!r} for {self.kind} {name!r}: {exc}"
                ) from exc
            try:
                return getattr(module, attr)  # type: ignore[no-any-return]
            except AttributeError as exc:
                raise RegistryError(
                    f"module {module_name!r} has no attribute {attr!r} ({self.kind} {name!r})"
                ) from exc
        raise RegistryError(
            f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} "
            f"(or give an import path 'package.module:attr')"
        )
