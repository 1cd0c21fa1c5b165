"""Natural-language biographies: a RULER-style one-fact task that can only be solved by reading.

This module draws the questions, their distractors and the files; the words and sentences
are in `memrl.data.biographies.language`.

Every paragraph is a short biography (2-4 sentences, titled with the person's full name) of
one invented person ("Dajal Brouwick"); each sentence states one attribute of six kinds
(`KINDS`: town of birth, town of residence, occupation, employer, year of birth, instrument)
in one of ten sentence forms per kind (`FORMS`). A question asks one attribute of one person
in one of six paraphrases per kind (`QUESTIONS`); its answer is the attribute's value.

What makes it a reading task, not a template to match:
  - Values are open: invented towns and companies (hundreds), 40 jobs, 38 instruments,
    105 years; the town of birth and the town of residence come from the same pool, and
    "was born in" is followed by a town in one form and a year in another.
  - The distractors are other people's biographies with facts of the same kinds, and a share
    (`hard_share`) of them are namesakes: people sharing the asked person's first name or
    last name, whose biography states the asked kind with a different value. Only the full
    name tells the gold paragraph apart.
  - Held-out splits: `split="train"` and `split="eval"` use disjoint halves of the first
    names and of the last names (`memrl.data.synthetic.entity_split`), so an evaluation
    person shares no name part with any training person, AND disjoint halves of the
    sentence forms (five per kind each) and of the question paraphrases (three per kind
    each): evaluation text is written in forms never seen in training. Values are shared.

The gold fact (`QARecord.facts`, the sentence the oracle copies into memory) always holds the
person's full name and the answer. Other sentences of a biography may use "He"/"She"/"His"/
"Her" (only forms that start with the name do), but such a sentence never states the asked
attribute.

Shared names (`names="shared"`, `NAME_POOLS`): people are named from a small pool of first
names and one of surnames per split (`name_pool`), so at every length many people share a
first name or a surname, as in real text, and only the whole name tells them apart. Every
person sharing a name part with the asked person (a namesake, placed or drawn by chance)
states the asked kind with another value, in a sentence naming them in full; the first two
distractors of every question are placed namesakes (one sharing the first name, one the
surname), so the context holds both at every N >= 3, and a `hard_share` of the distractors
after them are placed namesakes too. Questions cycle through every kind at every length.

Determinism: question i of (seed, split) depends only on (seed, split, i) and on the people
asked before it; its distractors are a prefix of one fixed stream, so the distractors at N
documents are a subset of those at any larger N, and namesakes make up the same share at
every N (exactly floor((N - 1) * hard_share) of the N - 1 distractors). The gold paragraph
lies at a random position, drawn anew for each N.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memrl.data.biographies.language import (
    FORMS,
    INSTRUMENTS,
    NAME_POOLS,
    JOBS,
    KINDS,
    QUESTIONS,
    SPLITS,
    YEARS,
    biography_question,
    biography_sentence,
    can_use_pronoun,
    name_pool,
    pronoun_of,
    vocabulary,
)
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.io import write_json_atomic
from memrl.data.records import Document, QARecord, render_documents
from memrl.data.ruler_hqa import ruler_hqa_path
from memrl.errors import MemrlInputError

DEFAULT_HARD_SHARE = 0.25
"""Share of a question's distractors that are namesakes of the asked person."""

VALIDATION_START = 100_000
"""Validation questions are questions VALIDATION_START, ... of the evaluation stream, so they
never repeat an evaluation question (of which there may be at most this many)."""
SHARED_VALIDATION_START = 10_000
"""`VALIDATION_START` of the shared-names task (whose pools name at most 40,000 people)."""


def validation_start(names: str = "distinct") -> int:
    """The first validation question of the evaluation stream under `names`."""
    return SHARED_VALIDATION_START if names == "shared" else VALIDATION_START


def record_id(split: str, seed: int, index: int, names: str = "distinct") -> str:
    """The id of question `index` of (seed, split): `bio-{split}-{seed}-{index}`, with
    `bio-shared-` under shared names."""
    return f"bio{'-shared' if names == 'shared' else ''}-{split}-{seed}-{index}"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise MemrlInputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def _rng(seed: int, split: str, *parts: object) -> random.Random:
    # A string seed is hashed with SHA-512: stable across runs and PYTHONHASHSEED.
    return random.Random(":".join(["biographies", str(seed), split, *map(str, parts)]))


