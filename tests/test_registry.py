"""Registries: typed lookup, errors that list the known names (the built-ins too, before anything imported them),
lazy built-ins, and third-party components found through Python entry points (a fake installed distribution: a
``*.dist-info`` directory on sys.path)."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tracerl.algos.allocators import ALLOCATORS, Allocator, TraceAllocator, build_allocator
from tracerl.config import AllocatorConfig, PredictorConfig, TrainConfig
from tracerl.config_loader import ConfigError, compose, conf_dir
from tracerl.predictors import PREDICTORS, Predictor, build_predictor
from tracerl.registry import Registry, RegistryError
from tracerl.types import Anchor, Prompt

PLUGIN = """
from tracerl.predictors.constant import ConstantPredictor
from tracerl.algos.allocators import TraceAllocator


class FakeThirdPartyAllocator(TraceAllocator):
    name = "fake_third_party"


class FakeThirdPartyPredictor(ConstantPredictor):
    pass


def broken():
    raise RuntimeError("never")
"""


def fake_distribution(root: Path, entry_points: str) -> None:
    """An installed distribution as importlib.metadata finds one: METADATA and entry_points.txt in a dist-info."""
    (root / "fake_tracerl_plugin.py").write_text(PLUGIN)
    info = root / "fake_tracerl_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tracerl-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_distribution(
        tmp_path,
        "[tracerl.allocators]\nfake_alloc = fake_tracerl_plugin:FakeThirdPartyAllocator\n"
        "broken_alloc = fake_tracerl_plugin:missing_attribute\n\n"
        "[tracerl.predictors]\nfake_pred = fake_tracerl_plugin:FakeThirdPartyPredictor\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_tracerl_plugin", raising=False)
    for reg in (ALLOCATORS, PREDICTORS):  # forget what earlier tests read; restore the built-ins afterwards
        monkeypatch.setattr(reg, "_plugins", None)
        monkeypatch.setattr(reg, "_items", dict(reg._items))
    return tmp_path


def test_entry_points_register_third_party_allocators_and_predictors(plugin_dir: Path) -> None:
    assert "fake_tracerl_plugin" not in sys.modules  # nothing imported before a name is asked for
    alloc = build_allocator(AllocatorConfig(name="fake_alloc"))
    assert type(alloc).__name__ == "FakeThirdPartyAllocator" and isinstance(alloc, TraceAllocator)
    assert "fake_alloc" in ALLOCATORS and ALLOCATORS.get("fake_alloc") is type(alloc)  # loaded once, kept
    pred = build_predictor(PredictorConfig(name="fake_pred", constant_value=0.25))
    assert type(pred).__name__ == "FakeThirdPartyPredictor"
    assert pred.score([Anchor(Prompt("p"))]).tolist() == [0.25]


def test_a_broken_entry_point_says_which_and_why(plugin_dir: Path) -> None:
    with pytest.raises(
        RegistryError, match="allocator 'broken_alloc' .*fake_tracerl_plugin:missing_attribute.*"
    ):
        ALLOCATORS.get("broken_alloc")
    # an unknown name lists built-ins and installed entry points
    with pytest.raises(
        RegistryError, match=r"unknown allocator 'nope'; known: .*broken_alloc, dapo, fake_alloc"
    ):
        ALLOCATORS.get("nope")


def test_builtins_win_over_entry_points_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_distribution(tmp_path, "[tracerl.allocators]\ntrace = fake_tracerl_plugin:FakeThirdPartyAllocator\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ALLOCATORS, "_plugins", None)
    assert ALLOCATORS.plugins()["trace"].value == "fake_tracerl_plugin:FakeThirdPartyAllocator"
    assert ALLOCATORS.get("trace") is TraceAllocator


def test_unknown_names_and_import_paths() -> None:
    reg: Registry[int] = Registry("number")
    reg.add("one", 1)
    with pytest.raises(RegistryError, match="number 'one' is registered twice"):
        reg.add("one", 2)
    with pytest.raises(RegistryError, match=r"unknown number 'two'; known: one \(or give an import path"):
        reg.get("two")
    assert Registry("allocator").get("tracerl.algos.allocators:TraceAllocator") is TraceAllocator
    with pytest.raises(RegistryError, match="module 'tracerl.algos.allocators' has no attribute 'Nope'"):
        Registry("allocator").get("tracerl.algos.allocators:Nope")
    with pytest.raises(RegistryError, match="cannot import module 'no_such_module'"):
        Registry("allocator").get("no_such_module:X")
    assert issubclass(ALLOCATORS.get("grpo"), Allocator) and issubclass(PREDICTORS.get("tabular"), Predictor)


def test_lazy_entries_are_listed_at_once_and_imported_on_first_get() -> None:
    reg: Registry[type] = Registry("number")
    reg.add_lazy("trace", "tracerl.algos.allocators:TraceAllocator")
    reg.add_lazy("missing", "no_such_module_r1:X")
    assert "trace" in reg and reg.names() == ["missing", "trace"]
    with pytest.raises(RegistryError, match=r"unknown number 'nope'; known: missing, trace \(or give"):
        reg.get("nope")
    assert reg.get("trace") is TraceAllocator
    with pytest.raises(
        RegistryError,
        match=r"number 'missing' \('no_such_module_r1:X'\) failed to load: ModuleNotFoundError: .*no_such_module_r1",
    ):
        reg.get("missing")
    with pytest.raises(RegistryError, match="number 'trace' is registered twice"):
        reg.add("trace", int)
    with pytest.raises(ValueError, match="a lazy entry is 'module:attr'"):
        reg.add_lazy("bare", "tracerl.algos.allocators")


BUILT_INS = {  # registry -> (defining module, built-in names its unknown-name message must list)
    "ENVS": ("tracerl.env_registry", "bfcl, math, search, simulator"),
    "PREDICTORS": ("tracerl.predictor", "constant, learned, oracle, tabular"),
    "ALLOCATORS": (
        "tracerl.algos.allocators",
        "dapo, grpo, knapsack, oracle_trace, pcl, trace, trace_debiased",
    ),
    "ADVANTAGES": ("tracerl.algos.advantages", "grpo, node_mc, tree_grpo, tree_subgroup"),
    "LOSSES": ("tracerl.algos.losses", "ppo_clip"),
    "SAMPLERS": ("tracerl.samplers.base", "hf, scripted, vllm"),
    "TEMPLATES": ("tracerl.engine.templates", "chat, plain"),
    "LENGTH_PREDICTORS": ("tracerl.predictors.length", "ridge"),
}


def test_every_registry_lists_its_built_ins_before_anything_imported_them() -> None:
    """In a fresh interpreter that imported only the registries' own modules (no environment or predictor
    module), an unknown name's message lists every built-in (env.name=nope listed none, issue 26)."""
    code = textwrap.dedent(
        f"""
        import importlib, sys
        regs = {{name: getattr(importlib.import_module(mod), name) for name, (mod, _) in {BUILT_INS!r}.items()}}
        loaded = sorted(m for m in sys.modules if m.startswith(("tracerl.envs", "tracerl.predictors.")) and m != "tracerl.predictors.length")
        print("loaded:", loaded)
        for name, reg in regs.items():
            try:
                reg.get("nope")
            except KeyError as exc:
                print(name, "->", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    loaded = [x for x in lines if x.startswith("loaded:")]
    assert (
        loaded and "tracerl.envs.math" not in loaded[0] and "tracerl.predictors.learned" not in loaded[0]
    ), loaded
    said = dict(x.split(" -> ", 1) for x in lines if " -> " in x)
    for name, (_, names) in BUILT_INS.items():
        assert re.search(rf"^unknown .* 'nope'; known: (.*, )?{re.escape(names)}\b", said[name]), (name, said)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "env.name=nope",
            r"env.name='nope': unknown environment 'nope'; known: bfcl, (.*, )?math, search, simulator",
        ),
        (
            "predictor.name=nope",
            r"predictor.name='nope': unknown predictor 'nope'; known: constant, learned, oracle",
        ),
        (
            "allocator.name=nope",
            r"allocator.name='nope': unknown allocator 'nope'; known: dapo, grpo, knapsack",
        ),
    ],
)
def test_an_unknown_component_name_in_a_config_lists_the_built_ins(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose(TrainConfig, conf_dir() / "train/smoke.yaml", [override])


def test_tracerl_train_with_an_unknown_env_says_which_ones_exist() -> None:
    """The issue 26 one-liner in a fresh process: one line, the built-ins listed, exit 2, nothing started."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracerl.workflows.cli",
            "train",
            "--config",
            "conf/train/smoke.yaml",
            "env.name=nope",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "tracerl: config error: env.name='nope': unknown environment 'nope'; known: bfcl, math, search, simulator "
        "(or give an import path 'package.module:attr', installed entry points in group 'tracerl.envs')\n"
    )
