"""A generated multi-hop world: people, companies, cities and countries, rendered as passages, with
2-4 hop questions whose answers follow a chain of relations.

Relations (each stated once, in the subject's own passage)::

    born(person) -> city          "<P> was born in <C>."
    works(person) -> company      "<P> works for <K>."
    founder(company) -> person    "<K> was founded by <P>."
    hq(company) -> city           "<K> is headquartered in <C>."
    country(city) -> country      "<C> is a city in <N>."

A question follows a chain from a start entity; hop i searches the current entity's name, reads its
fact and moves to the object (so every hop has one supporting passage and one gold query).
Difficulty is graded by the number of hops (2, 3, 4). Distractor passages (festivals, annual
reports) mention entities without stating the relations, and names share first names and
surnames, so a sloppy query or a misread observation fails.

Everything is a pure function of the seed: :func:`build_world` for the world, :func:`make_question`
for question ``index``; :func:`generate` deduplicates by question text and keeps one side of a
stable hash split, so held-out questions never appear in training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tracerl.envs.search.index import Passage

HOPS = (2, 3, 4)
_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "th",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m", "nd"]
_COMPANY_KINDS = ["Group", "Works", "Labs", "Industries", "Foods", "Motors", "Systems", "Media"]


@dataclass(frozen=True)
class World:
    """Entities and relations of one generated world."""

    seed: int
    people: tuple[str, ...]
    companies: tuple[str, ...]
    cities: tuple[str, ...]
    countries: tuple[str, ...]
    born: dict[str, str]
    works: dict[str, str]
    founder: dict[str, str]
    hq: dict[str, str]
    country: dict[str, str]
    passages: tuple[Passage, ...]


@dataclass(frozen=True)
class Hop:
    """One hop of a reference solution: the thought before it, the gold query, the fact it reads."""

    thought: str
    query: str
    fact: str
    support: str
    """doc_id of the passage that states ``fact``."""


@dataclass(frozen=True)
class Question:
    task_id: str
    question: str
    answer: str
    hops: tuple[Hop, ...]
    final_thought: str
    template: str

    @property
    def level(self) -> int:
        """Difficulty: the number of hops."""
        return len(self.hops)


def _words(rng: np.random.Generator, n: int, syllables: tuple[int, int], taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        k = int(rng.integers(syllables[0], syllables[1] + 1))
        w = "".join(str(rng.choice(_ONSETS)) + str(rng.choice(_VOWELS)) for _ in range(k)) + str(
            rng.choice(_CODAS)
        )
        w = w.capitalize()
        if w not in taken and len(w) >= 4:
            taken.add(w)
            out.append(w)
    return out


def _doc(kind: str, name: str) -> str:
    return f"{kind}:{name}"


# relation name (the ``World`` field: subject -> object) -> (fact sentence, what the agent looks for, subject kind)
RELATIONS: dict[str, tuple[str, str, str]] = {
    "born": ("{s} was born in {o}.", "where {s} was born", "person"),
    "works": ("{s} works for {o}.", "who {s} works for", "person"),
    "founder": ("{s} was founded by {o}.", "who founded {s}", "company"),
    "hq": ("{s} is headquartered in {o}.", "where {s} is headquartered", "company"),
    "country": ("{s} is a city in {o}.", "which country {s} is in", "city"),
}


def _fact(rel: str, subject: str, obj: str) -> str:
    """The sentence of the subject's passage that states ``rel``."""
    return RELATIONS[rel][0].format(s=subject, o=obj)


@lru_cache(maxsize=8)
def build_world(
    seed: int = 0,
    num_people: int = 1500,
    num_companies: int = 300,
    num_cities: int = 120,
    num_countries: int = 20,
) -> World:
    """The world of ``seed`` (cached: every environment of a run shares one build)."""
    rng = np.random.default_rng([seed, 7])
    taken: set[str] = set()
    countries = _words(rng, num_countries, (2, 2), taken)
    cities = _words(rng, num_cities, (2, 3), taken)
    firsts, lasts = _words(rng, 50, (1, 2), taken), _words(rng, 70, (2, 2), taken)
    pairs = rng.permutation(len(firsts) * len(lasts))[:num_people]
    people = [f"{firsts[int(p) // len(lasts)]} {lasts[int(p) % len(lasts)]}" for p in pairs]
    stems = _words(rng, num_companies, (2, 2), taken)
    companies = [f"{s} {rng.choice(_COMPANY_KINDS)}" for s in stems]
    country = {
        c: countries[i % num_countries] if i < num_countries else str(rng.choice(countries))
        for i, c in enumerate(cities)
    }
    born = {p: str(rng.choice(cities)) for p in people}
    works = {p: str(rng.choice(companies)) for p in people}
    founders = rng.choice(len(people), size=num_companies, replace=False)
    founder = {k: people[int(i)] for k, i in zip(companies, founders)}
    hq = {k: str(rng.choice(cities)) for k in companies}
    passages = [
        Passage(_doc("person", p), p, f"{_fact('born', p, born[p])} {_fact('works', p, works[p])}")
        for p in people
    ]
    passages += [
        Passage(_doc("company", k), k, f"{_fact('founder', k, founder[k])} {_fact('hq', k, hq[k])}")
        for k in companies
    ]
    passages += [Passage(_doc("city", c), c, _fact("country", c, country[c])) for c in cities]
    passages += [
        Passage(
            _doc("country", n), n, f"{n} is a country with {sum(v == n for v in country.values())} cities."
        )
        for n in countries
    ]
    # Distractors: they name entities without stating any relation (a guest each, drawn in this order).
    distractors: list[tuple[str, list[str], str, Callable[[str, str], str]]] = [
        (
            "festival",
            cities,
            "{} Festival",
            lambda c, g: f"The {c} Festival is held every spring. {g} once gave a speech there.",
        ),
        (
            "report",
            companies,
            "{} annual report",
            lambda k, g: f"The {k} annual report praised {g} and the staff in {rng.choice(cities)}.",
        ),
    ]
    for kind, names, title, text in distractors:
        for name in names:
            guest = people[int(rng.integers(len(people)))]
            passages.append(Passage(_doc(kind, name), title.format(name), text(name, guest)))
    return World(
        seed,
        tuple(people),
        tuple(companies),
        tuple(cities),
        tuple(countries),
        born,
        works,
        founder,
        hq,
        country,
        tuple(passages),
    )


