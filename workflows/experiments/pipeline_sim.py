"""The pipeline scale model (``tracerl bench pipeline --sim``): a discrete-event simulation of one RL step on S
samplers in three modes, from a profile (workflows/experiments/pipeline_profile.py). docs/pipeline_model.md states the model.

Each sampler gets the same kind of work (weak scaling): ``prompts_per_sampler`` prompts, m bare rollouts each,
then m N continuations forked from the bare rollouts' prefixes. The modes differ only in when the continuations
may start and whether the update holds the samplers:

    barrier:   R = max_s bare_s + alloc + max_s cont_s        step = R + between + update + sync
    streaming: a prompt's continuations start alloc after its own bare rollouts end
               R = max_s all_s                                 step = R + between + update + sync
    overlap:   streaming beside the previous update; continuations wait for the new weights too
                                                               step = max(R + between, update + sync)

Samplers are simulated one by one (they share nothing but the barrier, and a sampler's continuation phase does not
depend on when it starts), with the same random draws for every mode and every S: S = 8 is the first 8 samplers of
the S = 64 draw. Two engines: ``rounds`` (the project's TreeRolloutEngine with hf: every running path advances one
turn per round, a round's generate call runs until its longest row stops, then the round's tool calls run over
``tool_workers``; new paths join at the next round) and ``continuous`` (vLLM: rows join and leave per decode
iteration; a joining row's prefill pauses decoding).

Reported per S and mode: step time, rollout time, utilisation (time the sampler computes: decode iterations and
prefill, over S x step), bubble (time it has nothing in flight: waiting at the barrier, for the other samplers, for
allocation or for the update) and mean batch occupancy (rows per decode iteration).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracerl.workflows.experiments.pipeline_profile import Profile

SAMPLERS = (2, 8, 16, 32, 64)
MODES = ("barrier", "streaming", "overlap")


@dataclass
class Path_:
    """One rollout's work: tokens of each turn, the tool latency after each non-final turn, prefill of turn 1,
    and the context length before each turn (what a decode iteration reads from the KV cache)."""

    prompt: int
    bare: bool
    tokens: list[int]
    tools: list[float]
    prefill: int
    ctx: list[int] = field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        """The sequence the learner trains on: context before the last turn plus that turn."""
        return self.ctx[-1] + self.tokens[-1]


@dataclass
class Run:
    """What one sampler did in one engine run (times from the run's start)."""

    finish_s: float = 0.0
    busy_s: float = 0.0
    """Decode iterations, prefill and generate-call overhead."""
    span_s: float = 0.0
    """Time with at least one path in flight (generating, queued or in a tool call)."""
    rows: float = 0.0
    """Sum over decode iterations of the rows in them."""
    iters: float = 0.0


class _Draws:
    """Values of one distribution drawn in blocks (one generator call per block, not per value)."""

    def __init__(self, dist: Any, rng: np.random.Generator, block: int = 1024) -> None:
        self.dist, self.rng, self.block = dist, rng, block
        self.buf: list[float] = []

    def take(self, n: int = 1) -> list[float]:
        while len(self.buf) < n:
            self.buf += self.dist.sample(self.rng, self.block).tolist()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def workload(
    p: Profile, rng: np.random.Generator, first_prompt: int = 0, share: tuple[int, int] | None = None
) -> tuple[list[Path_], list[Path_]]:
    """One sampler's bare rollouts and continuations. With ``share`` = (recorded step, sampler), the episodes
    that sampler actor ran in that step (``Profile.recorded_steps``). Else drawn: a continuation forks a random
    bare rollout of its prompt that has a prefix (>= 2 turns) after a uniform turn d, and runs turns d+1..T' of a
    fresh episode length T' > d; a prompt with no such rollout gets a fresh bare rollout instead (the engine's
    extra bare rollouts)."""
    if share is not None:
        return _recorded(p, rng, first_prompt, share)
    turns, toks, tools = _Draws(p.turns, rng), _Draws(p.turn_tokens, rng), _Draws(p.tool_s, rng)
    final = toks if p.final_turn_tokens is None else _Draws(p.final_turn_tokens, rng)

    def episode(n: int, prompt: int, is_bare: bool, prefill: int, start: int) -> Path_:
        """``n`` turns from a context of ``start`` tokens (the prompt, or a prefix's context): ``n - 1`` that
        end in a tool call, then the last."""
        drawn = toks.take(n) if final is toks else toks.take(n - 1) + final.take()
        tk = [max(1, int(round(x))) for x in drawn]
        ctx = [start]
        for t in tk[:-1]:
            ctx.append(ctx[-1] + t + p.obs_tokens)
        return Path_(prompt, is_bare, tk, tools.take(n - 1), prefill, ctx)

    bare: list[Path_] = []
    cont: list[Path_] = []
    counts = p.bare_per_prompt.sample(rng, p.prompts_per_sampler)
    for q, m_raw in zip(range(first_prompt, first_prompt + p.prompts_per_sampler), counts):
        m = max(1, int(round(float(m_raw))))
        mine = [episode(max(1, int(t)), q, True, p.prompt_tokens, p.prompt_tokens) for t in turns.take(m)]
        bare += mine
        forkable = [b for b in mine if len(b.tokens) >= 2]
        for _ in range(m * p.continuations_per_bare):
            if not forkable:
                cont.append(episode(max(1, int(turns.take()[0])), q, False, p.prompt_tokens, p.prompt_tokens))
                continue
            parent = forkable[int(rng.integers(len(forkable)))]
            d = int(rng.integers(1, len(parent.tokens)))
            total = d + 1
            for _try in range(64):  # T' ~ turns conditioned on T' > d
                t = int(turns.take()[0])
                if t > d:
                    total = t
                    break
            cont.append(episode(total - d, q, False, p.obs_tokens, parent.ctx[d]))
    return bare, cont


def _recorded(
    p: Profile, rng: np.random.Generator, first_prompt: int, share: tuple[int, int]
) -> tuple[list[Path_], list[Path_]]:
    """The episodes of one recorded sampler share: every turn but the last ends in a tool call of a latency drawn
    from ``tool_s`` followed by ``obs_tokens``; a bare rollout starts from ``prompt_tokens`` of prefill, a
    continuation from its prefix's recorded context (``obs_tokens`` of prefill, the rest cached)."""
    assert p.recorded is not None
    rec = p.recorded["steps"][share[0]][share[1]]
    tools = _Draws(p.tool_s, rng)
    out: tuple[list[Path_], list[Path_]] = ([], [])
    for kind, paths in ((True, out[0]), (False, out[1])):
        for prompt, start, tokens in rec["bare" if kind else "cont"]:
            ctx = [int(start)]
            for t in tokens[:-1]:
                ctx.append(ctx[-1] + int(t) + p.obs_tokens)
            prefill = p.prompt_tokens if kind else p.obs_tokens
            tk = [max(1, int(t)) for t in tokens]
            paths.append(Path_(first_prompt + int(prompt), kind, tk, tools.take(len(tk) - 1), prefill, ctx))
    return out


def _makespan(latencies: list[float], workers: int) -> float:
    """Tool calls over ``workers`` parallel workers in the given order (0: all at once)."""
    if not latencies:
        return 0.0
    if workers <= 0 or workers >= len(latencies):
        return max(latencies)
    free = [0.0] * workers
    for lat in latencies:
        heapq.heapreplace(free, free[0] + lat)
    return max(free)


@dataclass
class _State:
    path: Path_
    turn: int = 0
    prefill: int = 0


@dataclass
class _Follow:
    """Continuations released ``delay`` after the last bare rollout of their prompt ends (streaming), and not
    before ``not_before`` (overlap: the new weights)."""

    paths: dict[int, list[Path_]] = field(default_factory=dict)
    delay: float = 0.0
    not_before: float = 0.0
    left: dict[int, int] = field(default_factory=dict)

    def release(self, t: float) -> float:
        return max(t + self.delay, self.not_before)

    def done(self, path: Path_) -> list[Path_]:
        if not path.bare or path.prompt not in self.left:
            return []
        self.left[path.prompt] -= 1
        return self.paths.pop(path.prompt, []) if self.left[path.prompt] == 0 else []


def _follow(bare: list[Path_], cont: list[Path_], delay: float, not_before: float = 0.0) -> _Follow:
    f = _Follow(delay=delay, not_before=not_before)
    for b in bare:
        f.left[b.prompt] = f.left.get(b.prompt, 0) + 1
    for c in cont:
        f.paths.setdefault(c.prompt, []).append(c)
    return f


def run_rounds(p: Profile, paths: list[Path_], follow: _Follow | None = None) -> Run:
    """The rounds engine: every running path generates one turn per round (calls of at most ``max_batch`` rows,
    each as long as its longest row, prefill padded to its longest suffix), then the round's tool calls run."""
    run, t = Run(), p.phase_overhead_s
    run.span_s = t
    seq = itertools.count()
    pending: list[tuple[float, int, Path_]] = []
    active = [_State(x, 0, x.prefill) for x in paths]
    while active or pending:
        while pending and pending[0][0] <= t:
            x = heapq.heappop(pending)[2]
            active.append(_State(x, 0, x.prefill))
        if not active:
            t = pending[0][0]
            continue
        start = t
        for j in range(0, len(active), p.max_batch):
            chunk = active[j : j + p.max_batch]
            b, iters = len(chunk), max(s.path.tokens[s.turn] for s in chunk)
            ctx = max(s.path.ctx[s.turn] for s in chunk) + iters / 2  # rows are left-padded to the longest
            step = p.step_time(b) + p.kv_s_per_token * b * ctx
            dt = p.call_overhead_s + b * max(s.prefill for s in chunk) / p.prefill_tokens_per_s + iters * step
            run.busy_s += dt
            run.rows += b * iters
            run.iters += iters
            t += dt
        calls = [s.path.tools[s.turn] for s in active if s.turn < len(s.path.tokens) - 1]
        t += p.turn_overhead_s * len(active) + _makespan(calls, p.tool_workers)
        run.span_s += t - start
        going = []
        for s in active:
            if s.turn < len(s.path.tokens) - 1:
                s.turn, s.prefill = s.turn + 1, p.obs_tokens
                going.append(s)
            elif follow is not None:
                for x in follow.done(s.path):
                    heapq.heappush(pending, (follow.release(t), next(seq), x))
        active = going
    run.finish_s = t
    return run


def run_continuous(p: Profile, paths: list[Path_], follow: _Follow | None = None) -> Run:
    """The continuous engine: rows join and leave per decode iteration (at most ``max_batch`` decode, the rest
    queue); joining rows' prefill pauses decoding; a row leaves for its tool call and rejoins with its observation.
    Event-driven: between events the batch is constant, so an iteration counter ``g`` stands for every row's
    progress and each row keeps the counter value at which its turn ends."""
    run, t, g = Run(), p.phase_overhead_s, 0
    run.span_s = t
    ctx_sum = 0.0  # context tokens of the decoding rows (at the middle of their turn)
    seq = itertools.count()
    arrivals: list[tuple[float, int, _State, bool]] = [
        (0.0, next(seq), _State(x, 0, x.prefill), False) for x in paths
    ]
    heapq.heapify(arrivals)
    active: list[tuple[int, int, _State]] = []
    waiting: deque[_State] = deque()
    in_tool = 0  # arrivals that are tool calls in flight (the rest are releases, not yet in flight)

    def mid(s: _State) -> float:
        return s.path.ctx[s.turn] + s.path.tokens[s.turn] / 2

    def advance(dt: float, computing: bool) -> None:
        nonlocal t
        if computing:
            run.busy_s += dt
        if computing or active or waiting or in_tool:
            run.span_s += dt
        t += dt

    while True:
        while arrivals and arrivals[0][0] <= t:
            _, _, s, flight = heapq.heappop(arrivals)
            in_tool -= flight
            waiting.append(s)
        pre = 0
        while waiting and len(active) < p.max_batch:
            s = waiting.popleft()
            pre += s.prefill
            ctx_sum += mid(s)
            heapq.heappush(active, (g + s.path.tokens[s.turn], next(seq), s))
        if pre:
            advance(pre / p.prefill_tokens_per_s, True)
            continue  # arrivals may have come during the prefill
        if not active:
            if not arrivals:
                break
            advance(arrivals[0][0] - t, False)
            continue
        b = len(active)
        step = p.step_time(b) + p.kv_s_per_token * ctx_sum
        k = active[0][0] - g
        if arrivals and arrivals[0][0] < t + k * step:
            k = min(k, max(1, math.ceil((arrivals[0][0] - t) / step)))
        g += k
        run.rows += b * k
        run.iters += k
        advance(k * step, True)
        while active and active[0][0] <= g:
            s = heapq.heappop(active)[2]
            ctx_sum -= mid(s)
            if s.turn < len(s.path.tokens) - 1:
                lat = s.path.tools[s.turn]
                s.turn, s.prefill = s.turn + 1, p.obs_tokens
                heapq.heappush(arrivals, (t + lat, next(seq), s, True))
                in_tool += 1
            elif follow is not None:
                for x in follow.done(s.path):
                    heapq.heappush(arrivals, (follow.release(t), next(seq), _State(x, 0, x.prefill), False))
    run.finish_s = t
    return run


@dataclass(frozen=True)
class SamplerDraw:
    """One sampler's runs (barrier's two phases, streaming's and overlap's single runs) and the tokens its paths
    train on."""

    bare: Run
    cont: Run
    stream: Run
    overlap: Run
    trained_tokens: int


def simulate_sampler(
    p: Profile, rng: np.random.Generator, first_prompt: int = 0, share: tuple[int, int] | None = None
) -> SamplerDraw:
    """Overlap starts the step's bare rollouts while the previous update runs (time 0 = both start) and releases
    continuations once the new weights are in (the update timed with this sampler's own share of tokens).
    ``share``: a recorded step's sampler share to run (``workload``)."""
    engine = run_rounds if p.batching == "rounds" else run_continuous
    bare, cont = workload(p, rng, first_prompt, share)
    per_prompt = p.alloc_s / p.prompts_per_sampler  # streaming scores and allocates one prompt at a time
    tokens = sum(x.trained_tokens for x in bare + cont)
    weights_in = _update(p, tokens) + p.weight_sync_s
    return SamplerDraw(
        engine(p, bare),
        engine(p, cont),
        engine(p, bare, _follow(bare, cont, per_prompt)),
        engine(p, bare, _follow(bare, cont, per_prompt, weights_in)),
        tokens,
    )


def _update(p: Profile, tokens: float) -> float:
    return p.update_s + (tokens / p.update_tokens_per_s if p.update_tokens_per_s > 0 else 0.0)


def update_time(p: Profile, draws: list[SamplerDraw]) -> float:
    """The update: fixed seconds plus the tokens of one sampler's share over the learner's speed for that share."""
    return _update(p, float(np.mean([d.trained_tokens for d in draws])))


def step_metrics(p: Profile, draws: list[SamplerDraw]) -> dict[str, dict[str, float]]:
    """Step time, rollout time, utilisation (of the step and of its rollout phase), bubble and occupancy of each
    mode for the samplers in ``draws``."""
    s = len(draws)
    update = update_time(p, draws)
    fixed = p.between_steps_s + update + p.weight_sync_s
    r_b = max(d.bare.finish_s for d in draws) + p.alloc_s + max(d.cont.finish_s for d in draws)
    r_s = max(d.stream.finish_s for d in draws)
    r_o = max(d.overlap.finish_s for d in draws)
    steps = {
        "barrier": (r_b, r_b + fixed),
        "streaming": (r_s, r_s + fixed),
        "overlap": (r_o, max(r_o + p.between_steps_s, update + p.weight_sync_s)),
    }
    out = {}
    for mode, (rollout, step) in steps.items():
        runs = [
            r
            for d in draws
            for r in {"barrier": (d.bare, d.cont), "streaming": (d.stream,)}.get(mode, (d.overlap,))
        ]
        busy = sum(r.busy_s for r in runs)
        iters = sum(r.iters for r in runs)
        out[mode] = {
            "step_s": step,
            "rollout_s": rollout,
            "update_s": update,
            "util": busy / (s * step),
            "rollout_util": busy / (s * rollout),
            "bubble": 1.0 - sum(r.span_s for r in runs) / (s * step),
            "occupancy": sum(r.rows for r in runs) / iters if iters else 0.0,
        }
    return out


def _shares(p: Profile, rng: np.random.Generator, n: int) -> list[tuple[int, int] | None]:
    """Per simulated sampler, the recorded (step, sampler) share it runs: each group of as many samplers as a
    recorded step had runs the shares of one recorded step drawn at random (their work is alike: the same
    policy, the same prompts' difficulty). None for every sampler without ``recorded_steps``."""
    if p.recorded is None:
        return [None] * n
    k, steps = int(p.recorded["samplers"]), len(p.recorded["steps"])
    picks = rng.integers(steps, size=-(-n // k))
    return [(int(picks[i // k]), i % k) for i in range(n)]


METRICS = ("step_s", "rollout_s", "update_s", "util", "rollout_util", "bubble", "occupancy")


def simulate(p: Profile, samplers: tuple[int, ...] = SAMPLERS) -> dict[str, dict[str, list[float]]]:
    """Per mode and metric, the mean over ``p.replications`` draws at each S in ``samplers``."""
    acc: dict[str, dict[str, list[list[float]]]] = {
        m: {k: [[] for _ in samplers] for k in METRICS} for m in MODES
    }
    for rep in range(p.replications):
        rng = np.random.default_rng([p.seed, rep])
        shares = _shares(p, rng, max(samplers))
        draws = [simulate_sampler(p, rng, i * p.prompts_per_sampler, shares[i]) for i in range(max(samplers))]
        for i, n in enumerate(samplers):
            for mode, vals in step_metrics(p, draws[:n]).items():
                for k, v in vals.items():
                    acc[mode][k][i].append(v)
    return {m: {k: [float(np.mean(x)) for x in v] for k, v in d.items()} for m, d in acc.items()}
