"""Command configs that compose the train config (``train: TrainConfig``, flattened) rather than subclass it: the
loader routes flat keys into the flattened field, names keys as users write them, and ``to_yaml`` writes the flat
form back. First the mechanism on small dataclasses, then the three commands that use it on their shipped YAML."""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from tracerl.config import TrainConfig
from tracerl.config_loader import ConfigError, compose, conf_dir, to_flat_dict, to_yaml
from tracerl.schema import check_flat_keys, flat_routes, flattened
from tracerl.workflows.bench.config import BenchTrainConfig
from tracerl.workflows.pipeline.config import BenchPipelineConfig
from tracerl.workflows.study.config import SweepConfig


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
    ("text", "overrides", "place", "message"),
    [
        ("zzz: 1\n", [], "1:1", "unknown config key 'zzz'; allowed at the top level: a, sub, own, names"),
        ("", ["zzz=1"], None, "unknown config key 'zzz'; allowed at the top level: a, sub, own, names"),
        (
            "",
            ["inner.a=1"],
            None,
            "unknown config key 'inner.a'; allowed at the top level: a, sub, own, names",
        ),
        (
            "inner: {a: 1}\n",
            [],
            "1:1",
            "unknown config key 'inner'; allowed at the top level: a, sub, own, names",
        ),
        ("sub: {y: 1}\n", [], "1:7", "unknown config key 'sub.y'; allowed under 'sub': x, kind"),
        ("", ["sub.y=1"], None, "unknown config key 'sub.y'; allowed under 'sub': x, kind"),
        ("sub: {kind: c}\n", [], "1:7", "sub.kind must be one of 'a', 'b' (got 'c')"),
        ("", ["a=abc"], None, "bad value for 'a'"),
        ("a: abc\n", ["sub.x=1"], "1:1", "bad value for 'a'"),
        ("a: abc\n", ["a=def"], None, "bad value for 'a'"),  # the override set it last
    ],
)
def test_bad_keys_are_named_as_users_write_them(
    tmp_path: Path, text: str, overrides: list[str], place: str | None, message: str
) -> None:
    """A key a file set is reported at its line and column in that file; one an override set, by name alone."""
    path = _conf(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        compose(Outer, path, overrides, root=tmp_path)
    assert str(err.value).startswith(f"{path}:{place}: {message}" if place else message), str(err.value)


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


COMMANDS = [
    (SweepConfig, "sweep/default.yaml", ["budget.num_leaves=60", "allocator=grpo", "num_samples=2"]),
    (SweepConfig, "sweep/smoke.yaml", ["env=search", "env.search.top_k=5", "budget.num_leaves=30"]),
    (BenchTrainConfig, "bench/train.yaml", ["allocators=[trace]", "steps=5", "seed=3"]),
    (BenchPipelineConfig, "bench/pipeline.yaml", ["train_steps=3", "modes=[]", "pipeline.overlap=true"]),
]


@pytest.mark.parametrize(("schema", "path", "overrides"), COMMANDS)
def test_the_commands_hold_a_train_config_load_their_yaml_and_reload_what_they_save(
    schema: type, path: str, overrides: list[str], tmp_path: Path
) -> None:
    cfg = compose(schema, conf_dir() / path, overrides)
    assert isinstance(cfg.train, TrainConfig) and not isinstance(cfg, TrainConfig)
    text = to_yaml(cfg)
    keys = list(yaml.safe_load(text))
    assert keys == list(flat_routes(schema)) and "train" not in keys  # train's keys first, then the command's
    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    assert compose(schema, saved) == cfg
    assert to_flat_dict(cfg)["budget.num_leaves"] == cfg.train.budget.num_leaves


def test_overrides_reach_the_train_config() -> None:
    sweep = compose(SweepConfig, conf_dir() / "sweep/default.yaml", COMMANDS[0][2])
    assert (sweep.train.budget.num_leaves, sweep.train.allocator.name, sweep.num_samples) == (60, "grpo", 2)
    smoke = compose(SweepConfig, conf_dir() / "sweep/smoke.yaml", COMMANDS[1][2])
    env = smoke.train.env
    assert env.name == "search" and type(env.sections()["search"]).__name__ == "SearchEnvConfig"
    assert env.sections()["search"].top_k == 5
    bench = compose(BenchTrainConfig, conf_dir() / "bench/train.yaml", COMMANDS[2][2])
    assert (bench.allocators, bench.train.steps, bench.train.seed) == (["trace"], 5, 3)
    pipe = compose(BenchPipelineConfig, conf_dir() / "bench/pipeline.yaml", COMMANDS[3][2])
    assert (pipe.train_steps, pipe.modes, pipe.train.pipeline.overlap) == (3, [], True)


@pytest.mark.parametrize(
    ("schema", "path", "overrides", "message"),
    [
        (SweepConfig, "sweep/default.yaml", ["env=simulator"], "needs a ReAct tool environment"),
        (BenchPipelineConfig, "bench/pipeline.yaml", ["env=simulator"], "needs a ReAct tool environment"),
        (
            BenchTrainConfig,
            "bench/train.yaml",
            ["allocators=[oracle_trace]"],
            "(allocator=oracle_trace) needs",
        ),
        (SweepConfig, "sweep/default.yaml", ["budget.num_leaves=50"], "budget.num_leaves=50 must be"),
        (
            SweepConfig,
            "sweep/default.yaml",
            ["space={budget.continuations: [4]}"],
            "choice 4: L = budget.num_leaves = 48",
        ),
        (BenchTrainConfig, "bench/train.yaml", ["resume=abc"], "bench train starts fresh runs"),
        (
            SweepConfig,
            "sweep/default.yaml",
            ["budget.nope=1"],
            "unknown config key 'budget.nope'; allowed under",
        ),
    ],
)
def test_the_train_configs_checks_apply_through_the_flattened_field(
    schema: type, path: str, overrides: list[str], message: str
) -> None:
    """TrainConfig's declarations (``tool_env_only``), its range checks, the component checks (the bench's
    ``allocators`` against the train config's ``env``) and the command's own checks of train keys."""
    with pytest.raises(ConfigError) as err:
        compose(schema, conf_dir() / path, overrides)
    assert message in str(err.value)


def test_bench_train_runs_its_train_config_with_each_allocator_and_seed() -> None:
    from tracerl.workflows.bench.train import run_configs

    cfg = compose(BenchTrainConfig, conf_dir() / "bench/train.yaml", ["seeds=2", "seed=4"])
    runs = run_configs(cfg)
    assert [(name, seed) for name, seed, _ in runs] == [("trace", 4), ("trace", 5), ("grpo", 4), ("grpo", 5)]
    for name, seed, tc in runs:
        assert type(tc) is TrainConfig and tc.allocator.name == name and tc.seed == seed
        assert tc.run_name is not None and tc.run_name.startswith(f"bench-{name}-s{seed}-")
        same = dataclasses.replace(tc, allocator=cfg.train.allocator, seed=4, run_name=None)
        assert same == cfg.train  # everything else is the bench's train config


def test_the_command_line_spells_keys_flat(capsys: pytest.CaptureFixture[str]) -> None:
    """``tracerl bench train allocators=[trace] --steps 5`` and ``tracerl config sweep budget.num_leaves=60``."""
    from tracerl.workflows.cli.app import build_parser, load, main

    cfg = load(
        "bench train", build_parser().parse_args(["bench", "train", "allocators=[trace]", "--steps", "5"])
    )
    assert (cfg.allocators, cfg.train.steps) == (["trace"], 5)
    assert main(["config", "sweep", "budget.num_leaves=60"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["budget"]["num_leaves"], printed["num_samples"]) == (60, 4)
    assert list(printed) == list(flat_routes(SweepConfig))
