"""Stories whose answer changes as they go on: events drawn by simulating a small world
(people move between places, pick up, pass and drop objects; attributes are stated and then
changed), and one question about its final state.

A story is independent of any filler text and of the length it is read at: story i of
(task, seed, split) depends on those four only. `memrl.data.state_tracking.build` places
its events among filler text.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memrl.data.biographies import article
from memrl.data.state_tracking.language import (
    CITIES,
    EVENT_FORMS,
    JOBS,
    OBJECTS,
    PEOPLE,
    PLACES,
    QUESTION_FORMS,
    check_split,
    count_answers,
)
from memrl.errors import MemrlInputError

TASKS = ("where-now", "where-before", "who-has", "counting", "knowledge-update")
"""The benchmarks: where a person is now (bAbI qa1), where an object was before a place
(qa3), who holds an object now (qa5-style passing), how many times / how many now
(counting; even questions count visits, odd ones the objects a person holds), and the
latest value of an attribute that was stated and then changed (knowledge update)."""

MAX_ATTEMPTS = 200
"""Stories drawn for one question before giving up (each attempt continues the same random
stream, so the result is still determined by the question's seed)."""


@dataclass(frozen=True)
class Event:
    """One sentence of a story and what it does."""

    kind: str
    """move, take, drop, give, city or job (`EVENT_FORMS`)."""
    person: str
    target: str
    """The place (move), object (take, drop, give) or value (city, job)."""
    sentence: str
    other: str | None = None
    """The receiver of a give."""


@dataclass(frozen=True)
class Story:
    """A question over a sequence of events."""

    task: str
    index: int
    question: str
    answers: tuple[str, ...]
    events: tuple[Event, ...]
    support: tuple[int, ...]
    """Indices of the events that determine the answer (the gold facts), increasing."""
    superseded: tuple[str, ...]
    """Values the asked quantity held earlier in the story and no longer holds (the
    distractors a memory that never lets go would answer), in order of first appearance."""
    depths: tuple[float, ...]
    """Where each event lies in the document, as a fraction in [0, 1), non-decreasing: the
    same at every length."""


@dataclass
class World:
    """The state after some events, and the events that set each part of it (by index).

    A story draws its events against one (`make_story`); the reference solver
    (`memrl.data.state_tracking.solver`) replays the events it reads from a text in one.
    """

    place: dict[str, str] = field(default_factory=dict)
    """Each person's place; `moved_by`: the move that put them there."""
    moved_by: dict[str, int] = field(default_factory=dict)
    holder: dict[str, str | None] = field(default_factory=dict)
    """Each object's holder (None once dropped); `held_by`: the take or give that set it."""
    held_by: dict[str, int] = field(default_factory=dict)
    object_place: dict[str, str] = field(default_factory=dict)
    trail: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    """Each object's places in order, each with the events that brought it there."""
    visits: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """The moves of each (person, place)."""
    value: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    """Each (person, city or job)'s latest value and the event that stated it."""

    def apply(self, i: int, e: Event) -> None:
        """Event `e`, the story's event `i`, applied (a take needs its taker placed by an
        earlier move)."""
        if e.kind == "move":
            self.place[e.person], self.moved_by[e.person] = e.target, i
            self.visits.setdefault((e.person, e.target), []).append(i)
            for obj, who in self.holder.items():
                if who == e.person:
                    self._locate(obj, e.target, (i,))
        elif e.kind in ("take", "give"):
            who = e.person if e.kind == "take" else e.other
            assert who is not None
            self.holder[e.target], self.held_by[e.target] = who, i
            if e.kind == "take":
                self._locate(e.target, self.place[who], (self.moved_by[who], i))
        elif e.kind == "drop":
            self.holder[e.target] = None
        else:
            self.value[(e.person, e.kind)] = (e.target, i)

    def _locate(self, obj: str, place: str, why: tuple[int, ...]) -> None:
        trail = self.trail.setdefault(obj, [])
        if not trail or trail[-1][0] != place:
            trail.append((place, why))
        self.object_place[obj] = place


def _sentence(rng: random.Random, kind: str, split: str, forms: Sequence[str] | None = None,
              **slots: str) -> str:
    form = rng.choice(forms if forms is not None else EVENT_FORMS[kind][split])
    return form.format(**slots, a=article(slots["v"]) if "v" in slots else "")


def _actions(rng: random.Random, world: World, people: Sequence[str], places: Sequence[str],
             objects: Sequence[str], split: str, weights: dict[str, int]) -> Event:
    """One valid random event: a move, take, drop or give, by `weights`."""
    while True:
        kind = rng.choices(list(weights), list(weights.values()))[0]
        p = rng.choice(people)
        if kind == "move" or p not in world.place:
            l = rng.choice([x for x in places if x != world.place.get(p)])
            return Event("move", p, l, _sentence(rng, "move", split, p=p, l=l))
        held = [o for o in objects if world.holder.get(o) == p]
        if kind == "take":
            free = [o for o in objects if world.holder.get(o) is None
                    and world.object_place.get(o, world.place[p]) == world.place[p]]
            if free:
                o = rng.choice(free)
                return Event("take", p, o, _sentence(rng, "take", split, p=p, o=o))
        elif kind == "drop" and held:
            o = rng.choice(held)
            return Event("drop", p, o, _sentence(rng, "drop", split, p=p, o=o))
        elif kind == "give" and held:
            near = [q for q in people if q != p and world.place.get(q) == world.place[p]]
            if near:
                o, q = rng.choice(held), rng.choice(near)
                return Event("give", p, o, _sentence(rng, "give", split, p=p, o=o, q=q), q)


def _simulate(events: Sequence[Event], query: Callable[[World], str | None]
              ) -> tuple[World, list[str]]:
    """The final world and the distinct values `query` took before its final one."""
    world, history = World(), []
    for i, e in enumerate(events):
        world.apply(i, e)
        value = query(world)
        if value is not None and value not in history:
            history.append(value)
    final = query(world)
    return world, [v for v in history if v != final]


Draft = tuple[str, list[str], list[Event], list[int], list[str]]
"""question, answers, events, support, superseded."""
Drafter = Callable[[random.Random, str, int], Draft | None]


def _cast(rng: random.Random, split: str, people: int, places: int, objects: int
          ) -> tuple[list[str], list[str], list[str]]:
    return (rng.sample(PEOPLE[split], people), rng.sample(PLACES[split], places),
            rng.sample(OBJECTS[split], objects))


def _question(rng: random.Random, kind: str, split: str, **slots: str) -> str:
    return rng.choice(QUESTION_FORMS[kind][split]).format(**slots)


def _events(rng: random.Random, count: int, people: Sequence[str], places: Sequence[str],
            objects: Sequence[str], split: str, weights: dict[str, int]) -> list[Event]:
    world, events = World(), []
    for i in range(count):
        events.append(_actions(rng, world, people, places, objects, split, weights))
        world.apply(i, events[-1])
    return events


def _where_now(rng: random.Random, split: str, index: int) -> Draft | None:
    people, places, _ = _cast(rng, split, rng.randint(2, 4), rng.randint(3, 6), 0)
    events = _events(rng, rng.randint(6, 14), people, places, [], split, {"move": 1})
    p = rng.choice(people)
    world, superseded = _simulate(events, lambda w: w.place.get(p))
    if p not in world.place or not superseded:
        return None
    return (_question(rng, "where-now", split, p=p), [world.place[p]], events,
            [world.moved_by[p]], superseded)


_OBJECT_WEIGHTS = {"move": 4, "take": 2, "drop": 1, "give": 2}


def _where_before(rng: random.Random, split: str, index: int) -> Draft | None:
    people, places, objects = _cast(rng, split, rng.randint(2, 3), rng.randint(3, 5),
                                    rng.randint(1, 2))
    events = _events(rng, rng.randint(10, 18), people, places, objects, split,
                     _OBJECT_WEIGHTS)
    o = rng.choice(objects)
    world, _ = _simulate(events, lambda w: None)
    trail = world.trail.get(o, [])
    names = [t[0] for t in trail]
    once = [k for k in range(1, len(trail)) if names.count(names[k]) == 1]
    if not once:
        return None
    k = rng.choice(once)
    support = sorted({*trail[k - 1][1], *trail[k][1]})
    superseded = [n for n in dict.fromkeys(names) if n != names[k - 1]]
    return (_question(rng, "where-before", split, o=o, l=names[k]), [names[k - 1]], events,
            support, superseded)


def _who_has(rng: random.Random, split: str, index: int) -> Draft | None:
    people, places, objects = _cast(rng, split, 3, rng.randint(2, 4), rng.randint(1, 3))
    events = _events(rng, rng.randint(10, 18), people, places, objects, split,
                     _OBJECT_WEIGHTS)
    o = rng.choice(objects)
    world, superseded = _simulate(events, lambda w: w.holder.get(o))
    holder = world.holder.get(o)
    if holder is None or not superseded:
        return None
    return (_question(rng, "who-has", split, o=o), [holder], events, [world.held_by[o]],
            superseded)


def _counting(rng: random.Random, split: str, index: int) -> Draft | None:
    if index % 2 == 0:  # how many times: visits accumulate over the whole story
        people, places, _ = _cast(rng, split, rng.randint(2, 3), 3, 0)
        events = _events(rng, rng.randint(8, 16), people, places, [], split, {"move": 1})
        p, l = rng.choice(people), rng.choice(places)
        world, _ = _simulate(events, lambda w: None)
        visits = world.visits.get((p, l), [])
        if len(visits) < 2:
            return None
        superseded = [str(c) for c in range(1, len(visits))]
        return (_question(rng, "count-visits", split, p=p, l=l), count_answers(len(visits)),
                events, visits, superseded)
    people, places, objects = _cast(rng, split, rng.randint(2, 3), rng.randint(2, 3), 4)
    events = _events(rng, rng.randint(10, 18), people, places, objects, split,
                     {"move": 2, "take": 4, "drop": 1, "give": 1})
    p = rng.choice(people)
    world, superseded = _simulate(
        events, lambda w: str(sum(1 for h in w.holder.values() if h == p)))
    held = [o for o in objects if world.holder.get(o) == p]
    if not superseded:
        return None
    return (_question(rng, "count-held", split, p=p), count_answers(len(held)), events,
            sorted(world.held_by[o] for o in held), superseded)


def _knowledge_update(rng: random.Random, split: str, index: int) -> Draft | None:
    people = rng.sample(PEOPLE[split], rng.randint(2, 3))
    kind = ("city", "job")[index % 2]
    p = rng.choice(people)
    chains = []  # one chain per (person, attribute): a statement, then its changes
    for person in people:
        for attr, values in (("city", CITIES[split]), ("job", JOBS[split])):
            asked = (person, attr) == (p, kind)
            length = rng.randint(2, 4) if asked else rng.randint(1, 3)
            chosen = rng.sample(values, length)
            forms = EVENT_FORMS[attr][split]
            chains.append([Event(attr, person, v, _sentence(
                rng, attr, split, forms[:2] if k == 0 else forms[2:], p=person, v=v))
                for k, v in enumerate(chosen)])
    events: list[Event] = []
    while any(chains):  # interleave the chains at random, each in its own order
        chain = rng.choice([c for c in chains if c])
        events.append(chain.pop(0))
    world, superseded = _simulate(events, lambda w: (w.value.get((p, kind)) or (None,))[0])
    value, last = world.value[(p, kind)]
    return (_question(rng, kind, split, p=p), [value], events, [last], superseded)


DRAFTERS: dict[str, Drafter] = {
    "where-now": _where_now, "where-before": _where_before, "who-has": _who_has,
    "counting": _counting, "knowledge-update": _knowledge_update,
}


def check_task(task: str) -> None:
    if task not in TASKS:
        raise MemrlInputError(f"unknown benchmark {task!r}; choose one of {', '.join(TASKS)}")


def make_story(task: str, index: int, seed: int = 0, split: str = "train") -> Story:
    """Story `index` of (task, seed, split): the same whatever else is built with it."""
    check_task(task)
    check_split(split)
    rng = random.Random(f"state-tracking:{task}:{seed}:{split}:{index}")
    for _ in range(MAX_ATTEMPTS):
        draft = DRAFTERS[task](rng, split, index)
        if draft is not None:
            question, answers, events, support, superseded = draft
            depths = tuple(sorted(rng.random() for _ in events))
            return Story(task=task, index=index, question=question, answers=tuple(answers),
                         events=tuple(events), support=tuple(support),
                         superseded=tuple(superseded), depths=depths)
    raise AssertionError(f"no {task} story after {MAX_ATTEMPTS} attempts (seed {seed}, "
                         f"question {index})")  # pragma: no cover - a bug, not an input
