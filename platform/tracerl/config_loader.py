"""Compose a command's YAML with its config groups and ``key=value`` overrides, then validate.

A command YAML may name group files in a ``defaults`` mapping::

    defaults: {allocator: trace, predictor: learned, budget: default}
    steps: 50

``defaults[g] = name`` loads ``conf/<g>/<name>.yaml`` under key ``g``; the command's own keys are
merged on top, then the overrides: ``allocator=grpo`` swaps a group file, ``budget.num_roots=64``
sets a field (values are parsed as YAML). The result is merged into the structured schema (unknown
keys and wrong types fail there) and turned into the frozen dataclass (range checks run in
``__post_init__``). Every failure raises :class:`ConfigError` naming the key and what is allowed.

A command that composes another config in a flattened field (``tracerl.schema.flattened``: the sweep's
``train: TrainConfig``) is written flat: each top-level key, group and override goes to the field that holds it
(``budget.num_leaves`` -> ``train.budget.num_leaves``), messages name keys as users write them, and ``to_yaml``
writes the flat form back, so a saved config reloads.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from tracerl.config_checks import check_components, env_schema_for
from tracerl.config_yaml import MAX_DEPTH, Sources, TooDeep, YamlDoc, YamlFileError, load_value, read_yaml
from tracerl.schema import choice_message, flat_routes, flat_values, literal_choices
from tracerl.shipped import CONF

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that cannot run; the message says which key and what to change.

    Args:
        key: the key at fault as users write it, where the message is about one (``compose`` then starts the
            message with the place in a file that set it).
        located: the message already names its place (a file's syntax error).
    """

    def __init__(self, message: str, key: str | None = None, located: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.located = located


def conf_dir() -> Path:
    """The conf/ directory: $TRACERL_CONF_DIR, else the shipped one (the repository's conf/ in a checkout, the
    package's copy in an installed wheel: ``tracerl.shipped``)."""
    env = os.environ.get("TRACERL_CONF_DIR")
    if env:
        return Path(env)
    return CONF


def _read_yaml(path: Path) -> YamlDoc:
    """The config file ``path``: a mapping (an empty file: an empty one) and where its keys stand."""
    try:
        doc = read_yaml(path)
    except YamlFileError as exc:
        raise ConfigError(str(exc), located=True) from None
    if doc.data is None:
        return dataclasses.replace(doc, data={})
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"{path} must hold a mapping at the top level, not {type(doc.data).__name__}", located=True
        )
    return doc


