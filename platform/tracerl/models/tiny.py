"""The built-in tiny policy: an offline byte-level BPE tokenizer and a small Llama-architecture LM.

Everything is built locally (no hub): the tokenizer is trained on the supervised traces themselves
(digits split one per token, so copying and arithmetic-by-tool work on digits), the model is a
standard ``LlamaForCausalLM`` (loads with ``AutoModelForCausalLM.from_pretrained``; vLLM serves it),
warm-started by supervised fine-tuning on rendered ReAct traces with tool/observation tokens masked
out of the loss. Reproducible from a seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

EOS = "<|endoftext|>"
PAD = "<|pad|>"


class TinyShape(Protocol):
    """The sizes ``build_model`` reads (``tracerl bootstrap``'s config has them)."""

    @property
    def seed(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def intermediate_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def max_positions(self) -> int: ...


@dataclass(frozen=True)
class Segment:
    """A piece of a training trace; only ``trainable`` segments contribute to the loss."""

    text: str
    trainable: bool


def build_tokenizer(texts: Sequence[str], vocab_size: int = 1024) -> Any:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    Returns:
        A ``PreTrainedTokenizerFast`` with EOS/PAD set and left padding (for batched generation).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # padding_side must be given to the constructor: an attribute set later is lost on save/reload.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, padding_side="left", model_max_length=2048
    )


def build_model(tokenizer: Any, spec: TinyShape) -> Any:
    """A freshly initialised LlamaForCausalLM sized by ``spec`` (seeded by ``spec.seed``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def encode_trace(tokenizer: Any, segments: Sequence[Segment], max_len: int) -> tuple[list[int], list[int]]:
    """Token ids and loss labels (-100 on non-trainable tokens) of a segmented trace, EOS appended."""
    ids: list[int] = []
    labels: list[int] = []
    for seg in segments:
        t = tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        ids += t
        labels += t if seg.trainable else [-100] * len(t)
    ids.append(tokenizer.eos_token_id)
    labels.append(tokenizer.eos_token_id)
    return ids[:max_len], labels[:max_len]


def supervised_finetune(
    model: Any,
    examples: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    time_budget_s: float | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """AdamW with a warm-up-stable-decay schedule on masked next-token loss; returns the loss curve.

    Stops early when ``time_budget_s`` runs out (the schedule is still the one for ``steps``).
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    # Warm-up, stable, decay (WSD): 5 % linear warm-up, constant, then linear decay to 10 % over the last 15 %.
    warm, decay_from = max(1, steps // 20), int(steps * 0.85)

    def lr_scale(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        if s < decay_from:
            return 1.0
        return 1.0 - 0.9 * (s - decay_from) / max(steps - decay_from, 1)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, len(examples), (batch_size,), generator=gen).tolist()
        batch = [examples[i] for i in idx]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((batch_size, width), pad_id)
        labels = torch.full((batch_size, width), -100)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for r, (x, y) in enumerate(batch):  # right padding for training
            ids[r, : len(x)] = torch.tensor(x)
            labels[r, : len(y)] = torch.tensor(y)
            mask[r, : len(x)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, losses[-1])
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
    model.eval()
    return losses
