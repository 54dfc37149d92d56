"""Command families: the bench commands that live outside the command rooms (the experiments' ``bench peer``,
``bench limit``, ``bench targets``, ``baseline``, ``testbeds``, ``update``, ``sync`` and ``bench pipeline --sim``) reach the CLI through workflows/cli/families.py, as lazy built-ins or
through an installed package's entry point (group ``tracerl.commands``), and a broken plug-in is left out."""

import argparse
import dataclasses
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_tracerl
from tracerl.config import TrainConfig
from tracerl.config_loader import compose, conf_dir
from tracerl.registry import RegistryError
from tracerl.workflows.cli import app
from tracerl.workflows.cli.app import COMMANDS, build_parser
from tracerl.workflows.cli.args import Variant
from tracerl.workflows.cli.families import load_families, registry
from tracerl.workflows.experiments.commands import FAMILY
from tracerl.workflows.study.config import StudyConfig

TOY = textwrap.dedent(
    """
    from dataclasses import dataclass

    from tracerl.workflows.cli.args import Command, CommandFamily, Shorthand, Variant


    @dataclass(frozen=True)
    class ToyConfig:
        n: int = 1


    def run(cfg):
        print(f"toy ran with n={cfg.n}")
        return 0


    FLAGS = (Shorthand("--n", ("n",), "the toy's number"),)
    FAMILY = CommandFamily({"bench toy": Command(ToyConfig, "bench/toy.yaml", FLAGS, run)}, {"bench toy": "a toy"})
    CLASH = CommandFamily({"bench train": Command(ToyConfig, "bench/toy.yaml", (), run)}, {"bench train": "again"})
    TOP = CommandFamily({"toy": Command(ToyConfig, "bench/toy.yaml", (), run)}, {"toy": "not a bench"})
    ASTRAY = CommandFamily(
        {"bench stray": Command(ToyConfig, "bench/toy.yaml", (), run)},
        {"bench stray": "a stray"},
        after={"bench train": "bench stray"},
    )
    VARIES = CommandFamily(
        {"bench vary": Command(ToyConfig, "bench/toy.yaml", (), run)},
        {"bench vary": "varies train"},
        variants=(Variant("train", lambda cfg: True, run),),
    )
    NOT_A_FAMILY = 3
    """
)


def fake_distribution(root: Path, entry_points: str) -> None:
    """An installed distribution as importlib.metadata finds one (a dist-info on sys.path) with the toy module."""
    (root / "toy_commands.py").write_text(TOY)
    info = root / "toy_commands-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-commands\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tracerl.commands]\n{entry_points}")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s subcommands in the order ``--help`` lists them."""
    return next(a._name_parser_map for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_experiments_are_bench_commands_of_the_cli() -> None:
    moved = {"bench targets", "bench baseline", "bench testbeds", "bench update", "bench sync"}
    assert {"bench peer", "bench limit", *moved} <= set(COMMANDS)
    bench = subcommands(build_parser())["bench"]
    # the family's `after` keeps the moved benches' lines where they were in `tracerl bench --help`
    assert list(subcommands(bench)) == [
        "allocation", "targets", "baseline", "rollout", "train", "pipeline", "testbeds", "update", "sync", "env",
        "peer", "limit",
    ]  # fmt: skip
    args = build_parser().parse_args(["bench", "pipeline", "--sim", "--samplers", "2,4"])
    assert (args.sim, args.samplers) == (True, "2,4")
    args = build_parser().parse_args(["bench", "limit", "--repeats", "2"])
    assert (args.bench, args.repeats) == ("limit", 2)


def test_installed_families_load_and_broken_ones_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_distribution(
        tmp_path,
        "toy = toy_commands:FAMILY\nclash = toy_commands:CLASH\ntop = toy_commands:TOP\n"
        "odd = toy_commands:NOT_A_FAMILY\nmissing = toy_commands:NOPE\nastray = toy_commands:ASTRAY\n"
        "varies = toy_commands:VARIES\nexperiments = toy_commands:FAMILY\n",  # a built-in's name: the built-in wins
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    families = load_families(taken={"bench train"}, found=registry())
    experiments = sorted(
        f"bench {x}" for x in ("peer", "limit", "targets", "baseline", "testbeds", "update", "sync")
    )
    assert [sorted(f.commands) for f in families] == [experiments, ["bench toy"]]
    err = capsys.readouterr().err
    assert "command family 'clash' left out: names commands already taken: bench train" in err
    assert "command family 'top' left out: adds commands outside `tracerl bench`: toy" in err
    assert "command family 'odd' left out: is a int, not a CommandFamily" in err
    assert "command family 'astray' left out: places commands it does not add: bench train" in err
    assert "command family 'missing' (entry point 'toy_commands:NOPE'" in err
    assert (
        "command family 'varies' left out: runs variants of commands (only the built-in families may)" in err
    )


def test_the_experiments_run_in_place_of_train_and_study_for_the_configs_they_claim() -> None:
    (family,) = load_families(taken=COMMANDS.keys() - FAMILY.commands.keys())
    claims = {v.command: v.claims for v in family.variants}
    assert set(claims) == {"train", "study"}
    assert claims["train"](compose(TrainConfig, ROOT / "conf/train/chaos.yaml"))
    assert not claims["train"](compose(TrainConfig, ROOT / "conf/train/smoke.yaml"))
    assert claims["study"](compose(StudyConfig, ROOT / "conf/study/curves.yaml"))
    assert not claims["study"](compose(StudyConfig, ROOT / "conf/study/main.yaml"))


def test_main_runs_a_claiming_variant_with_the_command_s_overrides_and_config_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[object] = []
    variant = Variant(
        "train", lambda cfg: cfg.seed == 7, lambda cfg, over, path: ran.append((over, path)) or 3
    )
    monkeypatch.setattr(app, "VARIANTS", [variant])
    own = dataclasses.replace(COMMANDS["train"], run=lambda cfg: ran.append("train") or 0)
    monkeypatch.setitem(COMMANDS, "train", own)
    assert app.main(["train", "--seed", "7", "steps=2"]) == 3
    assert app.main(["train", "--seed", "1"]) == 0
    assert ran == [(["steps=2", "seed=7"], conf_dir() / "train/default.yaml"), "train"]


def test_a_broken_builtin_family_raises() -> None:
    with pytest.raises(RegistryError, match="command family 'gone' .*failed to load"):
        load_families(taken=(), found=registry({"gone": "tracerl.workflows.no_such_room:FAMILY"}))
    with pytest.raises(
        ValueError, match="command family 'experiments' names commands already taken: bench peer"
    ):
        load_families(taken={"bench peer"}, found=registry())


def test_an_installed_family_runs_from_the_command_line(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "toy = toy_commands:FAMILY\n")
    (tmp_path / "toy.yaml").write_text("n: 2\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "platform")])}
    argv = ["bench", "toy", "--config", str(tmp_path / "toy.yaml"), "--n", "5"]
    run = run_tracerl(*argv, cwd=tmp_path, env=env, timeout=120)
    assert (run.returncode, run.stdout) == (0, "toy ran with n=5\n"), run.stderr