def group_names(group: str, root: Path | None = None) -> list[str]:
    """Names of the files in conf/<group>/ (without .yaml)."""
    folder = (root or conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


_GROUP_FILE = re.compile(r"[\w.-]{1,100}")
"""A group file name: no path separators, NUL bytes or names the file system refuses."""


def _load_group(group: str, name: str, root: Path, sources: Sources) -> dict[str, Any]:
    path = root / group / f"{name}.yaml"
    if not _GROUP_FILE.fullmatch(name) or not path.is_file():
        known = ", ".join(group_names(group, root)) or "none"
        raise ConfigError(
            f"no file conf/{group}/{name}.yaml for '{group}={name}'; available: {known}. "
            f"To set a field instead, use '{group}.<field>=<value>'",
            key=f"defaults.{group}",
        )
    doc = _read_yaml(path)
    sources.add_group(group, doc)
    return dict(doc.data)


def _field_type(schema: type, dotted: str, env_cls: type | None = None) -> Any:
    """The type at ``dotted`` (a key as users write it, flattened fields not named; ``env`` is ``env_cls`` where
    given), or None."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        return schema
    if parts[0] == "env" and env_cls is not None and "env" in flat_routes(schema):
        cls: Any = env_cls
    elif parts[0] in flat_routes(schema):
        cls = schema
        for part in flat_routes(schema)[parts[0]]:
            cls = typing.get_type_hints(cls)[part]
    else:
        return None
    for part in parts[1:]:
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints or part not in {f.name for f in dataclasses.fields(cls)}:
            return None
        cls = hints[part]
    return cls


def _field_names(schema: type, dotted: str, env_cls: type | None = None) -> list[str] | None:
    """Allowed keys at ``dotted`` (a key as users write it), or None if not a dataclass there."""
    if not dotted:
        return list(flat_routes(schema))
    cls = _field_type(schema, dotted, env_cls)
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else None


def _routed(schema: type, key: str) -> list[str]:
    """A key as users write it (``budget.num_leaves``) as its path in the schema (``train``, ``budget``,
    ``num_leaves``); a key the schema does not hold stays as written (the merge rejects it)."""
    head, _, rest = key.partition(".")
    return [*flat_routes(schema).get(head, (head,))[:-1], *key.split(".")]


def _route(schema: type, layer: dict[str, Any]) -> dict[str, Any]:
    """A layer of top-level keys (a YAML file, the group files) with each key moved into its flattened field.

    Raises:
        ConfigError: a key the schema does not hold at the top level (a flattened field's own name included).
    """
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if str(key) not in flat_routes(schema):
            raise ConfigError(_unknown_key_message(schema, str(key)), key=str(key))
        node = out
        for part in _routed(schema, str(key))[:-1]:
            node = node.setdefault(part, {})
        node[key] = value
    return out


def _user_key(schema: type, full_key: str) -> str:
    """A path in the schema (``train.budget.num_leaves``, ``modes[1]``) as users write it (``budget.num_leaves``)."""
    for key, path in flat_routes(schema).items():
        inner = ".".join(path)
        if full_key == inner or full_key.startswith((inner + ".", inner + "[")):
            return key + full_key[len(inner) :]
    return full_key


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(
            f"override {item!r} must look like key=value (for example budget.num_roots=64)", located=True
        )
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key", located=True)
    try:
        value = load_value(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except TooDeep:
        raise ConfigError(
            f"override '{key}': the value nests lists or mappings more than {MAX_DEPTH} deep; write a flatter value",
            located=True,
        ) from None
    if key.count(".") >= MAX_DEPTH:
        shown = key if len(key) <= 80 else key[:80] + "..."
        raise ConfigError(f"override '{shown}': a key has at most {MAX_DEPTH} dotted parts", located=True)
    return key, value


@functools.lru_cache(maxsize=64)
def _structured_once(schema: type) -> DictConfig:
    return OmegaConf.structured(schema)


def _structured(schema: type) -> DictConfig:
    """A fresh structured config of ``schema``'s defaults: a copy of one built once (building one walks every
    dataclass default and was half of each compose)."""
    return copy.deepcopy(_structured_once(schema))


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
        ConfigError: naming the bad key and what is allowed, after the file, line and column that set it where a
            file did (``FILE:LINE:COLUMN: message``; a key an override set is named by the message alone).
    """
    sources = Sources()
    try:
        return _compose(schema, Path(config_path), overrides, root or conf_dir(), sources)
    except ConfigError as exc:
        if exc.located:
            raise
        place = sources.where(exc.key) if exc.key is not None else sources.where_named(str(exc))
        if place is None:
            raise
        raise ConfigError(f"{place}: {exc}", exc.key, located=True) from exc


def _compose(schema: type[T], path: Path, overrides: Sequence[str], root: Path, sources: Sources) -> T:
    """:func:`compose`, recording in ``sources`` where each key was set."""
    top_doc = _read_yaml(path)
    sources.set_top(top_doc)
    top = dict(top_doc.data)
    defaults = top.pop("defaults", {}) or {}
    if not isinstance(defaults, dict):
        raise ConfigError("'defaults' must be a mapping of group -> file name", key="defaults")
    groups: dict[str, str] = {str(k): str(v) for k, v in defaults.items()}
    sets: list[tuple[str, Any]] = []
    for item in overrides:
        key, value = _parse_override(item)
        if "." not in key and _GROUP_FILE.fullmatch(key) and (root / key).is_dir():
            groups[key] = item.partition("=")[2].strip()  # a file name, not YAML ('off' is not False)
            sources.add_override(f"defaults.{key}", None)
        else:
            sets.append((key, value))
            sources.add_override(key, value)
    group_layer = {g: _load_group(g, n, root, sources) for g, n in groups.items()}
    env_cls = _env_schema(schema, [group_layer, top], sets)
    layers = [OmegaConf.create(_route(schema, group_layer)), OmegaConf.create(_route(schema, top))]
    try:
        for key, value in sets:
            layers.append(OmegaConf.create(_nested(schema, key, value, env_cls)))
        base = _structured(schema)
        if env_cls is not None:
            _set(base, _routed(schema, "env"), OmegaConf.structured(env_cls(name=_default_env(schema).name)))
        for key in flat_routes(
            schema
        ):  # a mapping field (a sweep's space) given by a file replaces the default
            given = key in group_layer or key in top or any(k.partition(".")[0] == key for k, _ in sets)
            if given and str(_field(schema, key).type).startswith("dict["):
                _set(base, _routed(schema, key), {})
        cfg = OmegaConf.merge(base, *layers)
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except ConfigKeyError as exc:
        key = _user_key(schema, str(exc.full_key or exc.key or ""))
        raise ConfigError(_unknown_key_message(schema, key, env_cls), key=key) from exc
    except ValidationError as exc:
        key = _user_key(schema, str(exc.full_key))
        field_type = _field_type(schema, key, env_cls)
        choices = literal_choices(field_type)
        if choices is not None:
            raise ConfigError(choice_message(key, exc.value, choices), key=key) from exc
        msg = str(exc).split("\n")[0]
        raise ConfigError(f"bad value for '{key}': {msg}{_expected(field_type)}", key=key) from exc
    except OmegaConfBaseException as exc:
        key = _user_key(schema, str(exc.full_key))
        raise ConfigError(f"invalid config: {str(exc).splitlines()[0]} (key '{key}')", key=key) from exc
    except ValueError as exc:  # __post_init__ range checks
        raise ConfigError(str(exc)) from exc
    except RecursionError:  # a backstop: MAX_DEPTH keeps every value shallower than OmegaConf's limit
        raise ConfigError(f"{path}: the config nests too deeply to merge; write flatter values") from None
    if not isinstance(obj, schema):  # a structured config always converts back to its dataclass
        raise ConfigError(f"config did not resolve to a {schema.__name__} (got {type(obj).__name__})")
    try:
        check_components(obj)
    except (ValueError, KeyError) as exc:
        raise ConfigError(str(exc)) from exc
    return obj


def _field(schema: type, key: str) -> dataclasses.Field[Any]:
    """The dataclass field that holds the top-level ``key`` (through flattened fields)."""
    *outer, name = flat_routes(schema)[key]
    cls: Any = schema
    for part in outer:
        cls = typing.get_type_hints(cls)[part]
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _set(base: Any, path: Sequence[str], value: Any) -> None:
    """Replace the node at ``path`` of the structured config ``base`` (a frozen dataclass's: read-only)."""
    node = base
    for part in path[:-1]:
        OmegaConf.set_readonly(node, False)
        node = node[part]
    OmegaConf.set_readonly(node, False)
    node[path[-1]] = value


def _default_env(schema: type) -> Any:
    """The schema's default ``env`` (None: the command has no environment)."""
    if "env" not in flat_routes(schema):
        return None
    f = _field(schema, "env")
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _env_schema(schema: type, raws: Sequence[dict[str, Any]], sets: Sequence[tuple[str, Any]]) -> Any:
    """The ``env`` schema for this config: ``EnvConfig`` with the chosen environment's section (from its
    registry entry) and every other section the config sets (saved configs hold all the built-in ones)."""
    default = _default_env(schema)
    if default is None:
        return None
    name, keys = default.name, set()
    envs = [raw.get("env") for raw in raws] + [v for k, v in sets if k == "env"]
    for env in envs:
        if isinstance(env, dict):
            name = str(env.get("name", name))
            keys |= {str(k) for k in env}
    for key, value in sets:
        parts = key.split(".")
        if parts[0] == "env" and len(parts) >= 2:
            name = str(value) if parts[1:] == ["name"] else name
            keys.add(parts[1])
    try:
        return env_schema_for(name, keys - {f.name for f in dataclasses.fields(default)})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _nested(schema: type, key: str, value: Any, env_cls: type | None = None) -> dict[str, Any]:
    """``a.b.c=v`` as ``{"a": {"b": {"c": v}}}`` (under its flattened field, where one holds ``a``), after checking
    the key exists in the schema."""
    parent, _, leaf = key.rpartition(".")
    allowed = _field_names(schema, parent, env_cls)
    if allowed is None or leaf not in allowed:
        raise ConfigError(_unknown_key_message(schema, key, env_cls), key=key)
    out: dict[str, Any] = {leaf: value}
    for part in reversed(_routed(schema, key)[:-1]):
        out = {part: out}
    return out


_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    type(None): "null",
}


