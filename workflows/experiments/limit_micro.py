"""``tracerl bench limit``'s microbenchmarks, each timed in wall and CPU seconds on one torch thread.

On a shared machine a single-threaded computation's CPU seconds are closer to what it would take on an idle core
than its wall seconds (those add the time other processes held the core), so the limit is composed from CPU
seconds and the wall seconds are kept beside them; each is the least of several repeats. CPU seconds still grow
with the load (a shared core's caches and memory bandwidth): on the busy 2-core machine the trainer's CPU seconds
for alike updates ranged 0.5-1.3 s. A tool call's CPU includes its sandboxed process's; a grade's, the grading
worker's.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.workflows.experiments.limit_report import (
    Rates,
    StepCounts,
    decode_flops_per_token,
    fit_tool_cost,
    update_flops,
)


def clock(tree: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds now: CPU of this process's threads, with ``tree`` also of its children (a sandboxed tool
    call's process, the grading worker)."""
    from tracerl.engine.timer import process_tree_cpu_s

    return time.perf_counter(), process_tree_cpu_s() if tree else time.process_time()


def since(t0: tuple[float, float], tree: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds since ``t0`` (a ``clock`` reading with the same ``tree``)."""
    wall, cpu = clock(tree)
    return wall - t0[0], max(0.0, cpu - t0[1])


def fastest(fn: Callable[[], tuple[float, float]], repeats: int) -> tuple[float, float]:
    """The least wall and the least CPU seconds of ``repeats`` calls of ``fn`` (one untimed call before: lazy set-up,
    caches): other processes only ever add time, CPU seconds included (a shared core's caches), so the least is
    the closest to what the hardware takes."""
    fn()
    runs = [fn() for _ in range(repeats)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def _contexts(trees: Sequence[Any], rows: int, length: int) -> Any:
    """``rows`` contexts of ``length`` tokens: the step's prompts (their tokens repeated to the length)."""
    import torch

    prompts = [list(t.prompt_token_ids) for t in trees if t.prompt_token_ids] or [[1]]
    out = []
    for r in range(rows):
        p = prompts[r % len(prompts)]
        out.append((p * (length // len(p) + 1))[:length])
    return torch.tensor(out, dtype=torch.long)


def model_rates(
    model: Any, trees: Sequence[Any], rows: int, context: int, suffix: int, new_tokens: int, repeats: int
) -> dict[str, float]:
    """The model's decode rate (``rows`` rows on a KV cache of ``context`` tokens, ``new_tokens`` forwards of one
    token each) and prefill rate (``rows`` x ``suffix`` tokens in one forward): tokens per CPU second and per wall
    second (the least of the repeats)."""
    import torch

    ids = _contexts(trees, rows, context)
    enc = _contexts(trees, rows, suffix)
    # transformers 5.x names the KV cache `cache` (past_key_values is deprecated); older versions, past_key_values
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def kv(out: Any) -> Any:
        got = out.get("cache")
        return got if got is not None else out.get("past_key_values")

    @torch.no_grad()
    def decode() -> tuple[float, float]:
        mask = torch.ones_like(ids)
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        past, tok = kv(out), out.logits[:, -1:].argmax(-1)
        t0 = clock()
        for _ in range(new_tokens):
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype)], dim=1)
            out = model(input_ids=tok, attention_mask=mask, use_cache=True, **{key: past})
            past, tok = kv(out), out.logits[:, -1:].argmax(-1)
        return since(t0)

    @torch.no_grad()
    def prefill() -> tuple[float, float]:
        t0 = clock()
        model(input_ids=enc, attention_mask=torch.ones_like(enc), use_cache=True)
        return since(t0)

    (dec_w, dec_c), (pre_w, pre_c) = fastest(decode, repeats), fastest(prefill, repeats)
    decoded, encoded = rows * new_tokens, rows * suffix
    return {
        "decode_tokens_per_s": decoded / max(dec_c, 1e-9),
        "prefill_tokens_per_s": encoded / max(pre_c, 1e-9),
        "decode_tokens_per_wall_s": decoded / max(dec_w, 1e-9),
        "prefill_tokens_per_wall_s": encoded / max(pre_w, 1e-9),
        "decode_cpu_s": dec_c,
        "decode_wall_s": dec_w,
        "prefill_cpu_s": pre_c,
        "prefill_wall_s": pre_w,
        "rows": rows,
        "context": context,
        "suffix": suffix,
        "new_tokens": new_tokens,
    }


def update_time(tc: TrainConfig, model: Any, tok: Any, batch: Any, repeats: int) -> dict[str, float]:
    """CPU and wall seconds of ``PolicyLearner.update`` on ``batch`` (a copy of the policy; the run's optimizer,
    loss and micro-batch), and the tokens and padded tokens its micro-batches feed."""
    from tracerl.learner import PolicyLearner, denominator

    learner = PolicyLearner(
        copy.deepcopy(model),
        tc.optim,
        tc.loss,
        tc.steps or 1,
        pad_id=tok.pad_token_id,
        temperature=tc.sampler.temperature,
    )
    den = denominator(batch, tc.loss.aggregation)
    skipped: list[float] = []

    def once() -> tuple[float, float]:
        t0 = clock()
        stats = learner.update(batch, den)
        skipped.append(stats[M.UPDATE_SKIPPED])
        return since(t0)

    wall, cpu = fastest(once, repeats)
    mb = tc.loss.micro_batch_size
    lengths = [len(x) for x in batch.input_ids]
    padded = sum(len(lengths[i : i + mb]) * max(lengths[i : i + mb]) for i in range(0, len(lengths), mb))
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "loss_tokens": float(batch.num_tokens),
        "sequences": float(len(batch)),
        "tokens": float(sum(lengths)),
        "padded_tokens": float(padded),
        "optimizer_skipped": float(max(skipped, default=0.0)),
    }


def tool_costs(env: Any, cells: Sequence[tuple[str, ...]]) -> list[tuple[int, float, float]]:
    """Each recorded tool call run again in ``env``'s sandbox, alone: (cells, wall s, CPU s of the processes that
    launched it and of its sandboxed interpreter, as the call's runner reports it: ``ExecResult.cpu_s``)."""
    out = []
    for c in cells:
        t0 = clock(tree=True)
        result = env.sandbox.run_cells(c)
        wall, cpu = since(t0, tree=True)
        out.append((len(c), wall, cpu + result.cpu_s))
    return out


def grade_costs(env: Any, answers: Sequence[tuple[Any, str | None]]) -> tuple[float, float]:
    """Mean wall and CPU seconds (with the grading worker's) of grading each recorded answer again, in turn."""
    if not answers:
        return 0.0, 0.0
    t0 = clock(tree=True)
    for prompt, answer in answers:
        env.reward(prompt, answer)
    wall, cpu = since(t0, tree=True)
    return wall / len(answers), cpu / len(answers)


def matmul_flops(repeats: int, n: int = 512) -> dict[str, float]:
    """FLOP per CPU and per wall second of an n x n float32 matmul on this thread (the dense peak, for scale)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)

    def once() -> tuple[float, float]:
        t0 = clock()
        for _ in range(10):
            a @ b
        return since(t0)

    wall, cpu = fastest(once, repeats)
    flops = 10 * 2.0 * n**3
    return {"per_cpu_s": flops / max(cpu, 1e-9), "per_wall_s": flops / max(wall, 1e-9)}


@dataclass(frozen=True)
class Micro:
    """The microbenchmarks at the real run's shapes: the model's decode and prefill rates at its batch and context,
    the update of the own step's batch, its tool calls and grades alone, and the machine's matmul rate."""

    model: dict[str, float]
    update: dict[str, float]
    tools: list[tuple[int, float, float]]
    grade_wall_s: float
    grade_cpu_s: float
    matmul: dict[str, float]
    params: int
    layers: int
    hidden: int
    context: float
    ctx: int
    new_tokens: int

    @classmethod
    def measure(
        cls,
        tc: TrainConfig,
        repeats: int,
        own: dict[str, Any],
        counts: StepCounts,
        llm_calls: float,
        reused_per_step: float,
        progress: Callable[[str], None],
    ) -> Micro:
        """Measure at the real run's mean context per sampler call (prefilled + reused tokens over its
        ``llm_calls`` a step), its mean suffix and batch occupancy."""
        context = (counts.prefill_tokens + reused_per_step) / llm_calls
        new_tokens = tc.sampler.max_turn_tokens
        ctx = int(min(max(round(context), 1), tc.sampler.max_context_tokens - new_tokens))
        suffix, rows = max(1, round(counts.prefill_tokens / llm_calls)), max(1, round(counts.occupancy))
        stack = own["stack"]
        progress(
            f"== microbenchmarks: decode/prefill at B={rows}, context {ctx}, suffix {suffix}; update; tools; grades"
        )
        model_r = model_rates(stack.model, own["trees"], rows, ctx, suffix, new_tokens, repeats)
        upd = update_time(tc, stack.model, stack.tokenizer, own["batch"], repeats)
        tools = tool_costs(stack.env, own["cells"])
        grade_wall, grade_cpu = grade_costs(stack.env, own["answers"])
        return cls(
            model=model_r,
            update=upd,
            tools=tools,
            grade_wall_s=grade_wall,
            grade_cpu_s=grade_cpu,
            matmul=matmul_flops(repeats),
            params=sum(p.numel() for p in stack.model.parameters()),
            layers=int(stack.model.config.num_hidden_layers),
            hidden=int(stack.model.config.hidden_size),
            context=context,
            ctx=ctx,
            new_tokens=new_tokens,
        )

    def rates(self, cpu: bool) -> Rates:
        """The rates the limit is composed from, per CPU second (``cpu``) or per wall second."""
        pairs = [(c, x if cpu else w) for c, w, x in self.tools]
        t_call, t_cell = fit_tool_cost(pairs) if pairs else (0.0, 0.0)
        per = "" if cpu else "_wall"
        return Rates(
            decode_tokens_per_s=self.model[f"decode_tokens_per{per}_s"],
            prefill_tokens_per_s=self.model[f"prefill_tokens_per{per}_s"],
            tool_call_s=t_call,
            tool_cell_s=t_cell,
            grade_s=self.grade_cpu_s if cpu else self.grade_wall_s,
            update_s=self.update["cpu_s" if cpu else "wall_s"],
            update_loss_tokens=self.update["loss_tokens"],
        )

    def section(self, own: dict[str, Any], counts: StepCounts) -> dict[str, Any]:
        """The JSON's ``microbench``: every measurement, and the update's and decode's FLOPs against matmul's."""
        upd, model_r = self.update, self.model
        flops_upd = update_flops(
            self.params,
            int(upd["padded_tokens"]),
            self.layers,
            self.hidden,
            upd["tokens"] / upd["sequences"] / 2,
        )
        flops_tok = decode_flops_per_token(
            self.params, self.layers, self.hidden, self.ctx + self.new_tokens / 2
        )
        return {
            "model": model_r,
            "update": upd,
            "update_flops": flops_upd,
            "update_flops_per_cpu_s": flops_upd / max(upd["cpu_s"], 1e-9),
            "decode_flops_per_token": flops_tok,
            "decode_flops_per_cpu_s": flops_tok * model_r["decode_tokens_per_s"],
            "matmul_flops": self.matmul,
            "update_at_matmul_peak_s": flops_upd
            / self.matmul["per_cpu_s"]
            * counts.loss_tokens
            / upd["loss_tokens"],
            "params": self.params,
            "mean_context": self.context,
            "tool_calls": [{"cells": c, "wall_s": w, "cpu_s": x} for c, w, x in self.tools],
            "grades": {
                "answers": len(own["answers"]),
                "wall_s": self.grade_wall_s,
                "cpu_s": self.grade_cpu_s,
            },
            "graded_share_of_leaves": len(own["answers"]) / max(own["sampled_leaves"], 1),
            "torch_threads": 1,
        }
