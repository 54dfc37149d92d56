"""``tracerl register``: a training run's checkpoint as a version in the MLflow Model Registry.

The run's last checkpoint (HF directory) is logged under the run as an MLflow pyfunc model whose
artifact ``checkpoint`` is the HF directory (stored as artifacts/policy), so a registered version loads both ways:
``mlflow.pyfunc.load_model("models:/NAME@ALIAS").predict(["question"])`` generates, and
``download_artifacts("models:/NAME@ALIAS")/artifacts/policy`` opens with
``AutoModelForCausalLM.from_pretrained``. The version carries lineage tags: git SHA, config hash,
dataset fingerprint, checkpoint step and the predictor checkpoint logged beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc

from tracerl.config import TrackingConfig
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking.checkpoint_files import newest_good
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.runs import run_storage


# mlflow's package does not export mlflow.pyfunc.PythonModel to mypy (name-defined), so the base is Any (misc).
class HFPolicyModel(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """A transformers causal LM from the ``checkpoint`` artifact; ``predict`` generates greedily from prompts."""

    def load_context(self, context: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # slow to import: transformers

        path = context.artifacts["checkpoint"]
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> list[str]:
        import torch  # slow to import: torch (only a loaded model predicts)

        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        max_new = int((params or {}).get("max_new_tokens", 64))
        out = []
        for p in prompts:
            ids = self.tokenizer(str(p), return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                gen = self.model.generate(
                    **ids,
                    max_new_tokens=max_new,
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                )
            out.append(
                str(self.tokenizer.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
            )
        return out


def _checkpoint(
    run_id: str, tracking: Any, say: Callable[[str], None] = lambda s: None
) -> tuple[Path, CheckpointState]:
    """The run's newest complete checkpoint; ``say`` gets a line for each damaged newer one passed over."""
    storage = run_storage(run_id, tracking)
    choice = newest_good(storage)
    if choice.path is None:
        damaged = "; ".join(f"{p.name}: {why}" for p, why in choice.skipped)
        raise FileNotFoundError(
            f"run {run_id} has no complete checkpoint under {storage} "
            + (
                f"(damaged: {damaged}): resume the run to write new ones, or point model.path at another"
                if damaged
                else "yet (checkpoints are written every checkpoint_every steps and at the end)"
            )
        )
    for line in choice.notes():
        say(line)
    return choice.path, CheckpointState.read(choice.path)


def register(
    run_id: str,
    name: str,
    alias: str | None,
    tracking_uri: str,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Log the run's last checkpoint as a model and register it; returns {'version', 'source', 'tags'}."""
    tracking = TrackingConfig(uri=tracking_uri)
    trk.setup(tracking)
    ckpt, state = _checkpoint(run_id, tracking, progress)
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    progress(f"logging {ckpt} (step {state.step}) as a model of run {run_id}")
    with mlflow.start_run(run_id=run_id):
        client.log_artifact(run_id, str(ckpt / "predictor.pt"), f"checkpoint_step{state.step}")
        info = mlflow.pyfunc.log_model(
            name="policy",
            python_model=HFPolicyModel(),
            artifacts={"checkpoint": str(ckpt / "policy")},
            pip_requirements=["torch", "transformers", "mlflow"],
        )
    client.set_terminated(
        run_id, status=run.info.status
    )  # re-opening the run to log must not change its status
    tags = {
        "git_sha": run.data.tags.get("tracerl.git_sha", "unknown"),
        "config_hash": run.data.tags.get("tracerl.config_hash", "unknown"),
        "dataset_fingerprint": run.data.tags.get("tracerl.dataset_fingerprint", "unknown"),
        "allocator": run.data.tags.get("tracerl.allocator", "unknown"),
        "checkpoint_step": str(state.step),
        "predictor_checkpoint": f"runs:/{run_id}/checkpoint_step{state.step}/predictor.pt",
        "source_run": run_id,
    }
    mv = mlflow.register_model(info.model_uri, name, tags=tags)
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    return {"version": int(mv.version), "source": info.model_uri, "tags": tags}


def resolve_model_path(path: str, tracking: Any, say: Callable[[str], None] = lambda s: None) -> str:
    """A local HF checkpoint directory for ``path``: a directory, ``runs:/RUN_ID`` (the run's newest complete
    checkpoint; ``say`` names the damaged newer ones) or ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION``
    (downloaded from the registry)."""
    if path.startswith("runs:/"):
        ckpt, _ = _checkpoint(path[len("runs:/") :].strip("/"), tracking, say)
        return str(ckpt / "policy")
    if path.startswith("models:/"):
        trk.setup(tracking)
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=path))
        except mlflow.exceptions.MlflowException as exc:
            names = sorted(m.name for m in mlflow.MlflowClient().search_registered_models())
            raise FileNotFoundError(
                f"{path} is not in the registry at {tracking.uri} ({exc.message}); registered "
                f"models: {', '.join(names) or 'none'} (`tracerl register RUN_ID --name NAME "
                f"--alias ALIAS` adds one)"
            ) from exc
        # pyfunc models keep their artifacts under artifacts/<source directory name>
        for cand in [local, *sorted(local.glob("artifacts/*")), *sorted(local.glob("*"))]:
            if (cand / "config.json").is_file() and any(cand.glob("*.safetensors")) | any(cand.glob("*.bin")):
                return str(cand)
        raise FileNotFoundError(f"{path} holds no HF checkpoint (looked in {local})")
    return path
