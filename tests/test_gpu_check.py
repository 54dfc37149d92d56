"""The GPU check kit (workflows/experiments/gpu_check.py) in its CPU dry mode, its memory formula and its missing-package paths."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.workflows.experiments import gpu_check
from tracerl.workflows.ops import gpu_plan

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"environment", "update", "memory", "lora_update", "generation_exact", "generation", "total_s"}


def numbers(x: Any) -> list[float]:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return []
    if isinstance(x, (int, float)):
        return [float(x)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in numbers(v)]
    if isinstance(x, list):
        return [n for v in x for n in numbers(v)]
    return []


def test_dry_run_writes_every_section_without_ray_or_mlflow(tmp_path: Path) -> None:
    """The script's own entry point in a fresh interpreter: every section ok, finite numbers, nothing imported that
    a bare CUDA machine with torch, transformers and peft lacks (Ray, MLflow, vLLM, omegaconf, optuna)."""
    out = tmp_path / "gpu.json"
    code = (
        "import sys, json; from tracerl.workflows.experiments.gpu_check import main; rc = main(['--json', sys.argv[1]]); "
        "gone = ('ray', 'mlflow', 'vllm', 'omegaconf', 'optuna'); "
        "print(json.dumps({'rc': rc, 'loaded': [m for m in gone if m in sys.modules]}))"
    )
    env = {
        **os.environ,
        "GPU_CHECK_DRY": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    tail = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tail == {"rc": 0, "loaded": []}
    data = json.loads(out.read_text())
    assert set(data) == SECTIONS
    assert {k: v["status"] for k, v in data.items()} == {
        "environment": "ok",
        "update": "ok",
        "memory": "ok: no CUDA, estimate only",
        "lora_update": "ok",
        "generation_exact": "ok",
        "generation": "ok",
        "total_s": "ok",
    }
    assert all(math.isfinite(n) for n in numbers(data))
    plan = data["environment"]["plan"]
    assert (
        plan["dry"] is True and plan["arch"]["num_hidden_layers"] == 2 and plan["arch"]["hidden_size"] == 64
    )
    upd = data["update"]
    assert upd["tokens_per_step"] == 2 * 128 and upd["tokens_per_s"] > 0 and upd["update_skipped"] is False
    assert upd["loss"] != 0.0 and upd["grad_norm"] > 0
    assert upd["device"] == "cpu"
    lora = data["lora_update"]
    assert lora["trainable"] < lora["params"] / 10
    assert lora["memory"]["estimate_bytes"]["adam"] == 8 * lora["trainable"]
    est = data["memory"]["estimate_bytes"]
    assert est["peak"] >= est["weights"] + est["grads"] + est["adam"] > 0
    assert data["generation_exact"]["dtype"] == data["generation"]["dtype"] == "float32"
    gen = data["generation"]
    assert gen["max_abs_logprob_diff"] <= gen["tolerance"] == 1e-3
    assert gen["continuation"]["reused_tokens"] > 0.7 * (2 * (24 + 8 + 6))
    assert gen["first_turn"]["tokens_per_s"] > 0 and gen["continuation"]["tokens_per_s"] > 0


def test_memory_estimate_of_the_gpu_plan() -> None:
    """Qwen3-1.7B's parameter count from the committed config, and the formula's terms for the plan run on CUDA."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    arch = gpu_plan.load_arch()
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(Qwen3Config(**arch)).parameters())
    assert (
        params == 1_720_574_976
    )  # 28 x 50.34 M + the tied 151936 x 2048 embedding (counted once) + final norm
    plan = gpu_plan.make_plan(dry=False, cuda=True, arch=arch)
    assert (plan.seq_len, plan.micro_batch) == (4096, 1)
    assert (plan.sampler_dtype, plan.logprob_tol) == ("bfloat16", 0.5)
    assert (gpu_plan.exact(plan).sampler_dtype, gpu_plan.exact(plan).logprob_tol) == ("float32", 1e-3)
    est = gpu_plan.memory_estimate(params, params, 28, 2048, 6144, 151936, plan.micro_batch, plan.seq_len)
    assert est["weights"] == 4 * params and est["adam"] == 8 * params
    assert est["checkpoints"] == 4 * 28 * 4096 * 2048
    assert est["logits"] == 20 * 4096 * 151936
    assert est["peak"] == sum(
        est[k] for k in ("weights", "grads", "adam", "checkpoints", "layer_recompute", "logits")
    )
    assert 35e9 < est["peak"] < 60e9  # fits an 80 GB GPU with room to spare


def test_a_missing_package_is_a_section_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No transformers: every model section says so, nothing raises, the JSON is written."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    data = gpu_check.run(tmp_path / "g.json", dry=True)
    for name in ("update", "lora_update", "generation_exact", "generation"):
        assert data[name] == {"status": "missing: transformers"}
    assert data["memory"] == {"status": "skipped: no update measured"}
    assert data["environment"]["transformers"] is None
    assert json.loads((tmp_path / "g.json").read_text()) == json.loads(json.dumps(data))


def test_missing_peft_skips_only_the_lora_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fakes for the measured sections (the plumbing is under test); the JSON is on disk before each next section."""
    out = tmp_path / "g.json"

    def fake_update(plan: Any, lora: bool) -> dict[str, Any]:
        assert not lora and "environment" in json.loads(out.read_text())
        return {"status": "ok", "params": 1000, "trainable": 1000, "peak_bytes": None}

    def fake_generation(plan: Any) -> dict[str, Any]:
        assert {"update", "memory", "lora_update"} <= set(json.loads(out.read_text()))
        raise RuntimeError("sampler broke")

    monkeypatch.setitem(sys.modules, "peft", None)
    monkeypatch.setattr(gpu_check, "run_update", fake_update)
    monkeypatch.setattr(gpu_check, "run_generation", fake_generation)
    data = gpu_check.run(out, dry=True)
    assert data["lora_update"] == {"status": "missing: peft"}
    assert data["update"]["status"] == "ok" and data["memory"]["estimate_bytes"]["weights"] == 4000
    assert data["generation_exact"] == data["generation"] == {"status": "error: RuntimeError: sampler broke"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the real check would run")
def test_without_cuda_the_full_check_reports_it(tmp_path: Path) -> None:
    data = gpu_check.run(tmp_path / "g.json", dry=False)
    assert data["update"]["status"].startswith("missing: cuda (GPU_CHECK_DRY=1")
    assert data["generation"]["status"] == data["update"]["status"]
