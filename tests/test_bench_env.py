"""``tracerl bench env``: gold replay through the real engine (scripted sampler), the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import TOOL_TIMEOUT_S
from tracerl.config import SamplerConfig, env_config
from tracerl.engine.react import ChatTemplate, PlainTemplate
from tracerl.envs.math.config import MathEnvConfig
from tracerl.envs.sandbox import SandboxConfig
from tracerl.samplers import SAMPLERS
from tracerl.samplers.scripted import ByteTokenizer, ScriptedSampler
from tracerl.workflows.bench.env import gold_engine, summarize
from tracerl.workflows.cli.app import main


def test_scripted_sampler_follows_each_context_and_flags_unknown_ones() -> None:
    tok = ByteTokenizer()
    s = SAMPLERS.get("scripted")(tok)
    assert isinstance(s, ScriptedSampler)
    s.add_script("Q1\n", ["a1", "a2"])
    s.add_script("Q2\n", ["b1"])
    g = s.generate([tok("Q2\n")["input_ids"], tok("Q1\n")["input_ids"]], 100, (), 0.0, [0, 1])
    assert [x.text for x in g] == ["b1", "a1"] and g[1].token_ids == list(b"a1") and g[1].finish == "stop"
    nxt = s.generate([tok("Q1\na1 Observation: x\n")["input_ids"]], 100, (), 0.0, [0])
    assert nxt[0].text == "a2"
    done = s.generate(
        [tok("Q1\na1 Observation: x\na2 Observation: y\n")["input_ids"], tok("nope")["input_ids"]],
        100,
        (),
        0.0,
        [0, 1],
    )
    assert [x.text for x in done] == ["", ""] and s.misses == 1  # script over; an unknown context


def test_math_gold_replay_scores_1() -> None:
    from tracerl.envs.math.env import MathEnv

    # a generous tool time limit: a replayed cell must not time out on a busy machine
    cfg = env_config(
        name="math",
        math=MathEnvConfig(num_tasks=10, eval_tasks=10, sandbox=SandboxConfig(timeout_s=TOOL_TIMEOUT_S)),
    )
    env = MathEnv.from_config(cfg)
    prompts = MathEnv.prompts(cfg, held_out=True)
    engine = gold_engine(env, prompts, "plain", SamplerConfig())
    out = summarize(engine.rollout(prompts, [1] * len(prompts)))
    assert out["score"] == 1.0 and out["n"] == 10 and len(out["by_category"]) >= 3
    # The chat format replays too (ChatML without a tokenizer's template).
    engine = gold_engine(env, prompts[:3], "chat", SamplerConfig())
    assert summarize(engine.rollout(prompts[:3], [1] * 3))["score"] == 1.0
    assert isinstance(engine.template, ChatTemplate) and not isinstance(engine.template, PlainTemplate)


def test_cli_bench_env_search_gold_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "gold.json"
    assert main(["bench", "env", "search", "--gold", "--tasks", "40", "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    assert {"env", "mode", "n", "score", "by_category"} <= set(out)
    assert (out["env"], out["mode"], out["n"], out["score"]) == ("search", "gold", 40, 1.0)
    assert set(out["by_category"]) == {"generated-H2", "generated-H3", "generated-H4"}
    assert out["scores"] == {"em": 1.0, "f1": 1.0} and out["unscripted_contexts"] == 0
