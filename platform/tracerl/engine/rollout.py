"""Tree rollouts of a language-model ReAct agent: bare episodes and continuations from stored prefixes.

All running paths advance one turn per round: the sampler generates a turn for every running path
in one batch, the template parses each, the environment answers tool calls, and each turn becomes
a node (model tokens, then observation tokens masked as non-model). A continuation starts from a
stored prefix node: its context (prompt + turns so far, tokens verbatim, observations included) and
environment state are re-used; nothing before the prefix is regenerated or re-executed there.
Multi-turn tasks (``ToolEnv.on_answer``): a turn without calls may get the next user message instead of
ending the episode; tools may differ per task and per user turn (``ToolEnv.tools_for``).

Limits (``SamplerConfig``) end episodes with a status: ``max_turns`` turns, ``max_episode_tokens``
generated tokens, or the model's context window. The ledger counts generated tokens, prefill tokens computed vs re-used,
LLM calls, tool calls and replayed tool calls. Grading is bounded by the environment (``env.reward_timeout_s``): a
grade past it ends the episode with status ``grade_timeout`` and reward 0, counted in the ledger. Observations are
made encodable (lone surrogates replaced) before they are tokenized.

Seeds (``tracerl.engine.seeds``): every turn is generated with its own seed, keyed by (run seed, ``step``, prompt
id, path, turn), so the same seed gives the same trees however the work is batched, sharded or ordered.
``step`` is None for evaluation. Prompts rolled out in one step must have distinct ids.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.algos.allocators import Expansion
from tracerl.engine.config import SamplerConfig
from tracerl.engine.generation import Generation, Sampler
from tracerl.engine.join import JoinRun
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.paths import drives_per_path, stream_in_process_async
from tracerl.engine.protocol import AnswerResult, ToolEnv, ToolResult
from tracerl.engine.react import Action, ActionKind, TurnTemplate
from tracerl.engine.seeds import SeedKey, continuations_at, path_identity
from tracerl.engine.stream import OnBare, stream_in_process
from tracerl.engine.untrusted import encodable
from tracerl.grading import GradeTimeout
from tracerl.tree import RolloutTree
from tracerl.types import Node, Prompt, Status


@dataclass
class _Path:
    tree: RolloutTree
    path_id: int
    parent: int
    context: list[int]
    state: Any
    turns: int
    generated: int
    key: tuple[int, ...]
    """The path's identity (``seeds.path_identity``): with the turn, it keys the seed of each turn."""
    cache: object | None = None


@dataclass
class ForkState:
    """Per-node data the LM engine keeps on the tree so continuations can start there."""

    context: list[int] = field(default_factory=list)
    """Prompt and turns up to this node, tokens verbatim (observations included)."""
    state: Any = None
    """The environment state after this node."""
    generated: int = 0
    """Tokens the episode had generated up to here."""
    cache: object | None = None
    """The sampler's KV-cache handle for the context up to this node's model tokens."""


