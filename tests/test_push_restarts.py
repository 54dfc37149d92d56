"""A vLLM engine that cannot load pushed weights in place (the CPU build) restarts on a checkpoint of them at every
push: each restart's temporary checkpoint is removed at the next restart, at the pool's shutdown and at exit; the
pool counts the restarts, the driver logs them as ``sampler/engine_restarts`` once a step and warns once a run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tracerl import metrics as M
from tracerl.models.buckets import pack
from tracerl.samplers import vllm as vllm_mod
from tracerl.samplers.hf import HFSampler
from tracerl.samplers.vllm import VLLMSampler
from tracerl.workflows.train.push import EngineRestarts

TINY = ROOT / "models" / "tiny-math"
REASON = "NotImplementedError: repacked linear weights"


class FakeEngine:
    """A fake vLLM engine (test double) that refuses every in-place load, as the CPU build does, and records its
    shutdown."""

    def __init__(self, model: str = "") -> None:
        self.model, self.down = model, False

    async def collective_rpc(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("repacked linear weights")

    async def reset_prefix_cache(self) -> None:
        return None

    def shutdown(self) -> None:
        self.down = True


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[FakeEngine]:
    """Engines restart as fakes (recorded, in start order); temporary directories are made under ``tmp_path``."""
    engines: list[FakeEngine] = []

    async def start(kwargs: dict[str, Any], counter: Any) -> FakeEngine:
        engines.append(FakeEngine(kwargs["model"]))
        return engines[-1]

    monkeypatch.setattr(vllm_mod, "_start_engine", start)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return engines


def _sampler(engine: FakeEngine) -> VLLMSampler:
    from transformers import AutoTokenizer

    return VLLMSampler(engine, AutoTokenizer.from_pretrained(TINY), path=str(TINY))


def _push(s: VLLMSampler, scale: float) -> str | None:
    tensors = [("a", torch.full((4, 8), scale)), ("b", torch.arange(6.0) * scale)]
    for b in pack(iter(tensors), torch.bfloat16, 64):
        s.load_bucket(b)
    return s.end_push()


def _weights_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("tracerl-vllm-weights-*"))


def test_each_restart_removes_the_previous_checkpoint_and_close_removes_the_last(
    started: list[FakeEngine], tmp_path: Path
) -> None:
    first = FakeEngine()
    s = _sampler(first)
    assert _push(s, 1.0) == REASON and s.restarts == 1 and first.down
    (one,) = _weights_dirs(tmp_path)
    assert (
        started[0].model == str(one) and (one / "config.json").is_file()
    )  # the original's config beside them
    assert torch.equal(load_file(one / "model.safetensors")["b"], torch.arange(6.0, dtype=torch.bfloat16))
    assert _push(s, 2.0) == REASON and s.restarts == 2 and started[0].down
    (two,) = _weights_dirs(
        tmp_path
    )  # the first restart's checkpoint is gone once the engine runs on the second
    assert two != one and started[1].model == str(two)
    assert torch.equal(
        load_file(two / "model.safetensors")["a"], torch.full((4, 8), 2.0, dtype=torch.bfloat16)
    )
    s.close()
    assert _weights_dirs(tmp_path) == [] and started[1].down


def test_an_engine_that_does_not_start_leaves_no_checkpoint_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def broken(kwargs: dict[str, Any], counter: Any) -> None:
        raise RuntimeError("no memory for the KV cache")

    monkeypatch.setattr(vllm_mod, "_start_engine", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    s = _sampler(FakeEngine())
    with pytest.raises(RuntimeError, match="no memory for the KV cache"):
        _push(s, 1.0)
    assert _weights_dirs(tmp_path) == [] and s.restarts == 0


EXITS = """
import sys, tempfile
from types import SimpleNamespace
import torch
from tracerl.models.buckets import pack
from tracerl.samplers import vllm

class FakeEngine:  # a fake vLLM engine (test double): refuses in-place loads
    async def collective_rpc(self, *a, **k):
        raise NotImplementedError("repacked linear weights")
    def shutdown(self):
        pass

async def start(kwargs, counter):
    return FakeEngine()

vllm._start_engine = start
tempfile.tempdir = sys.argv[2]
s = vllm.VLLMSampler(FakeEngine(), SimpleNamespace(eos_token_id=None), path=sys.argv[1])
for b in pack(iter([("a", torch.ones(3))]), torch.bfloat16, 64):
    s.load_bucket(b)
