"""A scripted sampler: each path's next turn is the next turn of a reference script (gold replay).

``tracerl bench env --gold`` writes an environment's reference turns (``gold_turns``) as model text and
replays them through the real ``TreeRolloutEngine``: the template parses them, the environment runs the
calls and grades the answer, exactly as for a policy. The sampler recognises which script and turn a
context belongs to by token prefix: a script is registered under its encoded prompt, and each turn it
returns registers ``context + turn tokens`` as the prefix of the following turn (the engine appends
the observation after it). A context that matches no registered prefix, or a script that has run out
of turns, gets an empty turn (the template turns it into an error observation). A turn whose text ends on the
tokenizer's EOS token (``tracerl sft``'s reference traces in a chat template) finishes as 'eos', as a model's would.

``ByteTokenizer`` (one token per UTF-8 byte) makes the replay independent of any model: token counts
are bytes, and decoding is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tracerl.engine.config import SamplerConfig
from tracerl.engine.protocol import ToolEnv
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.engine.templates import TurnTemplate
from tracerl.models.config import ModelConfig
from tracerl.samplers.base import SAMPLERS, Generation
from tracerl.types import Prompt


class ByteTokenizer:
    """A model-free tokenizer with the slice of the HF interface the engine uses (one token per byte)."""

    eos_token_id = 256
    pad_token_id = 257

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@SAMPLERS.register("scripted")
class ScriptedSampler:
    """Implements the ``Sampler`` protocol by returning each path's next scripted turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self._prefixes: dict[
            int, dict[tuple[int, ...], tuple[int, int]]
        ] = {}  # len -> prefix -> (script, turn)
        self.scripts: list[list[str]] = []
        self.misses = 0
        """Contexts that matched no script (should stay 0 in a gold replay)."""

    @classmethod
    def from_config(
        cls, model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0
    ) -> ScriptedSampler:
        """An empty replay on ``tokenizer``: give it scripts with ``add_script``."""
        return cls(tokenizer)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _register(self, prefix: Sequence[int], script: int, turn: int) -> None:
        self._prefixes.setdefault(len(prefix), {})[tuple(prefix)] = (script, turn)

    def add_script(self, prompt_text: str, turns: Sequence[str]) -> None:
        """Replay ``turns`` (model text) for contexts that start with the encoding of ``prompt_text``."""
        self.scripts.append(list(turns))
        self._register(self._encode(prompt_text), len(self.scripts) - 1, 0)

    def _lookup(self, context: Sequence[int]) -> tuple[int, int] | None:
        for n in sorted(self._prefixes, reverse=True):  # the longest registered prefix is the latest turn
            if n <= len(context):
                hit = self._prefixes[n].get(tuple(context[:n]))
                if hit is not None:
                    return hit
        return None

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seeds: Sequence[int],
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        """The next scripted turn of each context (an empty 'eos' turn where there is none). A script is
        deterministic: the seeds are checked (one per context) but draw nothing."""
        if len(seeds) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts need one seed each, got {len(seeds)} seeds")
        out = []
        for ctx in contexts:
            hit = self._lookup(ctx)
            if hit is None or hit[1] >= len(self.scripts[hit[0]]):
                self.misses += hit is None
                out.append(Generation([], [], "", "eos", prefill_tokens=len(ctx)))
                continue
            script, turn = hit
            text = self.scripts[script][turn]
            ids = self._encode(text)
            self._register([*ctx, *ids], script, turn + 1)
            finish = "stop" if len(ids) <= max_new_tokens else "length"
            if finish == "stop" and ids and ids[-1] == getattr(self.tok, "eos_token_id", None):
                finish = (
                    "eos"  # a scripted turn that ends on the tokenizer's EOS ended as a model's turn does
                )
            out.append(Generation(ids, [0.0] * len(ids), text, finish, prefill_tokens=len(ctx)))
        return out


def prompt_text(env: ToolEnv, template: TurnTemplate, prompt: Prompt) -> str:
    """The prompt as the engine renders it (with the tools of the task's initial state)."""
    return str(template.prompt(prompt.text, env.tools_for(prompt, env.initial_state(prompt))))


def replay_engine(
    env: ToolEnv,
    prompts: Sequence[Prompt],
    template: TurnTemplate,
    tokenizer: Any,
    limits: SamplerConfig,
    turn_end: str = "",
) -> TreeRolloutEngine:
    """A ``TreeRolloutEngine`` whose scripted sampler replays each prompt's ``env.gold_turns`` written by
    ``template``, each turn followed by ``turn_end`` (a chat model's end-of-turn token: the turn then ends on EOS,
    as the model's own turns do). Token limits are lifted, ``max_turns`` is at least the longest script and
    sampling is greedy; the sampler's ``misses`` counts contexts that matched no script (0 in a sound replay).

    Raises:
        ValueError: the environment has no ``gold_turns`` (``Env.gold_turns``'s default).
    """
    sampler = ScriptedSampler(tokenizer)
    longest = 1
    for p in prompts:
        turns = [turn + turn_end for turn in env.gold_turns(p, template)]
        longest = max(longest, len(turns))
        sampler.add_script(prompt_text(env, template, p), turns)
    big = 10**8
    limits = replace(
        limits,
        max_turns=max(limits.max_turns, longest),
        max_turn_tokens=big,
        max_episode_tokens=big,
        max_context_tokens=big,
        temperature=0.0,
    )
    return TreeRolloutEngine(sampler, env, template, tokenizer, limits)
