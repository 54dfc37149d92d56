"""`tracerl rollout`'s step loop on every built-in tool environment (math, search, BFCL).

The policy is the ``scripted`` sampler replaying each task's reference turns (``gold_turns``), so no model is
needed and every leaf must score 1: bare rollouts and continuations alike. What is under test is the rollout
workflow around the environment (it once read ``env.sandbox``, which only math has), the trees it writes and its
budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TOOL_TIMEOUT_S, require_bfcl
from tracerl.config import RolloutConfig
from tracerl.config_loader import compose, conf_dir
from tracerl.envs.registry import env_class
from tracerl.metrics import EFFECTIVE_RATIO, LEAVES, SUCCESS_RATE
from tracerl.workflows.bench.env import gold_engine
from tracerl.workflows.lm.rollout import rollout_steps
from tracerl.workflows.lm.stack import LMStack, task_prompts

SMALL = [
    "budget.num_leaves=12",  # M = 4 bare rollouts + 8 continuations
    "budget.group_size=4",
    "budget.pool_factor=2",
    "steps=1",
]
ENVS = {
    "math": ["env=math", "env.math.num_tasks=8", f"env.math.sandbox.timeout_s={TOOL_TIMEOUT_S}"],
    "search": ["env=search", "env.search.num_tasks=8"],
    # One category: BFCL's miss_param/long_context variants render the base task's prompt text, which the
    # scripted sampler keys its scripts by.
    "bfcl": ["env=bfcl", "env.bfcl.categories=[base]", "env.bfcl.num_tasks=8", "env.bfcl.eval_tasks=2"],
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_one_rollout_step_writes_trees_on_every_environment(name: str, tmp_path: Path) -> None:
    if name == "bfcl":
        require_bfcl()
    cfg = compose(
        RolloutConfig, conf_dir() / "rollout" / "math.yaml", [*ENVS[name], *SMALL, f"out_dir={tmp_path}"]
    )
    env = env_class(name).from_config(cfg.env)
    prompts = task_prompts(cfg.env)
    engine = gold_engine(env, prompts, cfg.model.template, cfg.sampler)
    lines: list[str] = []
    result = rollout_steps(cfg, LMStack(engine.tok, None, env, engine), lines.append)

    trees = [json.loads(x) for x in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert sum(len(t["rewards"]) for t in trees) == 12  # L leaves
    assert all(r == 1.0 for t in trees for r in t["rewards"])  # gold replay: every leaf solved
    assert {t["prompt_id"] for t in trees} <= {p.prompt_id for p in prompts}
    assert any(n.get("continuations") for t in trees for n in t["nodes"])  # prefixes were expanded
    assert all(n["tokens"] > 0 for t in trees for n in t["nodes"][1:])  # every turn node holds its tokens
    assert engine.sampler.misses == 0  # every context, continuations included, matched a script
    assert result.metrics[LEAVES] == 12 and result.metrics[SUCCESS_RATE] == 1.0
    assert result.metrics[EFFECTIVE_RATIO] == 0.0  # nothing failed: no tree is mixed
    assert json.loads((tmp_path / "metrics.json").read_text())[LEAVES] == 12
    assert (tmp_path / "trees.html").is_file() and (tmp_path / "config.yaml").is_file()
    assert any(line.startswith("step 0: ") for line in lines)
    assert "12 leaves" in result.format()
