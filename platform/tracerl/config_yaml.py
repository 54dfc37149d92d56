"""Read a config's YAML: the data, where each key stands, and syntax errors as one line.

One parse of a file gives its data (YAML 1.2 booleans), the line and column of every key and list item (so that
a bad key or value found later, when the config is merged and validated, is reported at its place in the file),
and the keys a mapping sets twice (PyYAML keeps the last one silently; here it is an error). A syntax error
(a tab indent, an unclosed bracket or quote, a stray ``:``) becomes one line: ``FILE:LINE:COLUMN: not valid
YAML: what is wrong; what to change``, instead of the parser's several lines that end with the position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 32
"""The deepest nesting a config value may have (lists and mappings). A fixed limit, so a too deep value is refused
the same way whatever the call stack: OmegaConf builds nodes recursively (~150 levels exhausted Python's stack in
``OmegaConf.create``), and whether a value near that depth failed depended on how deep the caller already was."""

KeyPath = tuple[str | int, ...]
"""A key's place in a document: mapping keys as strings, list items as their index."""


class YamlFileError(ValueError):
    """A config file that cannot be read as a config; the message is one line naming the file."""


class TooDeep(Exception):
    """A parsed YAML value nested deeper than :data:`MAX_DEPTH`."""


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


@dataclass(frozen=True)
class YamlDoc:
    """A parsed config file: its data and the (1-based) line and column of each key and list item."""

    path: Path
    data: Any
    positions: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def where(self, key: KeyPath) -> str:
        """``FILE:LINE:COLUMN`` of ``key`` (or of the nearest enclosing key this file sets); ``FILE`` alone if it
        sets none of them."""
        for end in range(len(key), 0, -1):
            if key[:end] in self.positions:
                line, col = self.positions[key[:end]]
                return f"{self.path}:{line}:{col}"
        return str(self.path)


