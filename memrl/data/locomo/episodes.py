"""LoCoMo (`locomo10.json`) read into episodes for the tool-based memory agent (MemoryUpdate).

One episode per QA pair. The agent reads the *evidence sessions* (every turn of each session
that holds an evidence dialog id) and edits a memory store that starts from the generated
observation facts of all *other* sessions of the conversation (those of the evidence sessions
are kept apart, in `dialogue_facts`, for scoring and the oracle); the reward asks how much the
final memory improves retrieval-augmented QA over that initial memory. The question is never
part of the agent's input.

File layout (one list item per conversation):
  sample_id                                   "conv-26"
  conversation.session_N                      [{speaker, dia_id "DN:k", text, img_url?,
                                                blip_caption?}, ...]
  conversation.session_N_date_time            "1:56 pm on 8 May, 2023"
  observation.session_N_observation[speaker]  [[fact, "DN:k" | ["DN:k", ...]], ...]
  qa                                          [{question, answer | adversarial_answer,
                                                evidence ["DN:k", ...], category 1..5}, ...]

Rules, decided after reading the real file:
  * Episode ids are `conv-{slug}-qa{index}-{hash}`: `slug` is the sample id with a leading
    `conv-` removed (`conv-26` -> `26`) and every character outside `[A-Za-z0-9._:-]`
    replaced by `_`; `index` is the 0-based position in the conversation's `qa` list;
    `hash` is the first 8 hex digits of sha256(question as UTF-8). The id doubles as the base
    namespace of the episode's memory store, hence the restricted alphabet.
  * Evidence strings are read leniently: every `D<s>:<t>` inside one string counts (the file
    has `"D8:6; D9:17"`, `"D:11:26"`, `"D30:05"`); an id resolves when that turn exists.
    Unresolvable ids are dropped; a QA with no resolvable id is skipped with a `SkipNote`.
  * Answers: integers become strings (`2022` -> `"2022"`). Category 5 (adversarial) keeps its
    `answer` when the file has one (2 items do), else takes `adversarial_answer`. A NaN or
    infinite answer (JSON `NaN`/`Infinity`, or such a float in parsed data) is an error
    naming the file, conversation and question, e.g. `locomo10.json: [0].qa[3].answer`.
  * Broken structure (missing key, wrong type) raises MemrlInputError naming the file and the
    JSON path, e.g. `locomo10.json: [3].qa[17].evidence`.

The embeddings of the initial memory: `memrl.data.locomo.embeddings`.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memrl.data.io import (
    check_unique_ids,
    expect_list,
    expect_object,
    get_field,
    get_id,
    get_string,
    iter_jsonl,
    read_json,
    type_name,
    validation_message,
    write_jsonl_atomic,
)
from memrl.errors import MemrlInputError

EPISODES_FILE = "episodes.jsonl"
SKIPPED_FILE = "skipped.jsonl"

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                  5: "adversarial"}
"""LoCoMo's `category` codes as the data uses them (the paper lists them in another order)."""

ADVERSARIAL_CATEGORY = 5
ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")
_SESSION_KEY = re.compile(r"session_(\d+)")
_OBSERVATION_KEY = re.compile(r"session_(\d+)_observation")
_DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---------------------------------------------------------------------------------------------
# records


class DialogueTurn(BaseModel):
    """One utterance of a session; image turns carry their caption as `[image: ...]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: int = Field(ge=1)
    dia_id: str
    speaker: str
    text: str
    date: str
    """The session's `session_N_date_time` (all turns of a session share it)."""


class MemoryFact(BaseModel):
    """One observation fact of the initial memory; `source` is its dialog id(s) or ""."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(min_length=1)
    source: str = ""
    """The observation's dia_id; several ids are joined by `,` (`D15:3,D15:5`)."""


