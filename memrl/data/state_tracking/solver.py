"""A reference solver: the state a question asks about, re-derived from text alone.

`state_facts(question, text)` reads the event sentences of a text (every form of either
split, `EVENT_FORMS`), replays them in a small world and returns the sentences that set the
asked state as it stands at the end of the text: for "Where is John?" John's last move so
far, for "Who has the apple?" the event that gave it its holder, for a city or job the
latest statement of it, for a count every sentence counted. Read over a prefix of a
document it gives the memory an overwrite policy should hold after that prefix (the warm
start's oracle writes it, `memrl.agents.oracle`); read over a whole context it gives the
story's gold facts. A question of no state-tracking form, or a where-before question (its
facts are a trail, not a state), gives None.
"""

from __future__ import annotations

import functools
import re

from memrl.data.state_tracking.language import (
    CITIES,
    EVENT_FORMS,
    JOBS,
    OBJECTS,
    PEOPLE,
    PLACES,
    QUESTION_FORMS,
)
from memrl.data.state_tracking.stories import Event, World

TRACKED = ("where-now", "who-has", "count-visits", "count-held", "city", "job")
"""Question kinds whose answer is a state the solver tracks (where-before is a trail)."""


def _either(values: dict[str, tuple[str, ...]]) -> str:
    names = sorted({v for vs in values.values() for v in vs}, key=len, reverse=True)
    return "|".join(re.escape(v) for v in names)


def _pattern(form: str) -> re.Pattern[str]:
    slots = {"p": _either(PEOPLE), "q": _either(PEOPLE), "l": _either(PLACES),
             "o": _either(OBJECTS), "v": _either(CITIES) + "|" + _either(JOBS)}
    out = []
    for i, part in enumerate(re.split(r"\{(\w)\}", form)):
        if i % 2 == 0:
            out.append(re.escape(part))
        elif part == "a":
            out.append(rf"(?:an?) (?P<v>{_either(JOBS)})")
        else:
            out.append(f"(?P<{part}>{slots[part]})")
    return re.compile(r"\b" + "".join(out))


@functools.cache
def _event_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((kind, _pattern(form)) for kind, splits in EVENT_FORMS.items()
                 for forms in splits.values() for form in forms)


@functools.cache
def _question_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((kind, re.compile(_pattern(form).pattern + r"$"))
                 for kind, splits in QUESTION_FORMS.items()
                 for forms in splits.values() for form in forms)


def parse_question(question: str) -> tuple[str, dict[str, str]] | None:
    """The kind (`QUESTION_FORMS`' keys) and slots of a state-tracking question; None when
    it has none of their forms."""
    for kind, pattern in _question_patterns():
        if m := pattern.match(question.strip()):
            return kind, {k: v for k, v in m.groupdict().items() if v is not None}
    return None


def parse_events(text: str) -> list[Event]:
    """The event sentences of `text`, in order of appearance."""
    found = []
    for kind, pattern in _event_patterns():
        for m in pattern.finditer(text):
            g = m.groupdict()
            target = g.get("l") or g.get("o") or g.get("v") or ""
            found.append((m.start(), Event(kind, g["p"], target, m.group(0), g.get("q"))))
    found.sort(key=lambda x: x[0])
    return [e for _, e in found]


def state_facts(question: str, text: str) -> list[str] | None:
    """The sentences of `text` that set the state `question` asks about, as it stands at the
    end of `text`, in order ([] while nothing sets it); None for a question that asks no
    tracked state (`TRACKED`)."""
    parsed = parse_question(question)
    if parsed is None or parsed[0] not in TRACKED:
        return None
    kind, slots = parsed
    events = parse_events(text)
    world = World()
    for i, e in enumerate(events):
        if e.kind != "take" or e.person in world.place:  # a take where the taker is unknown
            world.apply(i, e)                             # is no event of a story
    return [events[i].sentence for i in _support(kind, slots, world)]


def _support(kind: str, slots: dict[str, str], world: World) -> list[int]:
    p, o = slots.get("p", ""), slots.get("o", "")
    if kind == "where-now":
        return [world.moved_by[p]] if p in world.moved_by else []
    if kind == "who-has":
        return [world.held_by[o]] if world.holder.get(o) is not None else []
    if kind == "count-visits":
        return world.visits.get((p, slots["l"]), [])
    if kind == "count-held":
        return sorted(world.held_by[x] for x, who in world.holder.items() if who == p)
    value = world.value.get((p, kind))
    return [value[1]] if value else []
