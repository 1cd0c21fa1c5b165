"""Stories placed among filler text, at any length, written as RULER-HQA items.

The filler is cut into blocks of about `block_chars` characters (whole sentences); a
context of N blocks (`num_docs` = N, so `memrl eval`'s `num_docs: [N]` reads it) is
the first N blocks of the question's filler stream with the story's events placed between
them at the story's depths. Nested across lengths: the question, its answers and its events
are the same at every N, the filler at N is a prefix of the filler at any larger N, and an
event at depth d lies just before block floor(d * (N + 1)) (after the last block when that
is N). Each question's stream starts at its own offset in the filler.

Filler: a text file of the user's (`haystack`: any text, e.g. a book; whitespace is
collapsed, so its layout is lost), or memrl's biographies (`biography_paragraphs`,
generated: no licence beyond memrl's own). A block that names a person of the stories
(either split) is never used, so no filler sentence can be read as an event.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.data.biographies import biography_paragraphs
from memrl.data.io import write_json_atomic
from memrl.data.ruler_hqa import ruler_hqa_path
from memrl.data.state_tracking.language import all_names
from memrl.data.state_tracking.stories import Story, check_task, make_story
from memrl.errors import MemrlInputError

DEFAULT_BLOCK_CHARS = 400
"""Least characters per filler block (whole sentences or paragraphs are packed until a block
has this many: a biographies block holds about 480 characters, 146 SmolLM2 tokens)."""

DEFAULT_EVAL_DOCS = (10, 20, 40, 80, 160, 320, 640)
"""Blocks per evaluation context: 1x to 64x, about 1.5K to 93K SmolLM2 tokens of the default
filler (1M tokens: N = 6,900)."""

VALIDATION_START = 100_000
"""Validation questions are questions VALIDATION_START, ... of the held-out stream, so they
never repeat an evaluation question."""

WRITE_SPLITS = ("all", "train", "eval")
"""train: train.json + val.json; eval: eval_{N}.json; all: both."""

_SENTENCES = re.compile(r"(?<=[.!?])\s+")
_NAMES = re.compile(r"\b(?:" + "|".join(all_names()) + r")\b")
_MIN_POOL = 2048
"""The default filler has at least this many blocks, so short contexts still differ."""


@dataclass(frozen=True)
class Filler:
    """The blocks every question's filler stream is cut from."""

    blocks: tuple[str, ...]
    source: str
    """Where they come from (a file, or memrl's biographies)."""


def pack_blocks(units: Sequence[str], block_chars: int) -> list[str]:
    """`units` (sentences, paragraphs) packed in order into blocks of at least
    `block_chars` characters, whitespace collapsed (a trailing remainder shorter than that
    is dropped). Blocks that name a person of the stories are left out."""
    blocks, current = [], ""
    for unit in units:
        if text := " ".join(unit.split()):
            current = f"{current} {text}" if current else text
            if len(current) >= block_chars:
                blocks.append(current)
                current = ""
    return [b for b in blocks if not _NAMES.search(b)]