class MemoryEpisode(BaseModel):
    """One QA pair as a memory-update episode: read `dialogue`, improve `initial_memory`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=ID_PATTERN)
    sample_id: str
    qa_index: int = Field(ge=0)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1)
    category: int = Field(ge=1, le=5)
    adversarial: bool
    evidence: list[str] = Field(min_length=1)
    """Resolved evidence dialog ids, as spelled by the turns they point to (file order)."""
    evidence_sessions: list[int] = Field(min_length=1)
    dialogue: list[DialogueTurn]
    initial_memory: list[MemoryFact]
    dialogue_facts: list[MemoryFact] = []
    """LoCoMo's observation facts of the dialogue's sessions (those left out of the initial
    memory), each with its source dialog id(s). Never shown to the agent: they tell the
    evidence recall which memories were written from an evidence turn, and the oracle what
    to insert (`memrl.agents.memupdate_oracle`). Empty in files prepared before they existed."""


class SkipNote(BaseModel):
    """A QA pair that produced no episode, and why (written to `skipped.jsonl`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    location: str
    """File and JSON path of the QA item, e.g. `locomo10.json: [0].qa[30]`."""
    sample_id: str
    qa_index: int
    question: str
    reason: str


# ---------------------------------------------------------------------------------------------
# ids and evidence


def sample_slug(sample_id: str) -> str:
    """The id-safe part of a sample id: `conv-26` -> `26`, `my conv` -> `my_conv`."""
    text = sample_id.strip()
    if text.startswith("conv-") and len(text) > len("conv-"):
        text = text[len("conv-"):]
    return _UNSAFE.sub("_", text) or "_"


def episode_id(sample_id: str, qa_index: int, question: str) -> str:
    """`conv-{slug}-qa{index}-{sha256(question)[:8]}`: stable across runs and machines."""
    digest = hashlib.sha256(question.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"conv-{sample_slug(sample_id)}-qa{qa_index}-{digest}"


def parse_dia_ids(text: str) -> list[tuple[int, int]]:
    """Every `D<session>:<turn>` inside one evidence string, as (session, turn) numbers.

    Lenient on purpose: the file writes several ids in one string (`"D8:6; D9:17"`), a stray
    colon (`"D:11:26"`) and leading zeros (`"D30:05"`). A string without one gives [].
    """
    return [(int(s), int(t)) for s, t in _DIA_ID.findall(text)]


def _normal_dia_id(session: int, turn: int) -> str:
    return f"D{session}:{turn}"


# ---------------------------------------------------------------------------------------------
# reading one conversation


class _Where:
    """Builds `FILE: [i].a.b[j]` locations for one conversation."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, path: str) -> str:
        return f"{self.source}: {path}"


def _key_path(base: str, key: str) -> str:
    return f"{base}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{base}[{json.dumps(key)}]"


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], base: str,
           where: _Where) -> Any:
    """A required field, with the error located at the field's own JSON path."""
    return get_field(obj, key, kind, where(_key_path(base, key)))


def _read_turns(value: Any, session: int, date: str, base: str,
                where: _Where) -> list[DialogueTurn]:
    if not isinstance(value, list):
        raise MemrlInputError(f"a session must be a list of turns, got {type_name(value)}",
                              location=where(base))
    turns = []
    for j, item in enumerate(value):
        path = f"{base}[{j}]"
        turn = expect_object(item, where(path), "turn")
        speaker = get_string(turn, "speaker", where(f"{path}.speaker"))
        dia_id = get_string(turn, "dia_id", where(f"{path}.dia_id"))
        text = get_string(turn, "text", where(f"{path}.text"), non_empty=False)
        caption = get_field(turn, "blip_caption", str, where(f"{path}.blip_caption"),
                            required=False)
        if caption and caption.strip():
            text = " ".join(p for p in (text.strip(), f"[image: {caption.strip()}]") if p)
        turns.append(DialogueTurn(session=session, dia_id=dia_id, speaker=speaker, text=text,
                                  date=date))
    return turns


def _read_sessions(conv: Mapping[str, Any], base: str,
                   where: _Where) -> dict[int, list[DialogueTurn]]:
    """`session_N` lists in session order; each needs its `session_N_date_time`."""
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.fullmatch(k)))
    if not numbers:
        raise MemrlInputError("conversation has no 'session_N' lists", location=where(base))
    sessions = {}
    for n in numbers:
        date = get_string(conv, f"session_{n}_date_time",
                          where(f"{base}.session_{n}_date_time"), non_empty=False)
        sessions[n] = _read_turns(conv[f"session_{n}"], n, date, f"{base}.session_{n}", where)
    return sessions


