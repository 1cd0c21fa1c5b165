"""The language of the biographies task: the six kinds of fact, the sentence forms and the
question paraphrases of each split, the invented words (names, towns, companies), and the
sentences made of them (the task itself: `memrl.data.biographies.build`)."""

from __future__ import annotations

import functools
import random
import re
import zlib
from dataclasses import dataclass

from memrl.data.synthetic import entity_split
from memrl.errors import MemrlInputError

KINDS = ("birthplace", "residence", "occupation", "employer", "birth_year", "instrument")
"""The attributes a biography states (each at most once) and a question asks."""

SPLITS = ("train", "eval")
"""`train`: training people, forms and paraphrases; `eval`: the disjoint held-out halves."""

NAME_POOLS = ("distinct", "shared")
"""How the people of a split are named (`name_pool`). distinct: from every first and last
name of the split (~1,100 each), so two people share a name part only where a namesake is
placed; shared: from a small fixed pool of each (`SHARED_FIRST_NAMES`, `SHARED_LAST_NAMES`),
so first names and surnames recur among many people, as in real text."""
SHARED_FIRST_NAMES = 200
"""First names of a split's `shared` pool (at 1,536 biographies each is borne ~8 times)."""
SHARED_LAST_NAMES = 400
"""Surnames of a split's `shared` pool."""

JOBS = (
    "accountant", "architect", "astronomer", "baker", "beekeeper", "blacksmith",
    "bookbinder", "butcher", "carpenter", "cartographer", "chemist", "cooper", "dentist",
    "electrician", "engraver", "florist", "gardener", "geologist", "glassblower", "jeweller",
    "librarian", "locksmith", "mechanic", "midwife", "nurse", "optician", "painter",
    "pharmacist", "plumber", "potter", "sculptor", "shoemaker", "stonemason", "surveyor",
    "tailor", "translator", "upholsterer", "veterinarian", "watchmaker", "welder",
)
INSTRUMENTS = (
    "accordion", "bagpipe", "balalaika", "banjo", "bassoon", "bouzouki", "cello",
    "clarinet", "concertina", "cornet", "didgeridoo", "double bass", "dulcimer", "euphonium",
    "flute", "glockenspiel", "guitar", "harmonica", "harmonium", "harp", "mandolin",
    "marimba", "oboe", "organ", "piano", "piccolo", "recorder", "saxophone", "sitar",
    "tambourine", "trombone", "trumpet", "tuba", "ukulele", "viola", "violin", "xylophone",
    "zither",
)
YEARS = tuple(str(y) for y in range(1901, 2006))
COMPANY_KINDS = (
    "Brewery", "Canning", "Dairies", "Foundry", "Glassworks", "Ironworks", "Mills",
    "Potteries", "Press", "Printers", "Ropeworks", "Shipping", "Tanneries", "Textiles",
    "Timber", "Traders",
)

# Sentence forms. Slots: {n} the full name, {p} its possessive ("Dajal Brouwick's"), {v} the
# value, {a} the value with its article ("an architect"). A form that starts with {n} or {p}
# may be written with a pronoun instead ("She lives in ...", "Her employer is ..."), but only
# in a sentence that does not state the asked attribute.
FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    "birthplace": {
        "train": (
            "{n} was born in {v}.",
            "{v} is the town where {n} was born.",
            "{n}, who was born in {v}, still speaks of the place with pride.",
            "{p} birthplace is {v}.",
            "{n} is a native of {v}.",
        ),
        "eval": (
            "It was in {v} that {n} was born.",
            "{n} came into the world in {v}.",
            "{n} first saw the light of day in {v}.",
            "Born in {v}, {n} remembers the place fondly.",
            "{p} place of birth is {v}.",
        ),
    },
    "residence": {
        "train": (
            "{n} lives in {v}.",
            "These days {n} lives in {v}.",
            "{v} is where {n} lives now.",
            "{p} home is in {v}.",
            "{n}, who lives in {v}, walks to the market every morning.",
        ),
        "eval": (
            "{n} has made a home in {v}.",
            "{n} resides in the town of {v}.",
            "{v} is now home to {n}.",
            "Now living in {v}, {n} rarely travels far.",
            "{n} settled in {v} for good.",
        ),
    },
    "occupation": {
        "train": (
            "{n} works as {a}.",
            "By profession, {n} is {a}.",
            "{n} has worked as {a} for many years.",
            "{n}, {a} by profession, rarely takes a holiday.",
            "{p} trade is that of {a}.",
        ),
        "eval": (
            "{n} is {a} by trade.",
            "{n} earns a living as {a}.",
            "As {a}, {n} keeps long hours.",
            "The {v} {n} is well known in the neighbourhood.",
            "{n} trained as {a} and still practises the trade.",
        ),
    },
    "employer": {
        "train": (
            "{n} works for {v}.",
            "{v} has employed {n} for years.",
            "{p} employer is {v}.",
            "At {v}, {n} is a valued member of staff.",
            "{n} joined {v} and has worked there ever since.",
        ),
        "eval": (
            "{n} is employed by {v}.",
            "{n} has a job at {v}.",
            "{v} is the company where {n} works.",
            "{n}, an employee of {v}, rarely misses a day.",
            "{n} draws a salary from {v}.",
        ),
    },
    "birth_year": {
        "train": (
            "{n} was born in {v}.",
            "{p} year of birth is {v}.",
            "{n} was born in the year {v}.",
            "Born in {v}, {n} is the eldest of three children.",
            "The year {v} saw the birth of {n}.",
        ),
        "eval": (
            "It was in {v} that {n} was born.",
            "{n} came into the world in {v}.",
            "{n}, born in {v}, grew up in a large family.",
            "The records give {v} as the year of {p} birth.",
            "{p} birth year is {v}.",
        ),
    },
    "instrument": {
        "train": (
            "{n} plays the {v}.",
            "The {v} is {p} favourite instrument.",
            "In the evenings, {n} plays the {v}.",
            "{n}, who plays the {v}, performs at local weddings.",
            "{n} learned to play the {v} as a child.",
        ),
        "eval": (
            "{p} instrument of choice is the {v}.",
            "Of all instruments, {n} loves the {v} most.",
            "A skilled player of the {v}, {n} performs often.",
            "The instrument {n} plays is the {v}.",
            "{n} is a keen player of the {v}.",
        ),
    },
}
"""Ten sentence forms per kind: five for training, five held out for evaluation."""

QUESTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "birthplace": {
        "train": ("In which town was {n} born?", "Where was {n} born?",
                  "What is {n}'s place of birth?"),
        "eval": ("What is the birthplace of {n}?", "Which town does {n} come from originally?",
                 "In what town did {n} come into the world?"),
    },
    "residence": {
        "train": ("Where does {n} live?", "In which town does {n} live now?",
                  "Which town is {n}'s home?"),
        "eval": ("Where does {n} currently reside?", "In what town does {n} have a home these "
                 "days?", "What is the town of residence of {n}?"),
    },
    "occupation": {
        "train": ("What does {n} do for a living?", "What is {n}'s occupation?",
                  "What is {n}'s job?"),
        "eval": ("What is the profession of {n}?", "What kind of work does {n} do?",
                 "What trade does {n} practise?"),
    },
    "employer": {
        "train": ("Which company does {n} work for?", "Who employs {n}?",
                  "What is the name of {n}'s employer?"),
        "eval": ("Which company employs {n}?", "By which firm is {n} employed?",
                 "At which company does {n} have a job?"),
    },
    "birth_year": {
        "train": ("In which year was {n} born?", "What is {n}'s year of birth?",
                  "When was {n} born?"),
        "eval": ("What year was {n} born in?", "In what year did {n} come into the world?",
                 "What is the birth year of {n}?"),
    },
    "instrument": {
        "train": ("Which instrument does {n} play?", "What is {n}'s favourite instrument?",
                  "What musical instrument does {n} play?"),
        "eval": ("On which instrument does {n} perform?", "What instrument is {n} known to play?",
                 "Which instrument does {n} love most?"),
    },
}
"""Six question paraphrases per kind: three for training, three held out for evaluation."""

_PRONOUNS = {"he": ("He", "His"), "she": ("She", "Her")}

# Syllables of the invented words (names, towns, company names).
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r",
           "s", "st", "t", "tr", "v", "z", "th", "sh", "j", "c", "w")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea", "io", "ei")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rt", "lk")
_NAME_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ia", "ei")
_FIRST_ENDINGS = ("", "", "", "n", "l", "r", "s", "th", "na", "ra", "la", "ssa")
_LAST_SUFFIXES = ("son", "ley", "wick", "ton", "man", "berg", "ard", "ell", "er", "ing",
                  "ett", "ov", "ski", "ez", "ano", "quist", "ridge", "by", "well", "hart")
_TOWN_SUFFIXES = ("mouth", "haven", "stead", "bury", "dale", "port", "moor", "holm", "gate",
                  "field", "cliff", "brook", "wold", "minster", "ness", "thorpe")


@dataclass(frozen=True)
class Vocabulary:
    """The invented words, the same for every seed: name parts by split, towns, companies."""

    first_names: dict[str, tuple[str, ...]]
    """First names of each split (disjoint)."""
    last_names: dict[str, tuple[str, ...]]
    """Last names of each split (disjoint; no last name is a prefix of another)."""
    towns: tuple[str, ...]
    """Towns of birth and of residence, shared by both splits."""
    companies: tuple[str, ...]
    """Employers ("Velmora Glassworks"), shared by both splits."""


def _word(rng: random.Random, syllables: int, ending: str) -> str:
    stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(syllables))
    return (stem + ending).capitalize()


