"""A scripted sampler: each path's next turn is the next turn of a reference script (gold replay).

``tracerl bench env --gold`` writes an environment's reference turns (``gold_turns``) as model text and
replays them through the real ``TreeRolloutEngine``: the template parses them, the environment runs the
calls and grades the answer, exactly as for a policy. The sampler recognises which script and turn a
context belongs to by token prefix: a script is registered under its encoded prompt, and each turn it
returns registers ``context + turn tokens`` as the prefix of the following turn (the engine appends
the observation after it). A context that matches no registered prefix, or a script that has run out
of turns, gets an empty turn (the template turns it into an error observation).

``ByteTokenizer`` (one token per UTF-8 byte) makes the replay independent of any model: token counts
are bytes, and decoding is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracerl.engine.config import SamplerConfig
from tracerl.models.config import ModelConfig
from tracerl.samplers.base import SAMPLERS, Generation


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
            out.append(Generation(ids, [0.0] * len(ids), text, finish, prefill_tokens=len(ctx)))
        return out