def read_haystack(path: str | Path, block_chars: int = DEFAULT_BLOCK_CHARS) -> Filler:
    """The blocks of a user's text file (UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise MemrlInputError("haystack file not found", location=f"haystack {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MemrlInputError(f"not UTF-8 text (byte {exc.start})",
                              location=f"haystack {path}") from None
    blocks = pack_blocks(_SENTENCES.split(text), block_chars)
    if not blocks:
        raise MemrlInputError(f"holds no block of {block_chars} characters of text",
                              location=f"haystack {path}")
    return Filler(tuple(blocks), str(path))


def biography_filler(num_blocks: int, seed: int, split: str,
                     block_chars: int = DEFAULT_BLOCK_CHARS) -> Filler:
    """At least `num_blocks` blocks of memrl's biographies (of `split`'s people and forms);
    the same blocks, in the same order, for any `num_blocks` up to `_MIN_POOL`."""
    return _biography_filler(max(num_blocks, _MIN_POOL), seed, split, block_chars)


@functools.lru_cache(maxsize=4)
def _biography_filler(count: int, seed: int, split: str, block_chars: int) -> Filler:
    per_block = block_chars // 100 + 2
    while True:  # paragraphs are ~150 characters: the first round almost always suffices
        blocks = pack_blocks(biography_paragraphs(count * per_block, seed, split=split),
                             block_chars)
        if len(blocks) >= count:
            return Filler(tuple(blocks[:count]), "memrl biographies (generated)")
        per_block += 1


def _offset(story: Story, seed: int, size: int) -> int:
    import random

    return random.Random(f"state-tracking-filler:{story.task}:{seed}:{story.index}"
                         ).randrange(size)


def place_story(story: Story, filler: Filler, num_docs: int, seed: int
                ) -> tuple[str, list[int]]:
    """The context of `story` at N = `num_docs` blocks (paragraphs joined by blank lines,
    each a block with the events placed before it; a biography block starts with a sentence
    that names its person in full) and the character offset of each of its events in it."""
    size = len(filler.blocks)
    start = _offset(story, seed, size)
    paragraphs: list[list[tuple[str, int | None]]] = [[] for _ in range(num_docs)]
    gaps = [min(num_docs, int(d * (num_docs + 1))) for d in story.depths]
    for i, gap in enumerate(gaps):
        if gap < num_docs:
            paragraphs[gap].append((story.events[i].sentence, i))
    for b in range(num_docs):
        paragraphs[b].append((filler.blocks[(start + b) % size], None))
    paragraphs[-1] += [(story.events[i].sentence, i) for i, g in enumerate(gaps)
                       if g == num_docs]
    positions, offset = [], 0
    for paragraph in paragraphs:
        for text, event in paragraph:
            if event is not None:
                positions.append(offset)
            offset += len(text) + 1
        offset += 1  # paragraphs are joined by two characters, pieces by one
    context = "\n\n".join(" ".join(text for text, _ in p) for p in paragraphs)
    return context, positions


def state_item(story: Story, filler: Filler, num_docs: int, seed: int,
               index: int) -> dict[str, Any]:
    """A RULER-HQA item (`{"index", "input", "answers", "context", "num_docs", "facts"}`) with
    extra keys the loader ignores: `task`, `fact_positions` (character offsets of the
    facts), `events` and `event_positions` (every event of the story, in order) and
    `superseded` (earlier values of the asked quantity: the distractors)."""
    context, positions = place_story(story, filler, num_docs, seed)
    return {
        "index": index,
        "input": story.question,
        "answers": list(story.answers),
        "context": context,
        "num_docs": num_docs,
        "facts": [story.events[i].sentence for i in story.support],
        "task": story.task,
        "fact_positions": [positions[i] for i in story.support],
        "events": [e.sentence for e in story.events],
        "event_positions": positions,
        "superseded": list(story.superseded),
    }


def _check_count(label: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise MemrlInputError(f"{label} must be an integer of at least {least}, got {value!r}")


def state_items(task: str, num_questions: int, num_docs: int, *, seed: int = 0,
                split: str = "eval", filler: Filler | None = None, start: int = 0,
                block_chars: int = DEFAULT_BLOCK_CHARS) -> list[dict[str, Any]]:
    """Questions start .. start+num_questions-1 of (task, seed, split) at N = `num_docs`
    blocks of `filler` (default: memrl's biographies of `split`), as `state_item`s with
    `index` = the question's number."""
    check_task(task)
    _check_count("num_questions", num_questions, 1)
    _check_count("num_docs", num_docs, 1)
    _check_count("start", start, 0)
    filler = filler or biography_filler(num_docs, seed, split, block_chars)
    if num_docs > len(filler.blocks):
        raise MemrlInputError(
            f"num_docs={num_docs} needs {num_docs} filler blocks but {filler.source} has "
            f"{len(filler.blocks)} (of {block_chars} characters, none naming a person of "
            "the stories); give a longer haystack or a smaller N")
    return [state_item(make_story(task, i, seed, split), filler, num_docs, seed, i)
            for i in range(start, start + num_questions)]


@dataclass(frozen=True)
class StateFiles:
    """What `write_state_tracking` writes (every count checked before any file is)."""

    split: str = "all"
    """all, train or eval (`WRITE_SPLITS`)."""
    seed: int = 0
    train_questions: int = 2000
    """Training questions (training names, places, objects and forms), in train.json."""
    train_docs: int = 10
    """Filler blocks per training and validation question."""
    val_questions: int = 64
    """Held-out questions (questions VALIDATION_START.. of the held-out stream) in
    val.json; 0: no val.json."""
    eval_questions: int = 128
    """Held-out questions, the same at every N, in eval_{N}.json."""
    eval_docs: tuple[int, ...] = DEFAULT_EVAL_DOCS
    """The N of the evaluation files."""
    haystack: str | None = None
    """A text file whose blocks are the filler; None: memrl's biographies."""
    block_chars: int = DEFAULT_BLOCK_CHARS


def _check_files(spec: StateFiles) -> None:
    if spec.split not in WRITE_SPLITS:
        raise MemrlInputError(f"split must be one of {', '.join(WRITE_SPLITS)}, "
                              f"got {spec.split!r}")
    _check_count("block_chars", spec.block_chars, 1)
    _check_count("val_questions", spec.val_questions, 0)
    if spec.split != "eval":
        _check_count("train_questions", spec.train_questions, 1)
        _check_count("train_docs", spec.train_docs, 1)
    if spec.split != "train":
        if not spec.eval_docs:
            raise MemrlInputError("give at least one num_docs")
        for n in spec.eval_docs:
            _check_count("num_docs", n, 1)
        _check_count("eval_questions", spec.eval_questions, 1)
        if spec.eval_questions > VALIDATION_START:
            raise MemrlInputError(f"at most {VALIDATION_START} evaluation questions, got "
                                  f"{spec.eval_questions}")


def write_state_tracking(task: str, out_dir: str | Path, spec: StateFiles = StateFiles()
                         ) -> list[Path]:
    """The files of one benchmark in `out_dir`: train.json and val.json (RULER-HQA items at
    N = `train_docs`; train with `data.format: ruler`) and eval_{N}.json for each N of
    `eval_docs`. Returns the paths written."""
    check_task(task)
    _check_files(spec)
    out = Path(out_dir)
    user = read_haystack(spec.haystack, spec.block_chars) if spec.haystack else None
    jobs: list[tuple[str, str, int, int, int]] = []  # file, split, N, questions, start
    if spec.split != "eval":
        jobs.append(("train.json", "train", spec.train_docs, spec.train_questions, 0))
        if spec.val_questions:
            jobs.append(("val.json", "eval", spec.train_docs, spec.val_questions,
                         VALIDATION_START))
    if spec.split != "train":
        jobs += [(ruler_hqa_path(out, n).name, "eval", n, spec.eval_questions, 0)
                 for n in dict.fromkeys(spec.eval_docs)]
    fillers = {s: user or biography_filler(max(j[2] for j in jobs if j[1] == s), spec.seed, s,
                                           spec.block_chars)
               for s in {j[1] for j in jobs}}
    for _, s, n, _, _ in jobs:  # check every N before writing anything
        state_items(task, 1, n, seed=spec.seed, split=s, filler=fillers[s],
                    block_chars=spec.block_chars)
    return [write_json_atomic(out / name, state_items(
                task, count, n, seed=spec.seed, split=s, filler=fillers[s], start=start,
                block_chars=spec.block_chars))
            for name, s, n, count, start in jobs]