class _Writer:
    """Writes biographies in one split's forms, with values from the shared pools."""

    def __init__(self, split: str) -> None:
        self.split = split
        self.vocab = vocabulary()
        self.values = {
            "birthplace": self.vocab.towns, "residence": self.vocab.towns,
            "occupation": JOBS, "employer": self.vocab.companies, "birth_year": YEARS,
            "instrument": INSTRUMENTS,
        }

    def values_for(self, rng: random.Random, kinds: Sequence[str],
                   avoid: dict[str, str]) -> dict[str, str]:
        """A value per kind; never `avoid[kind]`, and two different towns for birthplace
        and residence (so a question about one is never answered by the other)."""
        out: dict[str, str] = {}
        for kind in kinds:
            while True:
                value = rng.choice(self.values[kind])
                if value != avoid.get(kind) and value not in out.values():
                    break
            out[kind] = value
        return out

    def paragraph(self, rng: random.Random, name: str, kinds: Sequence[str],
                  values: dict[str, str], asked: str | None) -> tuple[Document, str | None]:
        """A titled biography stating `kinds` in a random order; the first sentence and the
        sentence of `asked` name the person in full, the others may use a pronoun. Returns
        the paragraph and the sentence stating `asked`."""
        order = list(kinds)
        rng.shuffle(order)
        pronoun = pronoun_of(name.split()[0])
        sentences, fact = [], None
        for i, kind in enumerate(order):
            form = rng.choice(FORMS[kind][self.split])
            short = (i > 0 and kind != asked and can_use_pronoun(form) and rng.random() < 0.5)
            sentence = biography_sentence(form, name, values[kind], pronoun if short else None)
            sentences.append(sentence)
            if kind == asked:
                fact = sentence
        return Document(title=name, text=" ".join(sentences), is_supporting=False), fact


@dataclass(frozen=True)
class BiographyQuestion:
    """One question with its gold paragraph and its stream of distractors."""

    index: int
    kind: str
    name: str
    question: str
    answer: str
    fact: str
    gold: Document
    distractors: tuple[Document, ...]

    def namesakes(self, num_docs: int) -> int:
        """How many of the distractors at N = `num_docs` share the asked person's first or
        last name."""
        first, last = self.name.split()
        return sum(1 for d in self.distractors[: num_docs - 1]
                   if d.title.split()[0] == first or d.title.split()[1] == last)

    def documents(self, num_docs: int, seed: int, split: str) -> list[Document]:
        """The gold paragraph and the first `num_docs - 1` distractors, shuffled (the gold
        paragraph's position is drawn anew for each N)."""
        docs = [self.gold, *self.distractors[: num_docs - 1]]
        _rng(seed, split, self.index, "order", num_docs).shuffle(docs)
        return docs


def biography_paragraphs(count: int, seed: int = 0, *, split: str = "train") -> list[str]:
    """`count` biography paragraphs of random people of `split` (2-4 facts each, in the
    split's sentence forms), without titles: filler text for other tasks. Paragraph k
    depends only on (seed, split, k), so the first k paragraphs are the same for any
    larger `count`."""
    _check_split(split)
    writer = _Writer(split)
    firsts, lasts = writer.vocab.first_names[split], writer.vocab.last_names[split]
    out = []
    for k in range(count):
        rng = _rng(seed, split, "filler", k)
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        kinds = rng.sample(KINDS, rng.randint(2, 4))
        values = writer.values_for(rng, kinds, {})
        out.append(writer.paragraph(rng, name, kinds, values, None)[0].text)
    return out


def namesake_count(num_distractors: int, hard_share: float) -> int:
    """How many of a question's first `num_distractors` distractors are namesakes:
    floor(num_distractors * hard_share), with hard_share rounded to 6 decimals."""
    scale = 1_000_000
    return num_distractors * round(hard_share * scale) // scale


def is_namesake_slot(k: int, hard_share: float) -> bool:
    """Whether distractor k (0-based) of a question's stream is a namesake (so that the
    first m distractors hold exactly `namesake_count(m, hard_share)` namesakes, for every m)."""
    return namesake_count(k + 1, hard_share) > namesake_count(k, hard_share)