class TreeRolloutEngine:
    """Implements the step driver's ``TreeBackend`` for a language-model policy and a tool environment."""

    def __init__(
        self,
        sampler: Sampler,
        env: ToolEnv,
        template: TurnTemplate,
        tokenizer: Any,
        limits: SamplerConfig,
        seed: int = 0,
        step: int | None = 0,
    ) -> None:
        self.sampler, self.env, self.template, self.tok = sampler, env, template, tokenizer
        self.limits = limits
        self.batch_size = limits.batch_size
        self.seed = seed
        self.step = step
        """The RL step the next rollouts belong to (part of every turn's seed); None for evaluation."""
        self.ledger = BudgetLedger()
        if limits.join and not hasattr(sampler, "join_batch"):
            raise ValueError(
                f"sampler.join=true needs a backend with a per-token join (hf); {limits.backend} has none: "
                "set sampler.join=false"
            )
        self._join: JoinRun | None = None

    def begin_step(self, step: int) -> None:
        """Rollouts from now on belong to RL step ``step`` (part of every turn's seed); a fresh ledger counts them."""
        self.step, self.ledger = step, BudgetLedger()

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(encodable(text), add_special_tokens=False)["input_ids"])

    def _start(self, tree: RolloutTree, bare: bool, node_id: int = 0, index: int = 0) -> _Path:
        """A new path from ``node_id`` (the root: a bare rollout; else its ``index``-th continuation there)."""
        if node_id == 0 and 0 not in tree.fork_state:
            state = self.env.initial_state(tree.prompt)
            prompt_ids = self._encode(
                self.template.prompt(tree.prompt.text, self.env.tools_for(tree.prompt, state))
            )
            tree.prompt_token_ids = prompt_ids
            tree.fork_state[0] = ForkState(prompt_ids, state, 0)
        ex = tree.fork_state[node_id]
        node = tree.nodes[node_id]
        cache = ex.cache
        # A child that already ran past this node holds a cache covering the node's whole context
        # (its observation included); the sampler uses the shared prefix of any handle.
        for c in node.children:
            child = tree.fork_state.get(c)
            if child is not None and child.cache is not None:
                cache = child.cache
                break
        pid = tree.new_path(bare)
        key = path_identity(tree, node_id, pid if node_id == 0 else index)
        return _Path(tree, pid, node_id, list(ex.context), ex.state, node.depth, ex.generated, key, cache)

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        trees = [RolloutTree(p) for p in prompts]
        paths = [self._start(t, True) for t, m in zip(trees, counts) for _ in range(int(m))]
        self._run(paths)
        return trees

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        self._run(self.expansion_paths(trees, expansions))

    def stream(self, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare) -> list[RolloutTree]:
        """Streaming step (``pipeline.mode=streaming``, engine/stream.py): each tree's expansion joins the
        running rounds (per path with an async sampler: engine/paths.py) as soon as ``on_bare`` decides it."""
        if drives_per_path(self):
            return stream_in_process_async(self, prompts, counts, on_bare)
        return stream_in_process(self, prompts, counts, on_bare)

    def expansion_paths(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> list[_Path]:
        """The new paths of ``expansions``: every tree's extra bare rollouts, then its continuations."""
        paths = [self._start(t, True) for t, ex in zip(trees, expansions) for _ in range(ex.extra_bare)]
        for t, ex in zip(trees, expansions):
            started: dict[int, int] = {}  # continuations started here per node (the index of the next one)
            for node_id, k in zip(ex.node_ids, ex.counts):
                n = int(node_id)
                if t.nodes[n].is_leaf:
                    raise ValueError(f"cannot continue from leaf node {node_id}")
                for _ in range(int(k)):
                    started[n] = started.get(n, continuations_at(t, n)) + 1
                    paths.append(self._start(t, False, n, started[n]))
        return paths

    def _run(self, paths: list[_Path]) -> None:
        """Advance every path until all have ended: one turn per round, or with ``sampler.join`` each path's turns
        back to back in one running batch (engine/join.py).

        A round generates a turn for all running paths (``_generate``), so each tree's nodes are created in the
        same order however many paths run at once or how they are sharded over workers."""
        while paths:
            paths = self.advance(paths)

    def advance(self, paths: list[_Path]) -> list[_Path]:
        """One round of ``paths`` (streaming: the caller adds new paths between rounds); those that go on. With
        ``sampler.join``, until one of their trees has no path left running (engine/join.py)."""
        if not self.limits.join:
            return self._round(paths)
        if self._join is None:
            self._join = JoinRun(self)
        try:
            return self._join.advance(paths)
        except BaseException:  # a failed step leaves nothing half-run for the next one
            self._join.close()
            self._join = None
            raise

    def _round(self, paths: list[_Path]) -> list[_Path]:
        """One turn of every path in ``paths``; returns those that go on."""
        led = self.ledger
        budget = [self.turn_budget(p) for p in paths]
        live = [p for p, b in zip(paths, budget) if b > 0]
        for p, b in zip(paths, budget):
            if b <= 0:
                self.close(p)
        if not live:
            return []
        gens = self._generate(live, [b for b in budget if b > 0])
        actions = [self.parse(p, g) for p, g in zip(live, gens)]
        # Every tool call of the round in one batch (a pooled environment runs them in parallel).
        t0 = time.perf_counter()
        calls = [i for i, a in enumerate(actions) if a.kind is ActionKind.TOOL]
        results = dict(
            zip(
                calls,
                self.env.execute_batch([(live[i].tree.prompt, live[i].state, actions[i]) for i in calls])
                if calls
                else [],
            )
        )
        led.phase_s["tools"] = led.phase_s.get("tools", 0.0) + time.perf_counter() - t0
        return [p for i, (p, g) in enumerate(zip(live, gens)) if self._turn(p, g, actions[i], results.get(i))]

    def turn_budget(self, p: _Path) -> int:
        """How many tokens path ``p``'s next turn may generate (<= 0: no room left for a turn)."""
        lim = self.limits
        return min(
            lim.max_turn_tokens, lim.max_episode_tokens - p.generated, lim.max_context_tokens - len(p.context)
        )

    def close(self, p: _Path) -> None:
        """End path ``p`` without generating: no room left for a turn (``turn_budget`` <= 0)."""
        lim = self.limits
        full = lim.max_context_tokens - len(p.context) <= 0
        self._leaf(p, [], [], "", Status.CONTEXT_OVERFLOW if full else Status.MAX_TOKENS, 0.0)

    def parse(self, p: _Path, g: Generation) -> Action:
        """Path ``p``'s generated turn as an action (the tools of its task and state)."""
        tools = self.env.tools_for(p.tree.prompt, p.state)
        return self.template.parse(g.text, tools, truncated=g.finish == "length")

    def seed_key(self, p: _Path) -> SeedKey:
        """The key of path ``p``'s next turn (``tracerl.engine.seeds``)."""
        return SeedKey(self.seed, self.step, p.tree.prompt.prompt_id, p.key, p.turns + 1)

    def _generate(self, live: list[_Path], caps: list[int]) -> list[Generation]:
        """The next turn of each path, in sampler calls of at most ``batch_size`` paths with the same token
        budget ``caps[i]``, each path with its own seed: a turn depends on its seed key, not on its batch."""
        t0 = time.perf_counter()
        out: list[Generation | None] = [None] * len(live)
        groups: dict[int, list[int]] = {}
        for i, cap in enumerate(caps):
            groups.setdefault(cap, []).append(i)
        for cap, idx in sorted(groups.items(), reverse=True):
            for j in range(0, len(idx), self.batch_size):
                chunk = [live[i] for i in idx[j : j + self.batch_size]]
                gens = self.sampler.generate(
                    [p.context for p in chunk],
                    cap,
                    self.template.stop,
                    self.limits.temperature,
                    [self.seed_key(p).value() for p in chunk],
                    caches=[p.cache for p in chunk],
                )
                lengths = [len(g.token_ids) for g in gens]
                self.ledger.decode_steps += max(lengths, default=0)
                self.ledger.decode_rows += sum(lengths)
                for i, g in zip(idx[j : j + self.batch_size], gens):
                    out[i] = _cap(g, cap, self.tok)
        gens = [g for g in out if g is not None]
        led = self.ledger
        led.sampler_busy_s += time.perf_counter() - t0
        led.llm_calls += len(live)
        led.prefill_tokens_computed += sum(g.prefill_tokens for g in gens)
        led.prefill_tokens_reused += sum(g.reused_tokens for g in gens)
        led.phase_s["generate"] = led.phase_s.get("generate", 0.0) + time.perf_counter() - t0
        return gens

    def _turn(
        self,
        p: _Path,
        g: Generation,
        action: Action,
        res: ToolResult | None,
        answered: Answered | None = None,
    ) -> bool:
        """Apply one generated turn (its parsed action, the tool's result and, for an answer, ``answered``: what
        ``grade`` said, else graded here) to path ``p``; True if it goes on."""
        lim, led = self.limits, self.ledger
        led.generated_tokens += len(g.token_ids)
        p.generated += len(g.token_ids)
        p.cache = g.cache
        follow, reward = None, None
        if action.kind is ActionKind.ANSWER:
            follow, reward = answered if answered is not None else self._answer(p, action)
        if reward is not None:
            timed_out = reward.timed_out
            status = Status.GRADE_TIMEOUT if timed_out else Status.ANSWERED
            leaf = self._add(p, g.token_ids, g.logprobs, g.text, [], status, reward.value, g.prefill_tokens)
            if not timed_out:  # a timed-out grade scores 0 on every metric (done in _add)
                self._score(p, leaf, action.answer)
            p.tree.fork_state[leaf.node_id] = ForkState(cache=p.cache)  # siblings forking above may re-use it
            return False
        if follow is not None and follow.observation is not None:  # a multi-turn task's next user message
            obs_text, p.state = _user_message(self.template, follow.observation), follow.state
        elif res is not None:
            obs_text, p.state = self.template.observation(res.observation), res.state
            led.tool_calls += res.calls
            led.tool_calls_replayed += res.replayed
            led.tool_timeouts += int(res.timed_out)
            led.retried += res.retried
        else:
            obs_text = self.template.observation(action.error or "Error: invalid action.")
            led.invalid_actions += 1
        # an environment may echo what the model wrote (lone surrogates included)
        sep, obs_text = self._joint(g, encodable(obs_text))
        obs_ids = self._encode(sep + obs_text)
        p.turns += 1
        status = Status.TURN
        if p.turns >= lim.max_turns:
            status = Status.MAX_TURNS
        elif p.generated >= lim.max_episode_tokens:
            status = Status.MAX_TOKENS
        elif len(p.context) + len(g.token_ids) + len(obs_ids) >= lim.max_context_tokens:
            status = Status.CONTEXT_OVERFLOW
        node = self._add(
            p,
            g.token_ids,
            g.logprobs,
            g.text + sep + obs_text,
            obs_ids,
            status,
            0.0 if status.terminal else None,
            g.prefill_tokens,
        )
        if status.terminal:
            p.tree.fork_state[node.node_id] = ForkState(cache=p.cache)
            return False
        p.context = p.context + list(g.token_ids) + obs_ids
        p.tree.fork_state[node.node_id] = ForkState(p.context, p.state, p.generated, p.cache)
        return True

    def _joint(self, g: Generation, obs_text: str) -> tuple[str, str]:
        """What follows turn ``g`` before the next message: (separator, the message's text).

        The plain template starts an observation on a new line. A chat template's message (``observation``,
        ``user_message``) is the rendered text after the assistant's content, so it starts with the end-of-turn
        marker: a turn that ended on it (the tokenizer's EOS, kept as a model token) is followed by the rest, so
        the context is the conversation exactly as the chat template renders it."""
        if getattr(self.template, "newline_before_observation", True):
            return ("" if g.text.endswith("\n") or not g.text else "\n"), obs_text
        eos = self.tok.eos_token_id
        if g.finish == "eos" and g.token_ids and g.token_ids[-1] == eos:
            marker = str(self.tok.decode([eos]))
            if marker and obs_text.startswith(marker):
                return "", obs_text[len(marker) :]
        return "", obs_text

    def _answer(self, p: _Path, action: Action) -> Answered:
        """``grade`` counted in the ledger (a timed-out grade in ``budget/grade_timeouts``, the time as ``grade``)."""
        t0 = time.perf_counter()
        answered = self.grade(p, action)
        self.ledger.grade_timeouts += int(answered[1] is not None and answered[1].timed_out)
        self.ledger.phase_s["grade"] = self.ledger.phase_s.get("grade", 0.0) + time.perf_counter() - t0
        return answered

    def grade(self, p: _Path, action: Action) -> Answered:
        """An ANSWER turn's follow-up (a multi-turn task's next user message) or the episode's reward. Counts
        nothing: the per-path driver (engine/paths.py) runs it on a worker thread.

        Grading runs under ``env.reward_timeout_s`` in the environment; a grade past it is reward 0, flagged."""
        try:
            follow = self.env.on_answer(p.tree.prompt, p.state, action)
            if follow is not None and follow.observation is not None:
                return follow, None
            value = (
                self.env.reward(p.tree.prompt, action.answer)
                if follow is None or follow.reward is None
                else follow.reward
            )
            return follow, _Reward(float(value))
        except GradeTimeout:
            return None, _Reward(0.0, timed_out=True)

    def _add(
        self,
        p: _Path,
        ids: Sequence[int],
        lps: Sequence[float],
        text: str,
        obs_ids: Sequence[int],
        status: Status,
        reward: float | None,
        prefill: int = 0,
    ) -> Node:
        node = p.tree.add_node(
            p.parent,
            p.path_id,
            content=text,
            token_ids=list(ids) + list(obs_ids),
            model_mask=[True] * len(ids) + [False] * len(obs_ids),
            logprobs=list(lps),
            status=status,
            reward=reward,
            prefill_computed=prefill,
        )
        p.parent = node.node_id
        if node.is_leaf and status is not Status.ANSWERED:
            self._score(p, node, None)  # an episode that ended without an answer scores 0 on every metric
        return node

    def _score(self, p: _Path, leaf: Any, answer: str | None) -> None:
        """The environment's ``scores`` hook (answer metrics beyond the reward, e.g. em, f1) on ``leaf``."""
        scores = self.env.scores(p.tree.prompt, answer)
        if scores:
            leaf.scores = {k: float(v) for k, v in scores.items()}

    def _leaf(
        self, p: _Path, ids: Sequence[int], lps: Sequence[float], text: str, status: Status, reward: float
    ) -> Node:
        return self._add(p, ids, lps, text, [], status, reward)


@dataclass(frozen=True)
class _Reward:
    value: float
    timed_out: bool = False


Answered = tuple[AnswerResult | None, _Reward | None]
"""What an answer turn led to: the environment's follow-up, and the episode's reward if it ended."""


def _user_message(template: TurnTemplate, text: str) -> str:
    """``text`` as the next user message (a template without ``user_message`` shows it as an observation)."""
    render = getattr(template, "user_message", None)
    return str(render(text)) if render is not None else template.observation(text)


def _cap(g: Generation, cap: int, tok: Any) -> Generation:
    """A generation cut to this path's own token budget (the batch ran to the largest one)."""
    if len(g.token_ids) <= cap:
        return g
    ids = g.token_ids[:cap]
    return Generation(
        ids, g.logprobs[:cap], tok.decode(ids), "length", g.prefill_tokens, g.reused_tokens, g.cache
    )
