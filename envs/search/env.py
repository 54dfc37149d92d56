"""The search environment: multi-hop QA with one ``search`` tool over a local BM25 index.

Tasks are the generated multi-hop world (``tracerl.envs.search.world``; its passages are the corpus) or a
question file (HotpotQA / 2Wiki JSON, Bamboogle CSV, FlashRAG JSONL) with a user-supplied corpus
(FlashRAG / Search-R1 JSONL). A call ``search[query]`` returns the top ``top_k`` passages, numbered.
The reward is exact match, or token F1 at or above a threshold (the paper counts F1 >= 0.3); both EM
and F1 are reported for every answer through the ``scores`` hook.

[choice] Searching is stateless, so the environment forks by snapshot: the state is the tuple of
queries issued so far (for the record), and a continuation simply re-uses it; nothing is replayed.

The retriever is a *shared service*: ``services(env_cfg)`` names it and how to build it, a run
builds it once (one Ray actor, ``tracerl.actors.services``) and hands it to ``from_config`` in every
environment actor; without one (no Ray, ``pools.env_workers=0``) ``from_config`` builds it in-process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from tracerl.engine.gold import gold_turn_texts, no_gold
from tracerl.engine.protocol import ToolEnv, ToolResult
from tracerl.engine.react import Action, ToolSpec
from tracerl.envs.search.config import SearchEnvConfig
from tracerl.envs.search.datasets import load_qa_file
from tracerl.envs.search.index import BM25Retriever, read_corpus
from tracerl.envs.search.reward import qa_scores
from tracerl.envs.search.world import TEMPLATES, Question, World, build_world, generate, is_held_out, solve
from tracerl.grading import GradeError, Grader, stated_answer
from tracerl.types import Prompt

SEARCH = ToolSpec("search", "Search the corpus (BM25) and return the best-matching passages.", ("query",))
MAX_PASSAGE_CHARS = 400
CORPUS_CHECK_LINES = 1000
"""Corpus passages read before a run starts (``check_data``); the whole corpus is read when the index is built."""
FAST_ANSWER_CHARS = 4096
"""Answers up to this long are scored in process; longer ones in the grading worker, under the time limit."""


def build_retriever(search_cfg: Any) -> BM25Retriever:
    """The BM25 index of the configured corpus: the generated world's passages, or ``search_cfg.corpus``.

    Raises:
        ValueError: a question file without a corpus.
        FileNotFoundError: the corpus file does not exist.
    """
    if search_cfg.tasks == "generated" and not search_cfg.corpus:
        return BM25Retriever(build_world(search_cfg.task_seed).passages)
    if not search_cfg.corpus:
        raise ValueError(
            f"env.search.tasks={search_cfg.tasks!r} is a question file: set env.search.corpus to a "
            "FlashRAG/Search-R1 JSONL corpus to search (the generated world brings its own corpus)"
        )
    return BM25Retriever(read_corpus(search_cfg.corpus))


@lru_cache(maxsize=4)
def _question_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [
        (name, re.compile("^" + re.escape(text).replace(r"\{\}", "(.+)") + "$"))
        for name, (_, text, _) in TEMPLATES.items()
    ]


def question_of(world: World, text: str) -> Question | None:
    """The generated question (with its reference hops) whose text is ``text``, or None."""
    for name, pattern in _question_patterns():
        m = pattern.match(text.strip())
        if m is None:
            continue
        start = m.group(1)
        kind = TEMPLATES[name][0]
        if start in (world.born if kind == "person" else world.founder):
            return solve(world, name, start)
    return None


class SearchEnv(ToolEnv):
    config = SearchEnvConfig
    fork_mode = "snapshot"
    tools: Sequence[ToolSpec] = (SEARCH,)

    def __init__(
        self,
        retriever: Any,
        top_k: int = 3,
        reward: str = "f1",
        f1_threshold: float = 0.3,
        world_seed: int | None = 0,
        reward_timeout_s: float = 10.0,
    ) -> None:
        """``retriever`` has ``search(query, k) -> list[Passage]`` (local, or a shared actor's proxy);
        ``world_seed`` names the generated world whose questions have reference turns (None: no world)."""
        self.retriever, self.top_k = retriever, top_k
        self.reward_kind, self.f1_threshold = reward, f1_threshold
        self.world_seed = world_seed
        self.grader = Grader(reward_timeout_s, ("tracerl.envs.search.reward",))
        """Scores long answers (started on the first one)."""
        self._last: tuple[tuple[str, str | None, str | None], dict[str, float]] | None = None

    @staticmethod
    def services(env_cfg: Any) -> dict[str, Callable[[], Any]]:
        """Shared services a run builds once and hands to every instance: the retriever."""
        cfg = env_cfg.settings(SearchEnvConfig)
        return {"retriever": lambda: build_retriever(cfg)}

    @classmethod
    def from_config(cls, env_cfg: Any, services: Mapping[str, Any] | None = None) -> SearchEnv:
        """One instance; the retriever comes from ``services`` when the run shares one, else it is built here."""
        s = env_cfg.settings(SearchEnvConfig)
        retriever = (services or {}).get("retriever") or build_retriever(s)
        world_seed = s.task_seed if s.tasks == "generated" and not s.corpus else None
        return cls(retriever, s.top_k, s.reward, s.f1_threshold, world_seed, env_cfg.reward_timeout_s)

    @staticmethod
    def prompts(env_cfg: Any, held_out: bool = False) -> list[Prompt]:
        """Training or held-out questions: generated (hash split, deduplicated) or a question file's split."""
        s = env_cfg.settings(SearchEnvConfig)
        n = s.eval_tasks if held_out else s.num_tasks
        if s.tasks == "generated":
            world = build_world(s.task_seed)
            return [
                Prompt(q.task_id, q.question, q.answer, source=f"generated-H{q.level}")
                for q in generate(world, n, held_out=held_out)
            ]
        side = [p for p in load_qa_file(s.tasks) if is_held_out(p.text, s.held_out_fraction) == held_out]
        if not side:
            raise ValueError(
                f"{s.tasks}: no {'held-out' if held_out else 'training'} questions at "
                f"env.search.held_out_fraction={s.held_out_fraction}; change the fraction"
            )
        return side[:n]

    @staticmethod
    def check_data(env_cfg: Any) -> None:
        """Read the question file (both sides of the split) and the head of the corpus, if configured, so a bad
        one fails before anything starts; a bad line further into a large corpus fails when the index is built."""
        s = env_cfg.settings(SearchEnvConfig)
        if s.tasks != "generated":
            SearchEnv.prompts(env_cfg)
            SearchEnv.prompts(env_cfg, held_out=True)
        if s.corpus:
            read_corpus(s.corpus, limit=CORPUS_CHECK_LINES)

    def initial_state(self, prompt: Prompt) -> tuple[str, ...]:
        return ()

    def execute(self, prompt: Prompt, state: tuple[str, ...], action: Action) -> ToolResult:
        """Run one search; a bad or empty query becomes an error observation (the state still records it)."""
        query = str(action.arguments.get("query", "")).strip()
        new_state = (*state, query)
        if not query:
            return ToolResult("Error: the search query is empty; write search[some words].", new_state)
        try:
            hits = self.retriever.search(query, self.top_k)
        except ValueError as exc:  # tantivy rejected even the lenient parse
            return ToolResult(f"Error: the query could not be searched ({exc}); use plain words.", new_state)
        if not hits:
            return ToolResult("No passages found; try other words.", new_state)
        lines = [f"[{i + 1}] {p.render()[:MAX_PASSAGE_CHARS]}" for i, p in enumerate(hits)]
        return ToolResult("\n".join(lines), new_state)

    def scores(self, prompt: Prompt, answer: str | None) -> dict[str, float]:
        """Exact match and token F1 of ``answer`` against the gold answer(s) (SQuAD normalisation).

        An answer of up to ``FAST_ANSWER_CHARS`` is scored here (linear time, microseconds); a longer one in the
        grading worker under ``env.reward_timeout_s``. The last result is kept (``reward`` then ``scores`` of
        one answer grade it once).

        Raises:
            GradeTimeout: scoring a long answer ran past the limit.
        """
        answer = stated_answer(answer) if answer is not None else None  # the answer stated, not restated text
        key = (prompt.prompt_id, prompt.answer, answer)
        if self._last is not None and self._last[0] == key:
            return dict(self._last[1])
        if answer is None or len(answer) <= FAST_ANSWER_CHARS:
            got = qa_scores(prompt.answer, answer)
        else:
            try:
                got = self.grader(qa_scores, prompt.answer, answer)
            except GradeError:  # the worker ran out of memory on this answer: it scores nothing
                got = qa_scores(prompt.answer, None)
        self._last = (key, got)
        return dict(got)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        s = self.scores(prompt, answer)
        if self.reward_kind == "em":
            return s["em"]
        return 1.0 if s["f1"] >= self.f1_threshold else 0.0

    def gold_turns(self, prompt: Prompt, template: Any) -> list[str]:
        """The reference turns of a generated question (one search per hop, then the answer) in ``template``'s
        format.

        Raises:
            ValueError: the prompt is not a question of this environment's generated world.
        """
        q = question_of(build_world(self.world_seed), prompt.text) if self.world_seed is not None else None
        if q is None:
            raise no_gold(prompt.prompt_id, "generated multi-hop world (env.search.tasks=generated)")
        calls = [(h.thought, "search", {"query": h.query}) for h in q.hops]
        return gold_turn_texts(template, calls, q.final_thought, q.answer)
