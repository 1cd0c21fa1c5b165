"""The language of the state-tracking benchmarks: people, places, objects, attribute values,
the sentence form of every kind of event and the question paraphrases, each in two disjoint
halves (`train`, `eval`), so an evaluation story shares no name, place, object, value,
sentence form or question form with any training story.

Slots of a form: {p} a person, {q} a second person, {l} a place, {o} an object, {v} a value
as written ("Lisbon"), {a} a value with its article ("a baker"). Every event sentence starts
with the name of the person it is about or names that person before any other person, and
ends with a full stop; no form is a prefix of another of the same kind.
"""

from __future__ import annotations

from memrl.errors import MemrlInputError

SPLITS = ("train", "eval")
"""`train`: training names, places, objects, values and forms; `eval`: the held-out halves."""

PEOPLE: dict[str, tuple[str, ...]] = {
    "train": ("Mary", "John", "Sandra", "Daniel", "Emily", "Oliver", "Grace", "Henry",
              "Alice", "Peter", "Laura", "Simon", "Clara", "Victor", "Nora", "Felix"),
    "eval": ("Julia", "Thomas", "Rachel", "Samuel", "Helen", "Martin", "Irene", "George",
             "Sophie", "Walter", "Agnes", "Robert", "Olga", "Dennis", "Paula", "Brian"),
}
PLACES: dict[str, tuple[str, ...]] = {
    "train": ("kitchen", "garden", "hallway", "bathroom", "bedroom", "office", "cellar",
              "attic", "library", "garage", "balcony", "pantry"),
    "eval": ("study", "nursery", "laundry", "porch", "workshop", "greenhouse", "courtyard",
             "lobby", "corridor", "dining room", "playroom", "shed"),
}
OBJECTS: dict[str, tuple[str, ...]] = {
    "train": ("football", "apple", "milk", "umbrella", "lantern", "notebook", "kettle",
              "hammer", "violin case", "basket", "scarf", "compass"),
    "eval": ("key", "orange", "bottle", "suitcase", "candle", "camera", "teapot", "wrench",
             "backpack", "blanket", "map", "clock"),
}
CITIES: dict[str, tuple[str, ...]] = {
    "train": ("Lisbon", "Madrid", "Vienna", "Oslo", "Dublin", "Prague", "Athens", "Warsaw",
              "Helsinki", "Zurich", "Seville", "Krakow"),
    "eval": ("Porto", "Berlin", "Rome", "Stockholm", "Edinburgh", "Budapest", "Lyon",
             "Munich", "Geneva", "Bruges", "Naples", "Riga"),
}
JOBS: dict[str, tuple[str, ...]] = {
    "train": ("baker", "teacher", "nurse", "pilot", "carpenter", "chemist", "florist",
              "architect", "plumber", "librarian", "tailor", "dentist"),
    "eval": ("lawyer", "farmer", "journalist", "engineer", "butcher", "painter", "surgeon",
             "electrician", "sailor", "optician", "mechanic", "accountant"),
}

EVENT_FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    "move": {
        "train": ("{p} went to the {l}.", "{p} moved to the {l}.", "{p} journeyed to the {l}."),
        "eval": ("{p} travelled to the {l}.", "{p} walked into the {l}.",
                 "{p} headed to the {l}."),
    },
    "take": {
        "train": ("{p} picked up the {o}.", "{p} grabbed the {o}.", "{p} took the {o}."),
        "eval": ("{p} got the {o}.", "{p} collected the {o}.", "{p} lifted the {o}."),
    },
    "drop": {
        "train": ("{p} dropped the {o}.", "{p} put down the {o}.", "{p} left the {o} there."),
        "eval": ("{p} discarded the {o}.", "{p} set down the {o}.", "{p} let go of the {o}."),
    },
    "give": {
        "train": ("{p} gave the {o} to {q}.", "{p} handed the {o} to {q}.",
                  "{p} passed the {o} to {q}."),
        "eval": ("{p} offered the {o} to {q}.", "{p} handed over the {o} to {q}.",
                 "{p} gave {q} the {o}."),
    },
    "city": {
        "train": ("{p} lives in {v}.", "{p} has a home in {v}.", "{p} has since moved to {v}.",
                  "{p} relocated to {v}."),
        "eval": ("{p} resides in {v}.", "{p} is based in {v}.", "{p} has recently moved to {v}.",
                 "{p} changed homes and is now in {v}."),
    },
    "job": {
        "train": ("{p} works as {a}.", "{p} is employed as {a}.", "{p} has since become {a}.",
                  "{p} changed careers and now works as {a}."),
        "eval": ("{p} earns a living as {a}.", "{p} has a job as {a}.",
                 "{p} recently retrained as {a}.", "{p} switched jobs and is now {a}."),
    },
}
"""Sentence forms of each kind of event. `city` and `job` state an attribute: the first two
forms state it, the last two say it changed (either may come first in a story: a story
states a value, then changes it)."""

QUESTION_FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    "where-now": {
        "train": ("Where is {p} now?", "Where is {p}?", "In which room is {p} at the end?"),
        "eval": ("What is the current location of {p}?", "Where can {p} be found now?",
                 "Which place is {p} in now?"),
    },
    "where-before": {
        "train": ("Where was the {o} before the {l}?",
                  "In which room was the {o} before it was in the {l}?"),
        "eval": ("Where had the {o} been before the {l}?",
                 "What place was the {o} in just before the {l}?"),
    },
    "who-has": {
        "train": ("Who has the {o} now?", "Who is holding the {o}?"),
        "eval": ("Who is carrying the {o} at the end?", "Which person has the {o} now?"),
    },
    "count-visits": {
        "train": ("How many times did {p} go to the {l}?",),
        "eval": ("How often did {p} visit the {l}?",),
    },
    "count-held": {
        "train": ("How many objects is {p} carrying now?",),
        "eval": ("How many things does {p} hold at the end?",),
    },
    "city": {
        "train": ("Where does {p} live now?", "In which city does {p} live today?"),
        "eval": ("What is the current city of {p}?", "Which city is {p} living in now?"),
    },
    "job": {
        "train": ("What is the job of {p} now?", "What does {p} do for a living now?"),
        "eval": ("What is the current occupation of {p}?", "What work does {p} do now?"),
    },
}
"""Question paraphrases of each kind of question, split in two."""

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                "nine", "ten")
"""A count's answers are its digits and its word ("3", "three")."""


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise MemrlInputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def count_answers(count: int) -> list[str]:
    """The gold answers of a count: its digits, and its word up to ten."""
    return [str(count), *([NUMBER_WORDS[count]] if count < len(NUMBER_WORDS) else [])]


def all_names() -> tuple[str, ...]:
    """Every person of both splits (filler text that mentions one is never used)."""
    return tuple(name for names in PEOPLE.values() for name in names)
