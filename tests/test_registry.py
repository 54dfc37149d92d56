"""Registries: typed lookup, errors that list the known names, and third-party components found through
Python entry points (a fake installed distribution: a ``*.dist-info`` directory on sys.path)."""

import sys
from pathlib import Path

import pytest

from predictors import PREDICTORS, Predictor, build_predictor
from tracerl.algos.allocators import ALLOCATORS, Allocator, TraceAllocator, build_allocator
from tracerl.config import AllocatorConfig, PredictorConfig
from tracerl.registry import Registry, RegistryError
from tracerl.types import Anchor, Prompt

PLUGIN = """
from predictors.constant import ConstantPredictor
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