print(s.end_push(), s._weights_dir, flush=True)
"""


def test_the_last_restarts_checkpoint_is_removed_when_the_process_exits(tmp_path: Path) -> None:
    original = tmp_path / "policy"  # a checkpoint's config alone (no tokenizer or transformers to load)
    original.mkdir()
    (original / "config.json").write_text("{}")
    out = subprocess.run(
        [sys.executable, "-c", EXITS, str(original), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    reason, _, where = out.stdout.strip().rpartition(" ")
    assert reason == REASON and where.startswith(str(tmp_path / "tracerl-vllm-weights-"))
    assert not Path(where).exists() and _weights_dirs(tmp_path) == []


class FakePool:
    """A fake sampler pool (test double) with the counts ``ShardedPool`` keeps."""

    engine_restarts = 0
    restart_reason: str | None = None


def test_restarts_are_logged_per_step_and_warned_about_once_a_run(tmp_path: Path) -> None:
    said: list[str] = []
    pool = FakePool()
    log = EngineRestarts(tmp_path, said.append)
    assert log.metrics(pool) == {M.ENGINE_RESTARTS: 0.0} and said == []  # in place: nothing to say
    pool.engine_restarts, pool.restart_reason = 2, REASON  # two samplers restarted on a push
    assert log.metrics(pool) == {M.ENGINE_RESTARTS: 2.0}
    pool.engine_restarts = 5  # the next push, and a replaced sampler that caught up
    assert log.metrics(pool) == {M.ENGINE_RESTARTS: 3.0}
    assert log.metrics(pool) == {M.ENGINE_RESTARTS: 0.0}  # a step without a push
    again = EngineRestarts(tmp_path, said.append)  # a restarted trainer (a new pool) or a resumed run
    assert again.metrics(FakePool()) == {M.ENGINE_RESTARTS: 0.0}
    assert again.metrics(pool) == {M.ENGINE_RESTARTS: 5.0}
    assert len(said) == 1 and REASON in said[0] and M.ENGINE_RESTARTS in said[0]
    assert said[0].startswith("tracerl: warning: a sampler's vLLM engine cannot load pushed weights in place")


class FakeRestartingSampler(HFSampler):
    """A fake engine sampler (test double): the hf sampler, whose ``end_push`` says what a vLLM engine that restarted
    on the push says (``sampler.backend=tests.test_push_restarts:FakeRestartingSampler``)."""

    def end_push(self) -> str:
        return REASON


@pytest.mark.e2e  # two in-process launches of a run: `make test-e2e`
def test_a_run_logs_its_restarts_once_a_step_and_warns_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """An in-process smoke run of 2 steps, then resumed for a third (its restored policy is pushed at start)."""
    from tests.conftest import UNHURRIED, sqlite_client
    from tracerl.workflows.cli.app import main

    args = [
        "train",
        "--config",
        str(ROOT / "conf" / "train" / "smoke.yaml"),
        "cluster=inprocess",
        "sampler.backend=tests.test_push_restarts:FakeRestartingSampler",
        "steps=2",
        "eval_at_start=false",
        "eval_at_end=false",
        f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracking.artifact_location={tmp_path}/art",
        *UNHURRIED,
        "--out",
        str(tmp_path / "runs"),
    ]
    assert main(args) == 0
    first = capfd.readouterr().out
    client = sqlite_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    rid = run.info.run_id
    assert main([*args, "steps=3", f"resume={rid}"]) == 0
    second = capfd.readouterr().out
    history = [(m.step, m.value) for m in client.get_metric_history(rid, M.ENGINE_RESTARTS)]
    # one sampler, one restart a push; step 3 also counts the push of the restored policy at the resume's start
    assert sorted(history) == [(1, 1.0), (2, 1.0), (3, 2.0)]
    warning = "tracerl: warning: a sampler's vLLM engine cannot load pushed weights in place"
    assert (first + second).count(warning) == 1 and first.count(warning) == 1


def test_a_vllm_sampler_actor_loads_the_tokenizer_alone_and_refuses_to_export(
    started: list[FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampler actor (``RolloutWorker``, here in the in-process pool) of the vllm backend never builds the HF model
    (its engine is a fake, and building an HF model raises); pushes restart the fake engine, the pool counts them,
    and its shutdown removes the restart's checkpoint."""
    from transformers import AutoModelForCausalLM

    from tracerl.actors.local import LocalPool
    from tracerl.actors.spec import WorkerSpec
    from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig

    def no_hf_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a sampler actor built the HF model")

    def engine_sampler(cls: Any, model_cfg: Any, cfg: Any, model: Any, tok: Any, gpus: float = 1.0) -> Any:
        assert model is None
        return cls(FakeEngine(), tok, path=model_cfg.path)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_hf_model)
    monkeypatch.setattr(VLLMSampler, "from_config", classmethod(engine_sampler))

    def spec(backend: str) -> WorkerSpec:
        sampler = SamplerConfig(backend=backend)
        return WorkerSpec(
            ModelConfig(path=str(TINY)), sampler, EnvConfig(name="math"), PoolConfig(env_workers=0)
        )

    with pytest.raises(AssertionError, match="built the HF model"):
        LocalPool(spec("hf"), 1, seed=0)  # the hf backend needs it (so the patch would catch a vllm actor)
    pool = LocalPool(spec("vllm"), 2, seed=0)
    worker = pool.worker
    assert worker.model is None and isinstance(worker.sampler, VLLMSampler)
    assert worker.tok.pad_token_id is not None and worker.sampler.tokenizer is worker.tok
    for push in (1, 2):
        pool.push(pack(iter([("a", torch.ones(3) * push)]), torch.bfloat16, 64), 64)
        assert pool.engine_restarts == push and pool.restart_reason == REASON
    assert len(_weights_dirs(tmp_path)) == 1
    with pytest.raises(RuntimeError, match="sampler.backend=vllm holds no HF copy of the policy to export"):
        worker.export_bucket(0, 1 << 20)
    pool.shutdown()
    assert _weights_dirs(tmp_path) == [] and started[-1].down