def _expected(tp: Any) -> str:
    """``: set it to a number or null`` for a field of type ``float | None``; empty where the type has no short
    name (a dataclass, a mapping)."""
    if typing.get_origin(tp) is list:
        return ": set it to a list, like [a, b]"
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    words = [_TYPE_WORDS.get(a) for a in args]
    return "" if None in words else f": set it to {' or '.join(w for w in words if w)}"


def _unknown_key_message(schema: type, key: str, env_cls: type | None = None) -> str:
    parent, _, _leaf = key.rpartition(".")
    # Walk up until a known dataclass level is found, to list what is allowed there.
    probe = parent
    allowed = _field_names(schema, probe, env_cls)
    while allowed is None and probe:
        probe = probe.rpartition(".")[0]
        allowed = _field_names(schema, probe, env_cls)
    where = f"under '{probe}'" if probe else "at the top level"
    unknown = key[len(probe) + 1 if probe else 0 :].split(".")[0]
    close = difflib.get_close_matches(unknown, allowed or [], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown config key '{key}'; allowed {where}: {', '.join(allowed or [])}{hint}"


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (written next to every run's results), flattened fields written flat."""
    return OmegaConf.to_yaml(OmegaConf.create(flat_values(cfg)))


def to_flat_dict(cfg: Any) -> dict[str, Any]:
    """Dotted-key -> value, for logging as MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    walk("", OmegaConf.to_container(OmegaConf.create(flat_values(cfg)), resolve=True))
    return out