# template name -> (hops, start kind, question text, relation chain)
TEMPLATES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "birth_country": ("person", "In which country was {} born?", ("born", "country")),
    "employer_hq": (
        "person",
        "In which city is the company that {} works for headquartered?",
        ("works", "hq"),
    ),
    "employer_founder": ("person", "Who founded the company that {} works for?", ("works", "founder")),
    "founder_birthplace": ("company", "Where was the founder of {} born?", ("founder", "born")),
    "employer_country": (
        "person",
        "In which country is the company that {} works for headquartered?",
        ("works", "hq", "country"),
    ),
    "founder_country": (
        "company",
        "In which country was the founder of {} born?",
        ("founder", "born", "country"),
    ),
    "employer_founder_birthplace": (
        "person",
        "Where was the founder of the company that {} works for born?",
        ("works", "founder", "born"),
    ),
    "employer_founder_country": (
        "person",
        "In which country was the founder of the company that {} works for born?",
        ("works", "founder", "born", "country"),
    ),
    "founder_employer_country": (
        "company",
        "In which country is the company that employs the founder of {} headquartered?",
        ("founder", "works", "hq", "country"),
    ),
}
_BY_HOPS = {h: [name for name, (_, _, chain) in TEMPLATES.items() if len(chain) == h] for h in HOPS}


def solve(world: World, template: str, start: str) -> Question:
    """The question of ``template`` about ``start`` with its reference hops and answer."""
    kind, text, chain = TEMPLATES[template]
    hops: list[Hop] = []
    subject, known = start, ""
    for rel in chain:
        _, need, subject_kind = RELATIONS[rel]
        looks_for = need.format(s=subject)
        thought = f"I need to find {looks_for}." if not known else f"{known} Next I need {looks_for}."
        obj = getattr(world, rel)[subject]
        known = _fact(rel, subject, obj)
        hops.append(Hop(thought, subject, known, _doc(subject_kind, subject)))
        subject = obj
    q = text.format(start)
    tid = "mh-" + hashlib.sha1(f"{world.seed}:{q}".encode()).hexdigest()[:12]
    return Question(tid, q, subject, tuple(hops), f"{known} So the answer is {subject}.", template)


def make_question(world: World, index: int, hops: int | None = None) -> Question:
    """Question ``index`` of the world (its hop count cycles 2, 3, 4 unless given)."""
    rng = np.random.default_rng([world.seed, 11, index])
    hops = hops or HOPS[index % len(HOPS)]
    template = str(rng.choice(_BY_HOPS[hops]))
    kind = TEMPLATES[template][0]
    pool = world.people if kind == "person" else world.companies
    return solve(world, template, pool[int(rng.integers(len(pool)))])


def is_held_out(question: str, held_out_fraction: float = 0.2) -> bool:
    """Stable train / held-out assignment by a hash of the question text (never both)."""
    h = int(hashlib.sha1(("split:" + question).encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < held_out_fraction


def generate(
    world: World, n: int, held_out: bool | None = None, hops: tuple[int, ...] = HOPS, start: int = 0
) -> list[Question]:
    """``n`` distinct questions (by text) of ``world``, cycling hop counts, optionally one side of the split."""
    out: list[Question] = []
    seen: set[str] = set()
    index = start
    while len(out) < n:
        q = make_question(world, index, hops[index % len(hops)])
        index += 1
        if index > start + 50 * n + 1000:
            raise ValueError(
                f"could not generate {n} distinct questions of this world; lower the number of tasks"
            )
        if q.question in seen or (held_out is not None and is_held_out(q.question) != held_out):
            continue
        seen.add(q.question)
        out.append(q)
    return out