def _prefix_free(words: set[str]) -> list[str]:
    """The words that are no other word's prefix (so "Kovan Drel" never occurs inside
    "Kovan Drelson"); in sorted order a word's extensions follow it directly."""
    ordered = sorted(words)
    return [w for w, nxt in zip(ordered, [*ordered[1:], ""]) if not nxt.startswith(w)]


@functools.cache
def vocabulary() -> Vocabulary:
    """The invented words (built once; a fixed seed, independent of any data seed)."""
    rng = random.Random("memrl-biographies-vocabulary-v1")
    used: set[str] = {w.lower() for w in (*JOBS, *INSTRUMENTS, *COMPANY_KINDS)}

    def fresh(n: int, make) -> set[str]:
        out: set[str] = set()
        while len(out) < n:
            w = make()
            if 4 <= len(w) <= 12 and w.lower() not in used:
                used.add(w.lower())
                out.add(w)
        return out

    first = fresh(2400, lambda: (rng.choice(_ONSETS) + rng.choice(_NAME_VOWELS)
                                 + rng.choice(_CODAS[:7]) + rng.choice(_ONSETS[:15])
                                 + rng.choice(_NAME_VOWELS[:5])
                                 + rng.choice(_FIRST_ENDINGS)).capitalize())
    last = _prefix_free(fresh(2400, lambda: (rng.choice(_ONSETS) + rng.choice(_NAME_VOWELS)
                                             + rng.choice(_CODAS)
                                             + rng.choice(_LAST_SUFFIXES)).capitalize()))
    towns = sorted(fresh(600, lambda: _word(rng, 1, rng.choice(_TOWN_SUFFIXES))))
    stems = sorted(fresh(300, lambda: _word(rng, 2, "")))
    companies = sorted({f"{rng.choice(stems)} {rng.choice(COMPANY_KINDS)}" for _ in range(900)})
    return Vocabulary(
        first_names={s: tuple(sorted(w for w in first if entity_split(w) == s)) for s in SPLITS},
        last_names={s: tuple(w for w in last if entity_split(w) == s) for s in SPLITS},
        towns=tuple(towns),
        companies=tuple(companies),
    )


@functools.cache
def name_pool(split: str, names: str = "distinct") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The first names and the last names people of `split` are given under `names`
    (`NAME_POOLS`): the whole split's, or its `shared` pool, a fixed sample of them (the same
    for every data seed; disjoint between the splits as the splits are)."""
    vocab = vocabulary()
    firsts, lasts = vocab.first_names[split], vocab.last_names[split]
    if names == "shared":
        rng = random.Random(f"memrl-biographies-shared-names-{split}")
        return (tuple(sorted(rng.sample(firsts, SHARED_FIRST_NAMES))),
                tuple(sorted(rng.sample(lasts, SHARED_LAST_NAMES))))
    return firsts, lasts


def pronoun_of(first_name: str) -> str:
    """"he" or "she": fixed by the first name (a hash bit other than the split's)."""
    return ("he", "she")[(zlib.crc32(first_name.lower().encode()) >> 1) % 2]


def article(word: str) -> str:
    """`word` with its indefinite article ("a potter", "an architect")."""
    return f"{'an' if word[0].lower() in 'aeiou' else 'a'} {word}"


def can_use_pronoun(form: str) -> bool:
    """Whether `form` reads correctly with a pronoun in place of the name (it starts with
    the name or its possessive)."""
    return form.startswith(("{n} ", "{p} "))


def biography_sentence(form: str, name: str, value: str, pronoun: str | None = None) -> str:
    """One sentence: `form` filled with `name` (or, when `pronoun` is "he"/"she" and the
    form allows it, that pronoun) and `value`."""
    if pronoun is not None:
        if not can_use_pronoun(form):
            raise MemrlInputError(f"the form {form!r} cannot take a pronoun")
        subject, possessive = _PRONOUNS[pronoun]
        return form.format(n=subject, p=possessive, v=value, a=article(value))
    return form.format(n=name, p=f"{name}'s", v=value, a=article(value))


def biography_question(template: str, name: str) -> str:
    """A question paraphrase filled with the asked person's full name."""
    return template.format(n=name)


def _question_pattern(template: str) -> re.Pattern[str]:
    head, tail = template.split("{n}")
    return re.compile(re.escape(head) + r"(\S+ \S+)" + re.escape(tail))


_QUESTION_PATTERNS = tuple(_question_pattern(t) for by_split in QUESTIONS.values()
                           for templates in by_split.values() for t in templates)


def asked_person(question: str) -> str | None:
    """The full name a biographies question asks about (the inverse of `biography_question`
    over every paraphrase of `QUESTIONS`), or None for a question of no paraphrase."""
    for pattern in _QUESTION_PATTERNS:
        if m := pattern.fullmatch(question):
            return m.group(1)
    return None
