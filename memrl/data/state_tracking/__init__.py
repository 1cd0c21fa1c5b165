"""Long-context benchmarks whose answer changes over the document (state tracking,
counting, knowledge updates), in the spirit of bAbI / BABILong, generated offline.

`language`: names, places, objects, values, sentence and question forms of each split;
`stories`: the events of a story and its question, by simulating a small world;
`build`: stories placed among filler text at any length, written as RULER-HQA items.
"""

from __future__ import annotations

from memrl.data.state_tracking.build import (
    DEFAULT_BLOCK_CHARS,
    DEFAULT_EVAL_DOCS,
    Filler,
    StateFiles,
    VALIDATION_START,
    WRITE_SPLITS,
    biography_filler,
    pack_blocks,
    place_story,
    read_haystack,
    state_item,
    state_items,
    write_state_tracking,
)
from memrl.data.state_tracking.language import (
    CITIES,
    EVENT_FORMS,
    JOBS,
    NUMBER_WORDS,
    OBJECTS,
    PEOPLE,
    PLACES,
    QUESTION_FORMS,
    SPLITS,
    all_names,
    count_answers,
)
from memrl.data.state_tracking.solver import TRACKED, parse_events, parse_question, state_facts
from memrl.data.state_tracking.stories import TASKS, Event, Story, make_story

__all__ = [
    "CITIES",
    "DEFAULT_BLOCK_CHARS",
    "DEFAULT_EVAL_DOCS",
    "EVENT_FORMS",
    "Event",
    "Filler",
    "JOBS",
    "NUMBER_WORDS",
    "OBJECTS",
    "PEOPLE",
    "PLACES",
    "QUESTION_FORMS",
    "SPLITS",
    "StateFiles",
    "Story",
    "TASKS",
    "TRACKED",
    "VALIDATION_START",
    "WRITE_SPLITS",
    "all_names",
    "biography_filler",
    "count_answers",
    "make_story",
    "parse_events",
    "parse_question",
    "pack_blocks",
    "place_story",
    "read_haystack",
    "state_facts",
    "state_item",
    "state_items",
    "write_state_tracking",
]
