"""Command configs that compose the train config (``train: TrainConfig``, flattened) rather than subclass it: the
loader routes flat keys into the flattened field, names keys as users write them, and ``to_yaml`` writes the flat
form back. First the mechanism on small dataclasses, then the three commands that use it on their shipped YAML."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from tracerl.config_loader import ConfigError, compose, to_flat_dict, to_yaml
from tracerl.schema import check_flat_keys, flat_routes, flattened


@dataclass(frozen=True)
class Sub:
    x: int = 1
    kind: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Inner:
    a: int = 1
    sub: Sub = field(default_factory=Sub)


@check_flat_keys
@dataclass(frozen=True)
class Outer:
    inner: Inner = flattened(Inner)
    own: int = 0
    names: list[str] = field(default_factory=lambda: ["p"])


def _conf(tmp_path: Path, text: str) -> Path:
    """A conf/ root with the group file sub/big.yaml, and a command YAML holding ``text``."""
    (tmp_path / "sub").mkdir(exist_ok=True)
    (tmp_path / "sub" / "big.yaml").write_text("x: 9\n")
    path = tmp_path / "outer.yaml"
    path.write_text(text)
    return path


def test_flat_keys_route_into_the_flattened_field(tmp_path: Path) -> None:
    assert dict(flat_routes(Outer)) == {
        "a": ("inner", "a"),
        "sub": ("inner", "sub"),
        "own": ("own",),
        "names": ("names",),
    }
    path = _conf(tmp_path, "a: 2\nsub: {kind: b}\nown: 4\n")
    cfg = compose(Outer, path, ["sub.x=5", "names=[q, r]"], root=tmp_path)
    assert cfg == Outer(inner=Inner(a=2, sub=Sub(x=5, kind="b")), own=4, names=["q", "r"])
    # a group file (from defaults, or swapped by an override) lands in the flattened field too
    path = _conf(tmp_path, "defaults: {sub: big}\n")
    assert compose(Outer, path, root=tmp_path).inner.sub == Sub(x=9)
    assert compose(Outer, _conf(tmp_path, ""), ["sub=big"], root=tmp_path).inner.sub == Sub(x=9)


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("zzz: 1\n", [], "unknown config key 'zzz'; allowed at the top level: a, sub, own, names"),
        ("", ["zzz=1"], "unknown config key 'zzz'; allowed at the top level: a, sub, own, names"),
        ("", ["inner.a=1"], "unknown config key 'inner.a'; allowed at the top level: a, sub, own, names"),
        ("inner: {a: 1}\n", [], "unknown config key 'inner'; allowed at the top level: a, sub, own, names"),
        ("sub: {y: 1}\n", [], "unknown config key 'sub.y'; allowed under 'sub': x, kind"),
        ("", ["sub.y=1"], "unknown config key 'sub.y'; allowed under 'sub': x, kind"),
        ("sub: {kind: c}\n", [], "sub.kind must be one of 'a', 'b' (got 'c')"),
        ("", ["a=abc"], "bad value for 'a'"),
    ],
)
def test_bad_keys_are_named_as_users_write_them(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        compose(Outer, _conf(tmp_path, text), overrides, root=tmp_path)
    assert str(err.value).startswith(message), str(err.value)


def test_a_key_in_both_the_command_and_its_flattened_config_fails_at_definition() -> None:
    with pytest.raises(
        TypeError, match="config key 'a' of Clash is both Clash.inner \\(Inner\\)'s and Clash's"
    ):

        @check_flat_keys
        @dataclass(frozen=True)
        class Clash:
            inner: Inner = flattened(Inner)
            a: int = 0

    with pytest.raises(TypeError, match="Bad.inner is flattened but holds no dataclass"):

        @check_flat_keys
        @dataclass(frozen=True)
        class Bad:
            inner: int = field(default=0, metadata={"flatten": True})


def test_to_yaml_writes_the_flat_form_and_it_reloads(tmp_path: Path) -> None:
    cfg = Outer(inner=Inner(a=3, sub=Sub(x=7, kind="b")), own=2)
    text = to_yaml(cfg)
    assert list(yaml.safe_load(text)) == ["a", "sub", "own", "names"]
    assert to_flat_dict(cfg) == {"a": 3, "sub.x": 7, "sub.kind": "b", "own": 2, "names": ["p"]}
    assert compose(Outer, _conf(tmp_path, text), root=tmp_path) == cfg