def _fact(item: Any, path: str, where: _Where) -> MemoryFact | None:
    """`[fact, "DN:k"]`, `[fact, ["DN:k", ...]]`, `[fact]` or a bare string; blank -> None."""
    if isinstance(item, str):
        text, source = item, ""
    elif isinstance(item, list) and 1 <= len(item) <= 2:
        text = item[0]
        raw = item[1] if len(item) == 2 else None
        if not isinstance(text, str):
            raise MemrlInputError(f"fact text must be a string, got {type_name(text)}",
                                  location=where(f"{path}[0]"))
        if raw is None:
            source = ""
        elif isinstance(raw, str):
            source = raw.strip()
        elif isinstance(raw, list) and all(isinstance(r, str) for r in raw):
            source = ",".join(r.strip() for r in raw)
        else:
            raise MemrlInputError(
                f"fact source must be a dialog id or a list of them, got {type_name(raw)}",
                location=where(f"{path}[1]"),
            )
    else:
        raise MemrlInputError(
            f"fact must be [text, dialog id], got {type_name(item)}"
            + (f" of length {len(item)}" if isinstance(item, list) else ""),
            location=where(path),
        )
    text = text.strip()
    return MemoryFact(text=text, source=source) if text else None


def _read_observations(obs: Mapping[str, Any], base: str,
                       where: _Where) -> dict[int, list[MemoryFact]]:
    """Observation facts by session number (speakers in file order); other keys are ignored."""
    out: dict[int, list[MemoryFact]] = {}
    for key in obs:
        m = _OBSERVATION_KEY.fullmatch(key)
        if m is None:
            continue
        path = _key_path(base, key)
        by_speaker = expect_object(obs[key], where(path), "session observation")
        facts: list[MemoryFact] = []
        for speaker, items in by_speaker.items():
            spath = _key_path(path, speaker)
            if not isinstance(items, list):
                raise MemrlInputError(f"facts must be a list, got {type_name(items)}",
                                      location=where(spath))
            for k, item in enumerate(items):
                fact = _fact(item, f"{spath}[{k}]", where)
                if fact is not None:
                    facts.append(fact)
        out.setdefault(int(m.group(1)), []).extend(facts)
    return dict(sorted(out.items()))


def _answer_text(value: Any, path: str, where: _Where) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise MemrlInputError(f"answer must be a string or a number, got {type_name(value)}",
                              location=where(path))
    if isinstance(value, float) and not math.isfinite(value):
        # JSON `NaN`/`Infinity` (which json.loads accepts) would otherwise become the
        # answers "nan"/"inf": a broken file, not a gold answer.
        raise MemrlInputError(f"answer must be a string or a finite number, got {value}",
                              location=where(path))
    return value if isinstance(value, str) else str(value)


def _answer(qa: Mapping[str, Any], category: int, base: str, where: _Where) -> str:
    """`answer`, or for category 5 without one, `adversarial_answer`; ints become strings."""
    key = "answer"
    if category == ADVERSARIAL_CATEGORY and qa.get("answer") is None:
        key = "adversarial_answer"
    if qa.get(key) is None:
        raise MemrlInputError(f"missing field '{key}'", location=where(_key_path(base, key)))
    return _answer_text(qa[key], _key_path(base, key), where)


class _Conversation:
    """The parts of one conversation that every episode of it draws from."""

    def __init__(self, item: Any, i: int, where: _Where) -> None:
        base = f"[{i}]"
        obj = expect_object(item, where(base), "conversation")
        self.sample_id = get_id(obj, "sample_id", where(f"{base}.sample_id"))
        conv = expect_object(_field(obj, "conversation", dict, base, where),
                             where(f"{base}.conversation"), "conversation")
        self.sessions = _read_sessions(conv, f"{base}.conversation", where)
        obs = _field(obj, "observation", dict, base, where)
        self.observations = _read_observations(obs, f"{base}.observation", where)
        self.qa = _field(obj, "qa", list, base, where)
        # normalised "Ds:t" -> (the turn's own dia_id, its session), for evidence lookup
        self.turns: dict[str, tuple[str, int]] = {}
        for n, turns in self.sessions.items():
            for t in turns:
                parsed = parse_dia_ids(t.dia_id)
                key = _normal_dia_id(*parsed[0]) if len(parsed) == 1 else t.dia_id
                self.turns.setdefault(key, (t.dia_id, n))

    def resolve(self, evidence: Sequence[str]) -> list[tuple[str, int]]:
        """(dia_id, session) of the evidence ids that point at an existing turn, deduplicated."""
        out: list[tuple[str, int]] = []
        for text in evidence:
            for s, t in parse_dia_ids(text):
                found = self.turns.get(_normal_dia_id(s, t))
                if found is not None and found not in out:
                    out.append(found)
        return out


