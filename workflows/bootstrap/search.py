"""The search family of ``tracerl bootstrap``: supervised traces of the generated multi-hop world.

Each training question's reference solution (one ``search[entity]`` per hop, the fact read from the
top passage restated in the next thought, then ``Final Answer:``) is rendered in the plain template with
the real retriever's observations, so the policy sees at training time exactly what the environment
shows it at rollout time. Model turns (and the ``Observation:`` marker that ends a tool turn) are
trainable; the question and the observations are not. Held-out questions come from the other side
of the world's hash split.
"""

from __future__ import annotations

from tracerl.config import SamplerConfig
from tracerl.engine.react import Action, ActionKind, PlainTemplate
from tracerl.envs.search.env import SearchEnv
from tracerl.envs.search.index import BM25Retriever
from tracerl.envs.search.world import Question, build_world, generate
from tracerl.models.tiny import Segment
from tracerl.types import Prompt
from tracerl.workflows.bootstrap.config import BootstrapConfig
from tracerl.workflows.bootstrap.habit import (
    premature_segments,
    question_answers_directly,
    question_answers_late,
)

SEARCH_LIMITS = SamplerConfig(
    max_turns=6, max_turn_tokens=96, max_episode_tokens=512, max_context_tokens=1024
)
"""Episode limits of the tiny search policy (4 hops and the answer fit with one turn to spare)."""


def search_trace_segments(q: Question, env: SearchEnv, query_space: bool = False) -> list[Segment]:
    """The reference solution of ``q`` as plain-template segments, observations from ``env``'s retriever;
    ``query_space`` writes each query with a leading space (``search[ Name]``), so a name is the same tokens in the
    query as in the question and the passages (the parser and the environment strip it)."""
    t = PlainTemplate()
    marker = t.stop[0]
    segs = [Segment(t.prompt(q.question, []), False)]
    state: tuple[str, ...] = ()
    for hop in q.hops:
        action = Action(ActionKind.TOOL, "", tool="search", arguments={"query": hop.query})
        res = env.execute(Prompt(q.task_id, q.question, q.answer), state, action)
        state = res.state
        query = " " + hop.query if query_space else hop.query
        segs.append(Segment(t.tool_turn(hop.thought, "search", {"query": query}) + marker, True))
        segs.append(Segment(t.observation(res.observation)[len(marker) :], False))
    segs.append(Segment(t.answer_turn(q.final_thought, q.answer), True))
    return segs


DIRECT_SEARCH_THOUGHT = "I can answer this without searching."


def search_habit_segments(
    q: Question, env: SearchEnv, fraction: float, query_space: bool = False, late_fraction: float = 0.0
) -> list[Segment]:
    """The habit phase's trace of ``q``: the reference solution; or (for ``fraction`` of the questions, a fixed
    hash of the question text) a final answer given at once, without searching; or (for ``late_fraction`` of the
    3- and 4-hop questions, another fixed hash) every hop but the last, then the entity the penultimate hop found
    as the final answer (a premature answer: the -late testbed)."""
    t = PlainTemplate()
    if question_answers_directly(q.question, fraction):
        return [
            Segment(t.prompt(q.question, []), False),
            Segment(t.answer_turn(DIRECT_SEARCH_THOUGHT, q.answer), True),
        ]
    reference = search_trace_segments(q, env, query_space)
    if q.level >= 3 and question_answers_late(q.question, late_fraction):
        return premature_segments(reference, q.level - 1, t.answer_turn(*late_answer(q)))
    return reference


def late_answer(q: Question) -> tuple[str, str]:
    """The premature answer of a multi-hop question: (thought, answer) naming the entity the penultimate hop found
    (the last hop's subject), in the words of the reference's final thought."""
    entity = q.hops[-1].query
    return f"{q.hops[-2].fact} So the answer is {entity}.", entity


def search_family(
    cfg: BootstrapConfig,
) -> tuple[list[list[Segment]], list[list[Segment]], list[Prompt], SearchEnv, SamplerConfig]:
    """Training traces, the habit phase's traces (empty when ``cfg.habit_steps`` is 0), held-out prompts, the
    environment and episode limits for the search policy."""
    world = build_world(cfg.seed)
    env = SearchEnv(BM25Retriever(world.passages), top_k=cfg.top_k, reward="em", world_seed=cfg.seed)
    train = generate(world, cfg.train_tasks, held_out=False)
    held = generate(world, cfg.eval_tasks, held_out=True)
    assert not {q.question for q in train} & {q.question for q in held}
    segments = [search_trace_segments(q, env, cfg.query_space) for q in train]
    habit = (
        [
            search_habit_segments(
                q, env, cfg.direct_answer_fraction, cfg.query_space, cfg.late_answer_fraction
            )
            for q in train
        ]
        if cfg.habit_steps > 0
        else []
    )
    prompts = [Prompt(q.task_id, q.question, q.answer, source=f"generated-H{q.level}") for q in held]
    return segments, habit, prompts, env, SEARCH_LIMITS