def _people(seed: int, split: str, stop: int, names: str) -> list[tuple[str, str]]:
    """The asked people of questions 0 .. stop-1: distinct (first, last) pairs of `split`."""
    firsts, lasts = name_pool(split, names)
    space = len(firsts) * len(lasts)
    rng = _rng(seed, split, "people")
    seen: set[int] = set()
    out = []
    while len(out) < stop:
        j = rng.randrange(space)
        if j not in seen:
            seen.add(j)
            out.append((firsts[j // len(lasts)], lasts[j % len(lasts)]))
    return out


def _distractor_name(rng: random.Random, asked: tuple[str, str], namesake: bool,
                     firsts: Sequence[str], lasts: Sequence[str], used: set[str]) -> str:
    first, last = asked
    while True:
        if namesake:
            if rng.random() < 0.5:
                f, la = first, rng.choice(lasts)
            else:
                f, la = rng.choice(firsts), last
        else:
            f, la = rng.choice(firsts), rng.choice(lasts)
            if f == first or la == last:
                continue
        name = f"{f} {la}"
        if name not in used:
            used.add(name)
            return name


def shared_namesakes(num_distractors: int, hard_share: float) -> int:
    """Namesakes placed among a shared-names question's first `num_distractors` distractors:
    the first two, then `namesake_count` of the rest (people drawn from the pools may be
    namesakes besides)."""
    return min(num_distractors, 2) + namesake_count(max(num_distractors - 2, 0), hard_share)


def _namesake_name(rng: random.Random, asked: tuple[str, str], side: int,
                   firsts: Sequence[str], lasts: Sequence[str], used: set[str]) -> str:
    """A fresh name sharing the asked person's first name (side 0) or surname (side 1); the
    other side once one has none left."""
    first, last = asked
    for part in (side, 1 - side):
        make = (lambda other: f"{first} {other}") if part == 0 else (
            lambda other: f"{other} {last}")
        pool = lasts if part == 0 else firsts
        for _ in range(64):
            name = make(rng.choice(pool))
            if name not in used:
                used.add(name)
                return name
        options = [n for n in map(make, pool) if n not in used]
        if options:
            used.add(name := rng.choice(options))
            return name
    raise MemrlInputError(f"no namesake of {first} {last} left: lower hard_share or num_docs")


def _shared_distractor_name(rng: random.Random, asked: tuple[str, str], k: int,
                            hard_share: float, firsts: Sequence[str], lasts: Sequence[str],
                            used: set[str]) -> str:
    """Distractor k's name under shared names: a placed namesake (k < 2: the first name, then
    the surname; a `hard_share` slot after them: either), else anyone of the pools."""
    if k < 2 or is_namesake_slot(k - 2, hard_share):
        return _namesake_name(rng, asked, k if k < 2 else rng.randrange(2), firsts, lasts, used)
    while True:
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in used:
            used.add(name)
            return name


def _distractor(writer: _Writer, rng: random.Random, k: int, asked: tuple[str, str],
                kind: str, gold_value: str, hard_share: float, names: str,
                used: set[str]) -> Document:
    """Distractor k of a question about `asked`: a namesake states `kind` with another value
    (under shared names in a sentence naming them in full)."""
    firsts, lasts = name_pool(writer.split, names)
    others = [k2 for k2 in KINDS if k2 != kind]
    if names == "shared":
        other = _shared_distractor_name(rng, asked, k, hard_share, firsts, lasts, used)
        namesake = bool(set(other.split()) & set(asked))
    else:
        namesake = is_namesake_slot(k, hard_share)
        other = _distractor_name(rng, asked, namesake, firsts, lasts, used)
    if namesake:  # states the asked kind, with another value
        dkinds = [kind, *rng.sample(others, rng.randint(1, 3))]
    else:
        dkinds = rng.sample(KINDS, rng.randint(2, 4))
    dvalues = writer.values_for(rng, dkinds, {kind: gold_value} if namesake else {})
    full = kind if namesake and names == "shared" else None
    return writer.paragraph(rng, other, dkinds, dvalues, full)[0]


def _question_at(seed: int, split: str, index: int, person: tuple[str, str],
                 max_distractors: int, hard_share: float, names: str) -> BiographyQuestion:
    """Question `index` of (seed, split) about `person`, with `max_distractors` distractors."""
    writer = _Writer(split)
    rng = _rng(seed, split, index)
    kind = KINDS[index % len(KINDS)]
    name = " ".join(person)
    others = [k for k in KINDS if k != kind]
    kinds = [kind, *rng.sample(others, rng.randint(1, 3))]
    values = writer.values_for(rng, kinds, {})
    gold, fact = writer.paragraph(rng, name, kinds, values, kind)
    assert fact is not None
    question = biography_question(rng.choice(QUESTIONS[kind][split]), name)
    drng = _rng(seed, split, index, "distractors")
    used = {name}
    distractors = [_distractor(writer, drng, k, person, kind, values[kind], hard_share, names,
                               used) for k in range(max_distractors)]
    return BiographyQuestion(
        index=index, kind=kind, name=name, question=question, answer=values[kind], fact=fact,
        gold=gold.model_copy(update={"is_supporting": True}), distractors=tuple(distractors),
    )


def _check_args(num_questions: int, num_docs: int, hard_share: float, split: str,
                start: int = 0, names: str = "distinct") -> None:
    _check_split(split)
    if names not in NAME_POOLS:
        raise MemrlInputError(f"names must be one of {', '.join(NAME_POOLS)}, got {names!r}")
    for label, value, least in (("num_questions", num_questions, 1), ("num_docs", num_docs, 1),
                                ("start", start, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise MemrlInputError(f"{label} must be an integer of at least {least}, got "
                                  f"{value!r}")
    if isinstance(hard_share, bool) or not isinstance(hard_share, (int, float)) \
            or not 0.0 <= hard_share <= 1.0:
        raise MemrlInputError(f"hard_share must be a number from 0 to 1, got {hard_share!r}")
    firsts, lasts = map(len, name_pool(split, names))
    if start + num_questions > firsts * lasts // 2:
        raise MemrlInputError(f"at most {firsts * lasts // 2} questions per split (counting "
                              f"from the first), asked for {start + num_questions}")
    available = firsts + lasts - 2
    needed = (shared_namesakes if names == "shared" else namesake_count)(num_docs - 1,
                                                                        hard_share)
    if needed > available:
        raise MemrlInputError(
            f"num_docs={num_docs} needs {needed} namesakes per question but a person has only "
            f"{available}; lower hard_share or num_docs"
        )


def biography_questions(num_questions: int, max_docs: int, seed: int = 0, *,
                        split: str = "train", hard_share: float = DEFAULT_HARD_SHARE,
                        start: int = 0, names: str = "distinct") -> list[BiographyQuestion]:
    """Questions start .. start+num_questions-1 of (seed, split), each with the distractors
    of up to `max_docs` documents; people named from `name_pool(split, names)`."""
    _check_args(num_questions, max_docs, hard_share, split, start, names)
    people = _people(seed, split, start + num_questions, names)
    return [_question_at(seed, split, i, people[i], max_docs - 1, hard_share, names)
            for i in range(start, start + num_questions)]


def make_biography_records(num_questions: int, num_docs: int = 16, seed: int = 0, *,
                           split: str = "train", hard_share: float = DEFAULT_HARD_SHARE,
                           start: int = 0, names: str = "distinct") -> list[QARecord]:
    """`num_questions` questions over `num_docs` biographies each (one gold), as QARecords
    with `facts` = [the gold sentence] and `is_supporting` set; ids `record_id(...)`.
    Same arguments → identical records."""
    questions = biography_questions(num_questions, num_docs, seed, split=split,
                                    hard_share=hard_share, start=start, names=names)
    return [
        QARecord(id=record_id(split, seed, q.index, names), question=q.question, answers=[q.answer],
                 documents=q.documents(num_docs, seed, split), num_docs=num_docs,
                 facts=[q.fact])
        for q in questions
    ]


def biography_ruler_items(questions: Sequence[BiographyQuestion], num_docs: int, seed: int,
                          split: str) -> list[dict]:
    """RULER-HQA items (the `eval_{N}.json` `memrl eval` reads) at N = `num_docs`:
    `{"index", "input", "answers", "context", "num_docs", "facts", "kind", "namesakes"}`
    (the last two are extra keys the loader ignores: the asked kind and how many namesakes
    the context holds)."""
    return [
        {
            "index": q.index,
            "input": q.question,
            "answers": [q.answer],
            "context": render_documents(q.documents(num_docs, seed, split)),
            "num_docs": num_docs,
            "facts": [q.fact],
            "kind": q.kind,
            "namesakes": q.namesakes(num_docs),
        }
        for q in questions
    ]


def _check_eval(num_questions: int, num_docs_list: Sequence[int], hard_share: float,
                split: str, names: str = "distinct") -> list[int]:
    ns = list(dict.fromkeys(num_docs_list))
    if not ns:
        raise MemrlInputError("give at least one num_docs")
    for n in ns:
        _check_args(num_questions, n, hard_share, split, names=names)
    if num_questions > validation_start(names):
        raise MemrlInputError(f"at most {validation_start(names)} evaluation questions (the "
                              f"validation questions come after them), got {num_questions}")
    return ns


def write_biography_eval(out_dir: str | Path, num_docs_list: Sequence[int], *,
                         num_questions: int = 128, seed: int = 0, split: str = "eval",
                         hard_share: float = DEFAULT_HARD_SHARE,
                         names: str = "distinct") -> list[Path]:
    """Write `eval_{N}.json` for each N: the same questions at every N (atomically; every N
    is checked before any file is written). Returns the paths in the given order."""
    ns = _check_eval(num_questions, num_docs_list, hard_share, split, names)
    questions = biography_questions(num_questions, max(ns), seed, split=split,
                                    hard_share=hard_share, names=names)
    return [write_json_atomic(ruler_hqa_path(out_dir, n),
                              biography_ruler_items(questions, n, seed, split))
            for n in ns]


WRITE_SPLITS = ("all", "train", "eval")
"""What `write_biographies` writes: train.jsonl + val.jsonl (`train`), eval_{N}.json
(`eval`), or both (`all`)."""


def write_biographies(out_dir: str | Path, *, split: str = "all", seed: int = 0,
                      train_questions: int = 10_000, train_docs: int = 16,
                      val_questions: int = 64, eval_questions: int = 128,
                      eval_docs: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024),
                      hard_share: float = DEFAULT_HARD_SHARE,
                      names: str = "distinct") -> list[Path]:
    """The biography task's files in `out_dir` (people named under `names`, `NAME_POOLS`):

      train.jsonl    `train_questions` training questions (training people, forms and
                     paraphrases) over `train_docs` biographies each (memrl JSONL)
      val.jsonl      `val_questions` held-out questions (evaluation people, forms and
                     paraphrases; questions `validation_start(names)`.. of the evaluation stream, so
                     none is an evaluation question) over `train_docs` biographies; none
                     when 0
      eval_{N}.json  the same `eval_questions` held-out questions at each N of `eval_docs`

    Every argument is checked before anything is written. Returns the paths written.
    """
    if split not in WRITE_SPLITS:
        raise MemrlInputError(f"split must be one of {', '.join(WRITE_SPLITS)}, got {split!r}")
    out = Path(out_dir)
    train, evaluation = split in ("all", "train"), split in ("all", "eval")
    first_val = validation_start(names)
    if train:
        _check_args(train_questions, train_docs, hard_share, "train", names=names)
        if val_questions:
            _check_args(val_questions, train_docs, hard_share, "eval", first_val, names)
    if evaluation:
        _check_eval(eval_questions, eval_docs, hard_share, "eval", names)
    paths = []
    if train:
        paths.append(save_records_jsonl(
            make_biography_records(train_questions, train_docs, seed, split="train",
                                   hard_share=hard_share, names=names), out / "train.jsonl"))
        if val_questions:
            paths.append(save_records_jsonl(
                make_biography_records(val_questions, train_docs, seed, split="eval",
                                       hard_share=hard_share, start=first_val, names=names),
                out / "val.jsonl"))
    if evaluation:
        paths += write_biography_eval(out, eval_docs, num_questions=eval_questions, seed=seed,
                                      hard_share=hard_share, names=names)
    return paths
