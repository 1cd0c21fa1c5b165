"""Synthetic two-hop questions over fictional entities: the offline default data set.

Each question needs two facts from two paragraphs ("Kovan Drel was born in Brastor." and
"Brastor is a city in Zarnia." → "In which country was Kovan Drel born?" → "Zarnia").
Every person, city and company name is invented from syllables and used once per call, so
distractors (about other invented entities) never contradict a gold fact, also when
`build_ruler_hqa` mixes paragraphs of different questions. Answers are single words; the
countries, rivers and languages come from small closed lists, so a tiny model can learn them.

`hops=1` gives one-fact questions about one-word names ("The person Kovan was born in Zarnia."
→ "In which country was Kovan born?"), whose distractors are facts of the same kinds about
other people, each paragraph that one sentence (titled "About Kovan"), every answer from a
closed list (countries, rivers, languages, jobs): the quickstart's task, small enough for a model
trained from scratch on a CPU. `entities="train"` / `"eval"` draw invented names from two
disjoint halves of the name space (by a hash of the name), so evaluation questions are about
people, cities and companies never seen in training and their answers can only be read from
the document.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Literal

from memrl.data.records import Document, QARecord, render_documents
from memrl.errors import MemrlInputError

COUNTRIES = ("Zarnia", "Quellor", "Vintara", "Orlesk", "Dunmira", "Kavosh",
             "Pellune", "Estravo", "Myrrden", "Talvasse", "Ombrisk", "Galdune")
RIVERS = ("Aldra", "Fennis", "Korrow", "Liriel", "Mossa", "Nerith", "Pallin", "Quorra",
          "Seffra", "Tuvin")
LANGUAGES = ("Zarnish", "Quellic", "Vintaran", "Orleskan", "Dunmiri", "Kavoshi",
             "Pellunic", "Estravan")

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r",
           "s", "st", "t", "tr", "v", "z", "th", "sh", "j")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd")
_COMPANY_KINDS = ("Works", "Mills", "Traders", "Foundry", "Press", "Shipping", "Bakery")
_JOBS = ("painter", "sailor", "teacher", "weaver", "merchant", "poet", "builder", "farmer",
         "singer", "clockmaker")
_ADJECTIVES = ("quiet", "famous", "young", "patient", "cheerful", "careful", "restless")
_CITY_FEATURES = ("old bridges", "markets", "gardens", "towers", "harbour", "festivals",
                  "libraries", "stone walls")
_COMPANY_GOODS = ("ropes", "lamps", "paper", "glass", "boats", "bread", "tools", "cloth")


ENTITY_SPLITS = ("all", "train", "eval")


def entity_split(word: str) -> str:
    """Which disjoint half of the invented names `word` belongs to: "train" or "eval"."""
    return ("train", "eval")[zlib.crc32(word.lower().encode()) % 2]


class _Names:
    """Invented names, each handed out once (so no fact about an entity is ever repeated)."""

    def __init__(self, rng: random.Random, entities: str = "all") -> None:
        self.rng = rng
        self.used: set[str] = {w.lower() for w in (*COUNTRIES, *RIVERS, *LANGUAGES)}
        self.entities = entities

    def word(self) -> str:
        while True:
            n = 2 if self.rng.random() < 0.8 else 3
            w = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(n)
            )
            allowed = self.entities == "all" or entity_split(w) == self.entities
            if 4 <= len(w) <= 10 and w not in self.used and allowed:
                self.used.add(w)
                return w.capitalize()

    def person(self) -> str:
        return f"{self.word()} {self.word()}"

    def company(self) -> str:
        return f"{self.word()} {self.rng.choice(_COMPANY_KINDS)}"


def _person_text(rng: random.Random, person: str, fact: str) -> str:
    first = person.split()[0]
    return f"{fact} {first} is a {rng.choice(_ADJECTIVES)} {rng.choice(_JOBS)}."


def _city_text(rng: random.Random, fact: str) -> str:
    a, b = rng.sample(_CITY_FEATURES, 2)
    return f"{fact} The city is known for its {a} and {b}."


def _company_text(rng: random.Random, fact: str) -> str:
    return f"{fact} The company makes {rng.choice(_COMPANY_GOODS)}."


# A template makes (gold documents, question, answer) from fresh names.
_Template = Callable[[random.Random, _Names], tuple[list[Document], str, str]]


def _person_and_city(rng: random.Random, names: _Names, values: Sequence[str], link: str,
                     city_fact: str, question: str) -> tuple[list[Document], str, str]:
    """A person `link` a city ("was born in"), and a fact of the city with the answer, one
    of `values` (`city_fact` and `question` name them {city}, {answer} and {person})."""
    person, city, answer = names.person(), names.word(), rng.choice(values)
    docs = [
        Document(title=person, text=_person_text(rng, person, f"{person} {link} {city}."),
                 is_supporting=True),
        Document(title=city, text=_city_text(rng, city_fact.format(city=city, answer=answer)),
                 is_supporting=True),
    ]
    return docs, question.format(person=person), answer


def _born_in(rng: random.Random, names: _Names) -> tuple[list[Document], str, str]:
    return _person_and_city(rng, names, COUNTRIES, "was born in", "{city} is a city in {answer}.",
                            "In which country was {person} born?")


def _river(rng: random.Random, names: _Names) -> tuple[list[Document], str, str]:
    return _person_and_city(rng, names, RIVERS, "lives in", "{city} lies on the {answer} river.",
                            "On which river lies the city where {person} lives?")


def _language(rng: random.Random, names: _Names) -> tuple[list[Document], str, str]:
    return _person_and_city(rng, names, LANGUAGES, "grew up in",
                            "The people of {city} speak {answer}.",
                            "Which language is spoken in the city where {person} grew up?")


def _employer_city(rng: random.Random, names: _Names) -> tuple[list[Document], str, str]:
    person, company, city = names.person(), names.company(), names.word()
    docs = [
        Document(title=person, text=_person_text(rng, person, f"{person} works for {company}."),
                 is_supporting=True),
        Document(title=company,
                 text=_company_text(rng, f"{company} has its headquarters in {city}."),
                 is_supporting=True),
    ]
    question = f"In which city does the company that employs {person} have its headquarters?"
    return docs, question, city


TEMPLATES: tuple[_Template, ...] = (_born_in, _river, _language, _employer_city)

# One-fact questions: (fact, question, answer) of a person, and the same kinds of facts about
# other people as distractors. The name never starts a line or a sentence, so a byte-level
# BPE (Qwen2's pre-tokenizer attaches the preceding space to a word) cuts it into the same
# tokens in the question, the document, the memory and the title ("\nKovan" and " Kovan" would
# be different tokens); every answer comes from a closed list, so it is one word to read, and
# guessing scores about 1 in 10.
_ONE_HOP = (
    lambda rng, p: (f"The person {p} was born in {(a := rng.choice(COUNTRIES))}.",
                    f"In which country was {p} born?", a),
    lambda rng, p: (f"The person {p} lives by the {(a := rng.choice(RIVERS))} river.",
                    f"By which river does {p} live?", a),
    lambda rng, p: (f"The person {p} speaks {(a := rng.choice(LANGUAGES))}.",
                    f"Which language does {p} speak?", a),
    lambda rng, p: (f"The person {p} works as a {(a := rng.choice(_JOBS))}.",
                    f"What does {p} work as?", a),
)


def _one_hop_doc(rng: random.Random, names: _Names, kind: int, gold: bool
                 ) -> tuple[Document, str, str]:
    person = names.word()
    fact, question, answer = _ONE_HOP[kind](rng, person)
    return Document(title=f"About {person}", text=fact, is_supporting=gold), question, answer


def _distractor(rng: random.Random, names: _Names) -> Document:
    """One paragraph about entities that appear nowhere else."""
    kind = rng.randrange(8)
    if kind < 4:
        person = names.person()
        fact = (
            f"{person} was born in {names.word()}.",
            f"{person} lives in {names.word()}.",
            f"{person} grew up in {names.word()}.",
            f"{person} works for {names.company()}.",
        )[kind]
        return Document(title=person, text=_person_text(rng, person, fact), is_supporting=False)
    if kind < 7:
        city = names.word()
        fact = (
            f"{city} is a city in {rng.choice(COUNTRIES)}.",
            f"{city} lies on the {rng.choice(RIVERS)} river.",
            f"The people of {city} speak {rng.choice(LANGUAGES)}.",
        )[kind - 4]
        return Document(title=city, text=_city_text(rng, fact), is_supporting=False)
    company = names.company()
    return Document(title=company,
                    text=_company_text(rng, f"{company} has its headquarters in {names.word()}."),
                    is_supporting=False)


def make_synthetic_records(
    num_questions: int,
    num_docs: int = 10,
    seed: int = 0,
    *,
    hops: Literal[1, 2] = 2,
    entities: Literal["all", "train", "eval"] = "all",
) -> list[QARecord]:
    """`num_questions` questions, each over `num_docs` paragraphs (`hops` gold, shuffled).

    `entities` picks the half of the invented names used ("train" and "eval" never share
    one). Same arguments → identical records. Ids are `syn-{seed}-{i}` (two hops, all
    entities) or `syn{hops}-{entities}-{seed}-{i}`.
    """
    if isinstance(num_questions, bool) or not isinstance(num_questions, int) or num_questions < 1:
        raise MemrlInputError(f"num_questions must be a positive integer, got {num_questions!r}")
    if hops not in (1, 2):
        raise MemrlInputError(f"hops must be 1 or 2, got {hops!r}")
    if entities not in ENTITY_SPLITS:
        raise MemrlInputError(f"entities must be one of {', '.join(ENTITY_SPLITS)}, got "
                              f"{entities!r}")
    if isinstance(num_docs, bool) or not isinstance(num_docs, int) or num_docs < hops:
        raise MemrlInputError(
            f"num_docs must be an integer of at least {hops} (the gold paragraphs), got "
            f"{num_docs!r}"
        )
    rng = random.Random(seed)
    names = _Names(rng, entities)
    prefix = "syn" if (hops, entities) == (2, "all") else f"syn{hops}-{entities}"
    records = []
    for i in range(num_questions):
        if hops == 1:
            doc, question, answer = _one_hop_doc(rng, names, i % len(_ONE_HOP), True)
            gold = [doc]
            distractors = [_one_hop_doc(rng, names, rng.randrange(len(_ONE_HOP)), False)[0]
                           for _ in range(num_docs - 1)]
        else:
            gold, question, answer = TEMPLATES[i % len(TEMPLATES)](rng, names)
            distractors = [_distractor(rng, names) for _ in range(num_docs - len(gold))]
        documents = gold + distractors
        rng.shuffle(documents)
        records.append(QARecord(id=f"{prefix}-{seed}-{i}", question=question, answers=[answer],
                                documents=documents, num_docs=num_docs))
    return records


def synthetic_corpus(seed: int, n: int) -> list[str]:
    """`n` sample texts (context, question, answer) in the synthetic data's vocabulary,
    e.g. to train the tiny test tokenizer."""
    if n < 0:
        raise MemrlInputError(f"n must be non-negative, got {n}")
    if n == 0:
        return []
    return [
        f"{render_documents(r.documents)}\n\nQuestion: {r.question}\nAnswer: {r.answers[0]}"
        for r in make_synthetic_records(n, num_docs=4, seed=seed)
    ]
