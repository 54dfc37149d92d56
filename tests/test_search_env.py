"""The search environment: BM25 index, generated multi-hop world, gold replay, loaders, EM/F1, shared retriever."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bootstrap_tiny
from tracerl.config import SamplerConfig, env_config
from tracerl.engine.react import Action, ActionKind, PlainTemplate
from tracerl.envs.search.config import SearchEnvConfig
from tracerl.envs.search.datasets import load_qa_file
from tracerl.envs.search.env import SearchEnv, build_retriever, question_of
from tracerl.envs.search.index import BM25Retriever, Passage, read_corpus
from tracerl.envs.search.reward import exact_match, f1_score, gold_answers, normalize_answer, qa_scores
from tracerl.envs.search.world import build_world, generate
from tracerl.samplers.scripted import ByteTokenizer, ScriptedSampler
from tracerl.types import Prompt, Status
from tracerl.workflows.bench.env import gold_engine, summarize

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "qa"
CFG = env_config(name="search", search=SearchEnvConfig(top_k=3, reward="em"))
CFG_LIMITS = SamplerConfig()


@pytest.fixture(scope="module")
def env() -> SearchEnv:
    return SearchEnv.from_config(CFG)


def _search(query: str) -> Action:
    return Action(ActionKind.TOOL, "", tool="search", arguments={"query": query})


def test_em_and_f1_on_known_strings() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("Paris", "the paris.") == 1.0 and exact_match("Paris", "Paris, France") == 0.0
    assert f1_score("Paris", "Paris, France") == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # P 1/2, R 1
    assert f1_score("James Madison", "madison") == pytest.approx(2 / 3)
    assert f1_score("a", "the") == 1.0 and f1_score("Paris", "") == 0.0  # both normalise to empty; one empty
    assert gold_answers('["USA", "United States"]') == ["USA", "United States"] and gold_answers("[x") == [
        "[x"
    ]
    assert qa_scores('["USA", "United States"]', "united states") == {"em": 1.0, "f1": 1.0}
    assert qa_scores("Paris", None) == {"em": 0.0, "f1": 0.0}


def test_reward_is_em_or_f1_at_threshold(env: SearchEnv) -> None:
    p = Prompt("q", "Who?", "James Madison")
    f1 = SearchEnv(env.retriever, reward="f1", f1_threshold=0.6)
    assert env.reward(p, "Madison") == 0.0 and f1.reward(p, "Madison") == 1.0  # F1 2/3 >= 0.6
    assert SearchEnv(env.retriever, reward="f1", f1_threshold=0.7).reward(p, "Madison") == 0.0
    assert env.scores(p, "james madison") == {"em": 1.0, "f1": 1.0}


def test_world_is_seeded_and_held_out_is_disjoint() -> None:
    assert build_world(3).passages == build_world(3).passages
    train = SearchEnv.prompts(CFG)
    held = SearchEnv.prompts(CFG, held_out=True)
    assert len(train) == 256 and len(held) == 200 and not {p.text for p in train} & {p.text for p in held}
    assert {p.source for p in held} == {"generated-H2", "generated-H3", "generated-H4"}


def test_gold_replay_scores_em_1_and_every_hop_is_retrieved(env: SearchEnv) -> None:
    prompts = SearchEnv.prompts(CFG, held_out=True)[:90]
    world = build_world(0)
    for p in prompts:  # the supporting passage of each hop is in the top-k for its gold query
        q = question_of(world, p.text)
        assert q is not None and q.answer == p.answer
        for hop in q.hops:
            assert hop.support in [x.doc_id for x in env.retriever.search(hop.query, env.top_k)], hop
    engine = gold_engine(env, prompts, "plain", CFG_LIMITS)
    trees = engine.rollout(prompts, [1] * len(prompts))
    out = summarize(trees)
    assert out["score"] == 1.0 and out["scores"] == {"em": 1.0, "f1": 1.0}
    assert engine.sampler.misses == 0 and engine.ledger.invalid_actions == 0  # type: ignore[attr-defined]
    assert all(t.leaves()[0].scores == {"em": 1.0, "f1": 1.0} for t in trees)
    assert engine.ledger.tool_calls == sum(len(question_of(world, p.text).hops) for p in prompts)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced quote',
        "((( nested [ brackets {",
        "a AND OR NOT",
        "title:",
        "foo:bar",
        "*",
        "-",
        "+",
        '""',
        "[1 TO",
        "body:[a TO",
        "~2",
        "^3",
        "\\",
        "NOT",
        "\x00",
        "ünïcode 北京 🙂",
        "x" * 100_000,
        "   ",
        "a" * 3 + ":" * 50,
        "Mund Bono^1000000",
        "/regex.*/",
        "field:(a OR b) AND -c",
        "'single'",
    ],
)
def test_hostile_queries_never_crash(env: SearchEnv, query: str) -> None:
    res = env.execute(Prompt("p"), (), _search(query))
    assert isinstance(res.observation, str) and res.observation
    assert res.state == (query.strip(),)


def test_empty_query_is_an_error_observation(env: SearchEnv) -> None:
    assert env.execute(Prompt("p"), ("x",), _search("  ")).observation.startswith(
        "Error: the search query is empty"
    )


def test_malformed_actions_become_error_observations_and_the_episode_goes_on(env: SearchEnv) -> None:
    t = PlainTemplate()
    bad = {
        "Thought: go\nAction: search[Mund Bono": "not closed",
        "Thought: go\nAction: lookup[Mund Bono]": "unknown tool 'lookup'",
        "Thought: go\nAction: search[]": "needs argument(s) query",
        'Thought: go\nAction: search{"query": }': "not valid JSON",
        'Thought: go\nAction: search{"q": "x"}': "needs argument(s) query",
        "Thought: I am thinking": "end the turn with",
    }
    for text, msg in bad.items():
        a = t.parse(text, env.tools)
        assert a.kind is ActionKind.INVALID and msg in (a.error or ""), (text, a)
    # Through the engine: the malformed turns are error observations, then the gold turns still solve it.
    p = SearchEnv.prompts(CFG, held_out=True)[0]
    sampler = ScriptedSampler(ByteTokenizer())
    sampler.add_script(t.prompt(p.text, env.tools), [*list(bad)[:3], *env.gold_turns(p, t)])
    from tracerl.engine.rollout import TreeRolloutEngine

    limits = SamplerConfig(
        max_turns=10, max_turn_tokens=10**6, max_episode_tokens=10**7, max_context_tokens=10**8
    )
    tree = TreeRolloutEngine(sampler, env, t, ByteTokenizer(), limits).rollout([p], [1])[0]
    leaf = tree.leaves()[0]
    assert leaf.status is Status.ANSWERED and leaf.reward == 1.0
    assert "Error: the action's input is not closed" in tree.nodes[1].content


def test_forks_share_snapshot_states(env: SearchEnv) -> None:
    s1 = env.execute(Prompt("p"), (), _search("Mund Bono")).state
    s2 = env.execute(Prompt("p"), s1, _search("Futhion Labs")).state
    assert s1 == ("Mund Bono",) and s2 == ("Mund Bono", "Futhion Labs") and env.fork_mode == "snapshot"


def test_corpus_reader_accepts_contents_and_title_text(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text(
        '{"id": "1", "contents": "\\"Paris\\"\\nParis is the capital of France."}\n'
        '{"id": "2", "contents": "Berlin\\nBerlin is the capital of Germany."}\n'
    )
    b = tmp_path / "b.jsonl"
    b.write_text('{"id": "x", "title": "Rome", "text": "Rome is the capital of Italy."}\n')
    pa, pb = read_corpus(a), read_corpus(b)
    assert pa[0] == Passage("1", "Paris", "Paris is the capital of France.") and pb[0].title == "Rome"
    r = BM25Retriever(pa + pb)
    assert r.search("capital of Germany", 1)[0].doc_id == "2" and r.search("Italy", 2)[0].doc_id == "x"
    with pytest.raises(FileNotFoundError, match="env.search.corpus"):
        read_corpus(tmp_path / "missing.jsonl")


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not available here")
def test_loaders_read_the_real_hotpotqa_and_bamboogle_files(tmp_path: Path) -> None:
    hotpot = load_qa_file(DATA / "hotpotqa_dev_questions.json")
    assert len(hotpot) == 7405 and hotpot[0].answer == "yes" and hotpot[0].source == "comparison"
    assert hotpot[1].text.startswith("What government position was held by the woman")
    bam = load_qa_file(DATA / "bamboogle_test.csv")
    assert len(bam) == 125 and bam[0].answer == "james madison" and all(p.answer for p in bam)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "Citibank\\nCitibank was founded in 1812."}\n')
    cfg = env_config(
        name="search",
        search=SearchEnvConfig(
            tasks=str(DATA / "bamboogle_test.csv"), corpus=str(corpus), num_tasks=500, eval_tasks=500
        ),
    )
    train, held = SearchEnv.prompts(cfg), SearchEnv.prompts(cfg, held_out=True)
    assert len(train) + len(held) == 125 and not {p.text for p in train} & {p.text for p in held}
    env = SearchEnv.from_config(cfg)
    assert "1812" in env.execute(bam[0], (), _search("Citibank founded")).observation
    with pytest.raises(ValueError, match="gold turns exist only for the generated"):
        env.gold_turns(bam[0], PlainTemplate())


def test_question_file_without_corpus_is_rejected_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set env.search.corpus"):
        SearchEnvConfig(tasks="questions.json")
    cfg = env_config(
        name="search", search=SearchEnvConfig(tasks="q.json", corpus=str(tmp_path / "none.jsonl"))
    )
    with pytest.raises(FileNotFoundError, match="search corpus not found"):
        build_retriever(cfg.search)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        SearchEnvConfig(top_k=0)


def test_generate_cycles_hops_and_dedups() -> None:
    qs = generate(build_world(0), 60, held_out=False)
    assert len({q.question for q in qs}) == 60 and {q.level for q in qs} == {2, 3, 4}
    assert all(q.hops[i + 1].query in q.hops[i].fact for q in qs for i in range(len(q.hops) - 1))


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))
    return ray


def test_one_shared_retriever_actor_serves_every_env_actor(ray_local: Any) -> None:
    from tracerl.actors.envpool import EnvPool
    from tracerl.actors.services import start_services, stop_services

    services = start_services(SearchEnv, CFG, cpus=0.05)
    assert list(services) == ["retriever"]
    try:
        pool = EnvPool(
            lambda: SearchEnv.from_config(CFG, services=services), size=2, cpus=0.05, max_retries=0
        )
        assert pool.local.retriever is services["retriever"]  # no local index was built
        p = SearchEnv.prompts(CFG, held_out=True)[0]
        q = question_of(build_world(0), p.text)
        assert q is not None
        results = pool.execute_batch([(p, (), _search(h.query)) for h in q.hops])
        assert all(h.fact in r.observation for h, r in zip(q.hops, results))
        assert pool.scores(p, p.answer) == {"em": 1.0, "f1": 1.0}
        # Both env actors and the driver talk to the same actor: one index for the run.
        ids = {
            ray_local.get(a.execute.remote(0, p, (), _search(q.hops[0].query))).observation
            for a in pool.actors
        }
        assert len(ids) == 1
        assert len(services["retriever"].search_many(["Mund Bono", "Futhion Labs"], 2)) == 2
    finally:
        stop_services(services)


def test_an_episode_without_an_answer_scores_zero(env: SearchEnv) -> None:
    from tracerl.engine.rollout import TreeRolloutEngine

    t = PlainTemplate()
    p = SearchEnv.prompts(CFG, held_out=True)[0]
    sampler = ScriptedSampler(ByteTokenizer())
    sampler.add_script(
        t.prompt(p.text, env.tools), env.gold_turns(p, t)[:-1]
    )  # every search, never the answer
    limits = SamplerConfig(
        max_turns=2, max_turn_tokens=10**6, max_episode_tokens=10**7, max_context_tokens=10**8
    )
    leaf = TreeRolloutEngine(sampler, env, t, ByteTokenizer(), limits).rollout([p], [1])[0].leaves()[0]
    assert leaf.status is Status.MAX_TURNS and leaf.reward == 0.0 and leaf.scores == {"em": 0.0, "f1": 0.0}


def test_query_space_gives_the_query_the_name_tokens_of_the_question(env: SearchEnv) -> None:
    from tracerl.models.tiny import build_tokenizer
    from tracerl.workflows.bootstrap.search import search_trace_segments

    q = generate(build_world(0), 1, held_out=False)[0]
    plain, spaced = search_trace_segments(q, env), search_trace_segments(q, env, query_space=True)
    assert f"search[ {q.hops[0].query}]" in spaced[1].text and f"search[{q.hops[0].query}]" in plain[1].text
    tok = build_tokenizer(["".join(s.text for s in segs) for segs in (plain, spaced)] * 10, 400)
    name = tok.tokenize(" " + q.hops[0].query)
    for segs, copies in (
        (spaced, 2),
        (plain, 1),
    ):  # in the question's thought, and (with the space) in the query
        ids = tok.tokenize(segs[1].text)
        assert sum(ids[i : i + len(name)] == name for i in range(len(ids))) == copies
    # the parser and the environment strip the space: the same search
    action = PlainTemplate().parse(spaced[1].text, env.tools)
    assert action.kind is ActionKind.TOOL and action.arguments == {"query": q.hops[0].query}


def test_search_habit_traces_answer_without_searching_for_the_chosen_share(env: SearchEnv) -> None:
    from tracerl.workflows.bootstrap.habit import question_answers_directly
    from tracerl.workflows.bootstrap.search import (
        DIRECT_SEARCH_THOUGHT,
        search_habit_segments,
        search_trace_segments,
    )

    env2 = SearchEnv(env.retriever, top_k=2, reward="em")
    qs = generate(build_world(0), 300, held_out=False)
    direct = [question_answers_directly(q.question, 0.5) for q in qs]
    assert 0.4 < sum(direct) / len(qs) < 0.6 and direct == [
        question_answers_directly(q.question, 0.5) for q in qs
    ]
    q = qs[direct.index(True)]
    assert search_habit_segments(q, env2, 0.0) == search_trace_segments(q, env2)
    segs = search_habit_segments(q, env2, 0.5)
    assert len(segs) == 2 and not segs[0].trainable and segs[1].trainable
    assert (
        segs[1].text == f"Thought: {DIRECT_SEARCH_THOUGHT}\nFinal Answer: {q.answer}\n"
        and "search[" not in segs[1].text
    )
    full = search_trace_segments(q, env2)
    assert (
        len(full) == 2 + 2 * q.level
        and sum("Action: search[" in s.text for s in full if s.trainable) == q.level
    )


def test_bootstrap_search_habit_phase_starts_from_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    # short episodes: an untrained model would otherwise babble to the policy's real limits in the evaluation
    monkeypatch.setattr(
        "tracerl.workflows.bootstrap.search.SEARCH_LIMITS",
        SamplerConfig(max_turns=2, max_turn_tokens=16, max_episode_tokens=32, max_context_tokens=1024),
    )

    small: dict[str, Any] = dict(
        family="search",
        train_tasks=40,
        eval_tasks=3,
        vocab_size=400,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        max_positions=768,
        batch_size=4,
        top_k=2,
        query_space=True,
    )
    base = bootstrap_tiny(tmp_path / "base", steps=3, **small)
    assert base["train_steps"] == 3 and not base["stopped_by_time_budget"] and base["habit_steps"] == 0
    assert base["eval_tasks"] == 3 and {"em", "f1", "well_formed_turns"} <= set(base["greedy"])
    habit = bootstrap_tiny(
        tmp_path / "habit",
        init_from=str(tmp_path / "base"),
        steps=1,
        habit_steps=2,
        direct_answer_fraction=0.5,
        **small,
    )
    assert (
        habit["train_steps"] == 2 and habit["habit_steps"] == 2 and habit["parameters"] == base["parameters"]
    )
    saved = json.loads((tmp_path / "habit" / "bootstrap.json").read_text())
    assert saved["config"]["init_from"] == str(tmp_path / "base")
    base_tok = json.loads((tmp_path / "base" / "tokenizer.json").read_text())
    assert json.loads((tmp_path / "habit" / "tokenizer.json").read_text())["model"] == base_tok["model"]


def test_bootstrap_config_checks_init_from_and_time_budget() -> None:
    from tracerl.workflows.bootstrap.config import BootstrapConfig

    with pytest.raises(ValueError, match="init_from"):
        BootstrapConfig(init_from="models/tiny-search")
    with pytest.raises(ValueError, match="time_budget_s"):
        BootstrapConfig(time_budget_s=0)
    assert BootstrapConfig(time_budget_s=None).time_budget_s is None


def test_loader_reads_a_2wiki_record(tmp_path: Path) -> None:
    """2WikiMultihopQA (not available offline): its published dev.json record layout, written by hand."""
    record = {
        "_id": "8813f87c0bdd11eba7f7acde48001122",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War (Film)?",
        "context": [
            [
                "Polish-Russian War (film)",
                ["Polish-Russian War is a 2009 Polish film directed by Xawery Żuławski."],
            ]
        ],
        "supporting_facts": [["Polish-Russian War (film)", 1]],
        "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"]],
        "answer": "Małgorzata Braunek",
    }
    (tmp_path / "dev.json").write_text(
        json.dumps(
            [
                record,
                {
                    **record,
                    "_id": "x2",
                    "type": "comparison",
                    "question": "Which film came out first?",
                    "answer": "Polish-Russian War",
                },
            ]
        )
    )
    got = load_qa_file(tmp_path / "dev.json")
    assert [(p.source, p.answer) for p in got] == [
        ("compositional", "Małgorzata Braunek"),
        ("comparison", "Polish-Russian War"),
    ]
    assert got[0].text.startswith("Who is the mother of the director")
