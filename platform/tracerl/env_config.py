"""The ``env`` section's schema: which environment, what every environment shares, and one section per environment.

[choice] The ``env`` section is open: ``env.name`` picks a registered environment, and ``env.<section>`` holds the
settings of that environment in the dataclass its class names (``Env.config``), so a plug-in environment brings its
own section. ``EnvConfig`` declares only what every environment shares; the loader builds the subclass with the
section fields the config uses (``env_config``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tracerl.schema import check

T = TypeVar("T")


def section_key(env_name: str) -> str:
    """The key of an environment's settings under ``env``: its registered name, or for ``module:attr`` the attr."""
    return env_name.rpartition(":")[2]


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, what every environment shares, and (in subclasses, see ``env_config``) the sections."""

    name: str = "simulator"
    """Registered environment (simulator, math, search, bfcl, an entry point of ``tracerl.envs``) or 'module:attr'."""
    reward_timeout_s: float = 10.0
    """Wall-clock limit on grading one answer (math-verify, search F1, the BFCL checker); past it: reward 0, flagged."""

    def __post_init__(self) -> None:
        check(self.reward_timeout_s > 0, f"env.reward_timeout_s must be > 0 (got {self.reward_timeout_s})")

    def sections(self) -> dict[str, Any]:
        """Every environment section this config holds, by key."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _SHARED}

    def settings(self, cls: type[T]) -> T:
        """The chosen environment's section (``env.<section_key(name)>``) as a ``cls``; ``cls()`` where absent.

        Raises:
            TypeError: the section holds another dataclass than ``cls``.
        """
        value = self.sections().get(section_key(self.name))
        if value is None:
            return cls()
        if not isinstance(value, cls):
            raise TypeError(
                f"env.{section_key(self.name)} holds a {type(value).__name__}, not the {cls.__name__} "
                f"environment {self.name!r} reads"
            )
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        # The subclass is built at run time; pickles (Ray) rebuild it from the section types.
        return (_rebuild, (self.name, self.reward_timeout_s, self.sections()))


_SHARED = frozenset(f.name for f in dataclasses.fields(EnvConfig))


@functools.cache
def env_config_class(sections: tuple[tuple[str, type], ...]) -> type[EnvConfig]:
    """``EnvConfig`` with one field per ``(key, dataclass)`` (sorted by key): the schema the loader merges into."""
    if not sections:
        return EnvConfig
    for key, _ in sections:
        check(
            key.isidentifier() and key not in _SHARED, f"env section key {key!r} is not a usable config key"
        )
    fields = [(k, cls, field(default_factory=cls)) for k, cls in sections]
    return dataclasses.make_dataclass("EnvConfig", fields, bases=(EnvConfig,), frozen=True)


def env_config(name: str = "simulator", reward_timeout_s: float = 10.0, **sections: Any) -> EnvConfig:
    """An ``EnvConfig`` holding ``sections`` (key -> settings dataclass), e.g.
    ``env_config("search", search=SearchEnvConfig(top_k=5))``."""
    cls = env_config_class(tuple(sorted((k, type(v)) for k, v in sections.items())))
    return cls(name=name, reward_timeout_s=reward_timeout_s, **sections)


def _rebuild(name: str, reward_timeout_s: float, sections: dict[str, Any]) -> EnvConfig:
    return env_config(name, reward_timeout_s, **sections)