def _episode_or_skip(conv: _Conversation, i: int, j: int,
                     where: _Where) -> MemoryEpisode | SkipNote:
    base = f"[{i}].qa[{j}]"
    qa = expect_object(conv.qa[j], where(base), "QA item")
    question = get_string(qa, "question", where(f"{base}.question"))
    category = _field(qa, "category", int, base, where)
    if not 1 <= category <= 5:
        raise MemrlInputError(f"category must be 1..5, got {category}",
                              location=where(f"{base}.category"))
    evidence = _field(qa, "evidence", list, base, where)
    for k, e in enumerate(evidence):
        if not isinstance(e, str):
            raise MemrlInputError(f"evidence id must be a string, got {type_name(e)}",
                                  location=where(f"{base}.evidence[{k}]"))
    answer = _answer(qa, category, base, where)

    def skip(reason: str) -> SkipNote:
        return SkipNote(location=where(base), sample_id=conv.sample_id, qa_index=j,
                        question=question, reason=reason)

    if not answer.strip():
        return skip("empty answer")
    if not evidence:
        return skip("no evidence ids")
    resolved = conv.resolve(evidence)
    if not resolved:
        return skip(f"no evidence id resolves to an existing turn: {json.dumps(evidence)}")
    sessions = sorted({n for _, n in resolved})
    dialogue = [t for n in sessions for t in conv.sessions[n]]
    memory = [f for n, facts in conv.observations.items() if n not in sessions for f in facts]
    return MemoryEpisode(
        id=episode_id(conv.sample_id, j, question),
        sample_id=conv.sample_id,
        qa_index=j,
        question=question,
        answers=[answer],
        category=category,
        adversarial=category == ADVERSARIAL_CATEGORY,
        evidence=[d for d, _ in resolved],
        evidence_sessions=sessions,
        dialogue=dialogue,
        initial_memory=memory,
        dialogue_facts=[f for n in sessions for f in conv.observations.get(n, [])],
    )


# ---------------------------------------------------------------------------------------------
# public API: building, loading, saving


def build_locomo_episodes(data: Any, *, source_path: str | Path
                          ) -> tuple[list[MemoryEpisode], list[SkipNote]]:
    """One episode per QA pair of a parsed `locomo10.json`, plus notes for skipped pairs.

    `source_path` only names the file in error messages and skip notes.
    """
    where = _Where(str(source_path))
    expect_list(data, str(source_path), "conversations")
    episodes: list[MemoryEpisode] = []
    locations: list[str] = []
    skipped: list[SkipNote] = []
    for i, item in enumerate(data):
        conv = _Conversation(item, i, where)
        for j in range(len(conv.qa)):
            result = _episode_or_skip(conv, i, j, where)
            if isinstance(result, SkipNote):
                skipped.append(result)
            else:
                episodes.append(result)
                locations.append(where(f"[{i}].qa[{j}]"))
    check_unique_ids(episodes, locations)  # type: ignore[arg-type]  # only reads `.id`
    return episodes, skipped


def load_locomo(path: str | Path) -> tuple[list[MemoryEpisode], list[SkipNote]]:
    """Read `locomo10.json` (or a file of the same shape) into episodes and skip notes."""
    return build_locomo_episodes(read_json(path), source_path=path)


def save_episodes(episodes: Iterable[MemoryEpisode], out_dir: str | Path) -> Path:
    """Write `out_dir/episodes.jsonl` atomically, one episode per line."""
    return write_jsonl_atomic(Path(out_dir) / EPISODES_FILE,
                              (e.model_dump(mode="json") for e in episodes))


def save_skipped(skipped: Iterable[SkipNote], out_dir: str | Path) -> Path:
    """Write `out_dir/skipped.jsonl` (empty when nothing was skipped, so no stale list stays)."""
    return write_jsonl_atomic(Path(out_dir) / SKIPPED_FILE,
                              (s.model_dump(mode="json") for s in skipped))


def load_episodes(out_dir: str | Path) -> list[MemoryEpisode]:
    """Read `out_dir/episodes.jsonl` back (unknown keys and duplicate ids are errors)."""
    path = Path(out_dir) / EPISODES_FILE
    episodes, locations = [], []
    for lineno, value in iter_jsonl(path):
        location = f"{path}:{lineno}"
        expect_object(value, location, "episode")
        try:
            episodes.append(MemoryEpisode.model_validate(value))
        except ValidationError as exc:
            raise MemrlInputError(validation_message(exc), location=location) from None
        locations.append(location)
    check_unique_ids(episodes, locations)  # type: ignore[arg-type]  # only reads `.id`
    return episodes