def depth(value: Any) -> int:
    """How deeply lists and mappings nest in ``value`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, level = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        todo.extend((child, level + 1) for child in children)
    return deepest


def load_value(text: str) -> Any:
    """Parse YAML text (an override's value).

    Raises:
        yaml.YAMLError: not YAML.
        TooDeep: nested deeper than MAX_DEPTH (PyYAML's own recursion limit included).
    """
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML composes nesting recursively
        raise TooDeep from None
    if depth(data) > MAX_DEPTH:
        raise TooDeep
    return data


def read_yaml(path: Path) -> YamlDoc:
    """Parse the config file ``path``: data, key positions, duplicate keys refused.

    Raises:
        YamlFileError: the file is missing, not UTF-8, not YAML (one line with its line and column and what to
            change), sets a key twice, or nests deeper than MAX_DEPTH.
    """
    if not path.is_file():
        raise YamlFileError(f"config file not found: {path}")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise YamlFileError(f"{path} is not UTF-8 text") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        positions: dict[KeyPath, tuple[int, int]] = {}
        if node is not None:
            _walk(path, node, (), positions)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise YamlFileError(syntax_message(path, text, exc)) from None
    except yaml.YAMLError as exc:  # unmarked: rare (a bad encoding mark); its first line
        raise YamlFileError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # PyYAML composes nesting recursively
        raise YamlFileError(_too_deep(path)) from None
    finally:
        loader.dispose()
    if depth(data) > MAX_DEPTH:
        raise YamlFileError(_too_deep(path))
    return YamlDoc(path, data, positions)


def _too_deep(path: Path) -> str:
    return f"{path} nests lists or mappings more than {MAX_DEPTH} deep; write a flatter value"


def _walk(path: Path, node: yaml.Node, key: KeyPath, out: dict[KeyPath, tuple[int, int]]) -> None:
    """Record the position of every key and list item under ``node``; refuse a key a mapping sets twice."""
    todo: list[tuple[yaml.Node, KeyPath]] = [(node, key)]
    while todo:
        current, prefix = todo.pop()
        if len(prefix) > MAX_DEPTH:
            raise RecursionError  # read_yaml's "nests too deep"
        if isinstance(current, yaml.MappingNode):
            seen: dict[str, tuple[int, int]] = {}
            for k, v in current.value:
                if k.tag == "tag:yaml.org,2002:merge" or not isinstance(k, yaml.ScalarNode):
                    continue
                at = (k.start_mark.line + 1, k.start_mark.column + 1)
                if k.value in seen:
                    first = seen[k.value]
                    raise YamlFileError(
                        f"{path}:{at[0]}:{at[1]}: key '{k.value}' is set twice in this mapping (first at line "
                        f"{first[0]}); keep one of them"
                    )
                seen[k.value] = at
                out[(*prefix, k.value)] = at
                todo.append((v, (*prefix, k.value)))
        elif isinstance(current, yaml.SequenceNode):
            for i, item in enumerate(current.value):
                out[(*prefix, i)] = (item.start_mark.line + 1, item.start_mark.column + 1)
                todo.append((item, (*prefix, i)))


def _open_bracket(text: str) -> yaml.Mark | None:
    """Where the innermost ``[`` or ``{`` still open when the scanner stops on ``text`` was opened."""
    opened: list[yaml.Mark] = []
    try:
        for token in yaml.scan(text, Loader=_Loader):
            if isinstance(token, yaml.FlowSequenceStartToken | yaml.FlowMappingStartToken):
                opened.append(token.start_mark)
            elif isinstance(token, yaml.FlowSequenceEndToken | yaml.FlowMappingEndToken) and opened:
                opened.pop()
    except yaml.YAMLError:
        pass
    return opened[-1] if opened else None


def _fix(exc: yaml.MarkedYAMLError, text: str) -> tuple[yaml.Mark | None, str]:
    """Where to point and what to say for a YAML syntax error: the known mistakes get what to change."""
    problem, context = exc.problem or "", exc.context or ""
    if "found character '\\t'" in problem:
        return exc.problem_mark, "a tab character; YAML indents with spaces only: replace the tab with spaces"
    if "cannot start any token" in problem:
        char = problem.split("'")[1] if problem.count("'") >= 2 else "this character"
        return exc.problem_mark, f"a plain value cannot start with '{char}': put the value in quotes"
    if "quoted scalar" in context:
        return exc.context_mark, "this quote is never closed: add the closing quote"
    bracket = _open_bracket(text) if "flow" in context or "<stream end>" in problem else None
    if bracket is not None:
        close = "]" if text[bracket.index] == "[" else "}"
        end = exc.problem_mark
        until = f" before line {end.line + 1}, column {end.column + 1}" if end is not None else ""
        return bracket, (
            f"this '{text[bracket.index]}' is not closed{until}: add '{close}' (and a ',' between items)"
        )
    if "mapping values are not allowed" in problem:
        return exc.problem_mark, (
            "a 'key: value' where none can start: indent the key like its siblings, or quote a value that "
            "holds ': '"
        )
    if "could not find expected ':'" in problem:
        return (
            exc.context_mark,
            "a line that is not 'key: value': add ': ' after the key, or join it to the line above",
        )
    found = re.search(r"expected <block end>, but found '(.+)'", problem)
    if found:
        what = found.group(1)
        if what in ("]", "}"):
            return exc.problem_mark, f"a '{what}' that closes nothing: remove it"
        if what == "-":
            return exc.problem_mark, "a list item where a key was expected: indent it under its key"
        return exc.problem_mark, (
            "this line's indentation matches no key above it: indent it exactly like its sibling keys"
        )
    if "could not determine a constructor for the tag" in problem:
        return exc.problem_mark, "a YAML tag ('!!...' or '!...') a config cannot hold: remove the tag"
    if "undefined alias" in problem:
        return (
            exc.problem_mark,
            "an alias '*name' with no anchor '&name' before it: define the anchor or quote the value",
        )
    mark = exc.problem_mark or exc.context_mark
    detail = f"{problem} ({context})" if context else problem
    return mark, f"{detail or 'a syntax error'}: fix the YAML syntax here"


def syntax_message(path: Path | str, text: str, exc: yaml.MarkedYAMLError) -> str:
    """One line for a YAML syntax error: ``FILE:LINE:COLUMN: not valid YAML: what; what to change``."""
    mark, what = _fix(exc, text)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return " ".join(f"{where}: not valid YAML: {what}".split())


_KEY_TOKEN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*")


def key_path(key: str) -> KeyPath:
    """A key as messages write it (``budget.num_leaves``, ``modes[1]``) as a :data:`KeyPath`."""
    out: list[str | int] = []
    for part in key.split("."):
        name, *indices = re.split(r"\[(\d+)\]", part)
        out += [name] if name else []
        out += [int(i) for i in indices if i]
    return tuple(out)


def _set_paths(prefix: KeyPath, value: Any) -> set[KeyPath]:
    """The key paths an override's value sets under ``prefix`` (its own and those of a mapping it holds)."""
    out, todo = {prefix}, [(prefix, value)]
    while todo:
        at, node = todo.pop()
        if isinstance(node, dict) and len(at) <= MAX_DEPTH:
            for k, v in node.items():
                out.add((*at, str(k)))
                todo.append(((*at, str(k)), v))
    return out


class Sources:
    """Where each key of a composed config was set. The layers apply in this order, later ones winning: group
    files (each under its group's key), the command's file, then ``key=value`` overrides."""

    def __init__(self) -> None:
        self._groups: list[tuple[KeyPath, YamlDoc]] = []
        self._top: list[tuple[KeyPath, YamlDoc]] = []
        self._overrides: list[tuple[KeyPath, set[KeyPath]]] = []

    def add_group(self, group: str, doc: YamlDoc) -> None:
        self._groups.append(((group,), doc))

    def set_top(self, doc: YamlDoc) -> None:
        self._top = [((), doc)]

    def add_override(self, key: str, value: Any) -> None:
        self._overrides.append(((), _set_paths(key_path(key), value)))

    def _find(self, key: KeyPath, exact: bool) -> tuple[bool, str | None]:
        layers: list[tuple[KeyPath, YamlDoc | set[KeyPath]]] = [*self._groups, *self._top, *self._overrides]
        for under, layer in reversed(layers):
            if key[: len(under)] != under:
                continue
            rel = key[len(under) :]
            keys = layer if isinstance(layer, set) else layer.positions.keys()
            if rel in keys or (not exact and any(rel[:end] in keys for end in range(1, len(rel)))):
                return True, None if isinstance(layer, set) else layer.where(rel)
        return False, None

    def where(self, key: str) -> str | None:
        """``FILE:LINE:COLUMN`` of the file that set ``key`` last, or None where an override set it (its text names
        it) or no layer did."""
        path = key_path(key)
        for exact in (True, False):
            found, place = self._find(path, exact)
            if found:
                return place
        return None

    def where_named(self, message: str) -> str | None:
        """The place of the first key a message names that some layer set (a range check names its keys). A key
        is a word the message starts with, or one with a '.', '_' or '[' in it or an '=' after it (not prose)."""
        for match in _KEY_TOKEN.finditer(message):
            token = match.group()
            if (
                match.start()
                and not any(c in token for c in "._[")
                and not message.startswith("=", match.end())
            ):
                continue
            found, place = self._find(key_path(token), exact=True)
            if found:
                return place
        return None
