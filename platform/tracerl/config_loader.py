"""Compose a command's YAML with its config groups and ``key=value`` overrides, then validate.

A command YAML may name group files in a ``defaults`` mapping::

    defaults: {allocator: trace, predictor: learned, budget: default}
    steps: 50

``defaults[g] = name`` loads ``conf/<g>/<name>.yaml`` under key ``g``; the command's own keys are
merged on top, then the overrides: ``allocator=grpo`` swaps a group file, ``budget.num_roots=64``
sets a field (values are parsed as YAML). The result is merged into the structured schema (unknown
keys and wrong types fail there) and turned into the frozen dataclass (range checks run in
``__post_init__``). Every failure raises :class:`ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that cannot run; the message says which key and what to change."""


def conf_dir() -> Path:
    """The conf/ directory: $TRACERL_CONF_DIR, else the repository's conf/."""
    env = os.environ.get("TRACERL_CONF_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "conf"


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 booleans: only true/false. PyYAML's 1.1 rules read on/off/yes/no as booleans, so
    ``loss.importance_sampling=on`` reached a string field as 'True'; boolean fields still take on/off/yes/no
    (the schema converts them)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = _load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    except RecursionError:  # PyYAML parses nesting recursively
        raise ConfigError(f"{path} is nested too deeply to read") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def group_names(group: str, root: Path | None = None) -> list[str]:
    """Names of the files in conf/<group>/ (without .yaml)."""
    folder = (root or conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


_GROUP_FILE = re.compile(r"[\w.-]{1,100}")
"""A group file name: no path separators, NUL bytes or names the file system refuses."""


def _load_group(group: str, name: str, root: Path) -> dict[str, Any]:
    path = root / group / f"{name}.yaml"
    if not _GROUP_FILE.fullmatch(name) or not path.is_file():
        known = ", ".join(group_names(group, root)) or "none"
        raise ConfigError(
            f"no file conf/{group}/{name}.yaml for '{group}={name}'; available: {known}. "
            f"To set a field instead, use '{group}.<field>=<value>'"
        )
    return _read_yaml(path)


def _field_names(schema: type, dotted: str) -> list[str] | None:
    """Allowed keys at ``dotted`` (a dotted path into the schema), or None if not a dataclass there."""
    cls: Any = schema
    for part in [p for p in dotted.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return None
        cls = fields[part].type
        if isinstance(cls, str):  # postponed annotations: resolve through the module
            import sys

            cls = eval(cls, vars(sys.modules[schema.__module__]))  # noqa: S307 - our own annotations
        if not dataclasses.is_dataclass(cls):
            return None
    return [f.name for f in dataclasses.fields(cls)]


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (for example budget.num_roots=64)")
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = _load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except RecursionError:  # PyYAML parses nesting recursively
        raise ConfigError(
            f"override '{key}': the value is nested too deeply to read; write a flatter value"
        ) from None
    return key, value


def compose(
    schema: type[T], config_path: str | Path, overrides: Sequence[str] = (), root: Path | None = None
) -> T:
    """Load, merge and validate a config.

    Args:
        schema: the frozen dataclass of the command's config.
        config_path: the command's YAML.
        overrides: ``group=name`` and ``dotted.key=value`` items, applied in order.
        root: the conf/ directory holding group folders (default: :func:`conf_dir`).

    Raises:
        ConfigError: naming the bad key and what is allowed.
    """
    root = root or conf_dir()
    path = Path(config_path)
    top = _read_yaml(path)
    defaults = top.pop("defaults", {}) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: 'defaults' must be a mapping of group -> file name")
    groups: dict[str, str] = {str(k): str(v) for k, v in defaults.items()}
    sets: list[tuple[str, Any]] = []
    for item in overrides:
        key, value = _parse_override(item)
        if "." not in key and _GROUP_FILE.fullmatch(key) and (root / key).is_dir():
            groups[key] = item.partition("=")[2].strip()  # a file name, not YAML ('off' is not False)
        else:
            sets.append((key, value))
    layers = [
        OmegaConf.create({g: _load_group(g, n, root) for g, n in groups.items()}),
        OmegaConf.create(top),
    ]
    try:
        for key, value in sets:
            layers.append(OmegaConf.create(_nested(schema, key, value)))
        base = OmegaConf.structured(schema)
        for f in dataclasses.fields(
            cast(Any, schema)
        ):  # a mapping field (a sweep's space) given by a file replaces the default
            if str(f.type).startswith("dict[") and any(f.name in layer for layer in layers):
                OmegaConf.set_readonly(base, False)
                base[f.name] = {}
        cfg = OmegaConf.merge(base, *layers)
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except ConfigKeyError as exc:
        raise ConfigError(_unknown_key_message(schema, str(exc.full_key or exc.key or ""))) from exc
    except ValidationError as exc:
        msg = str(exc).split("\n")[0]
        raise ConfigError(f"bad value for '{exc.full_key}': {msg}") from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {str(exc).splitlines()[0]} (key '{exc.full_key}')") from exc
    except ValueError as exc:  # __post_init__ range checks
        raise ConfigError(str(exc)) from exc
    if not isinstance(obj, schema):  # a structured config always converts back to its dataclass
        raise ConfigError(f"config did not resolve to a {schema.__name__} (got {type(obj).__name__})")
    return obj


def _nested(schema: type, key: str, value: Any) -> dict[str, Any]:
    """``a.b.c=v`` as ``{"a": {"b": {"c": v}}}``, after checking the key exists in the schema."""
    parent, _, leaf = key.rpartition(".")
    allowed = _field_names(schema, parent)
    if allowed is None or leaf not in allowed:
        raise ConfigError(_unknown_key_message(schema, key))
    out: dict[str, Any] = {leaf: value}
    for part in reversed([p for p in parent.split(".") if p]):
        out = {part: out}
    return out


def _unknown_key_message(schema: type, key: str) -> str:
    parent, _, _leaf = key.rpartition(".")
    # Walk up until a known dataclass level is found, to list what is allowed there.
    probe = parent
    allowed = _field_names(schema, probe)
    while allowed is None and probe:
        probe = probe.rpartition(".")[0]
        allowed = _field_names(schema, probe)
    where = f"under '{probe}'" if probe else "at the top level"
    return f"unknown config key '{key}'; allowed {where}: {', '.join(allowed or [])}"


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (written next to every run's results)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_flat_dict(cfg: Any) -> dict[str, Any]:
    """Dotted-key -> value, for logging as MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    walk("", OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    return out
