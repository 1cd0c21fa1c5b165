"""HotpotQA in every shape it is distributed in, read into `QARecord`s.

Supported sources (see `load_hotpotqa`):
  official   the HotpotQA JSON list (`_id, question, answer, context, supporting_facts`)
  ircot      IRCoT "processed_data" JSONL (`question_id, question_text, answers_objects, contexts`)
  memrl      memrl's own JSONL, one `QARecord.model_dump()` per line (what `prepare` writes)
  parquet    MemAgent / verl parquet (`prompt, context, reward_model, extra_info`)
  hf         a Hugging Face dataset `hf:NAME[:SPLIT]` or `hf:NAME:CONFIG:SPLIT`

Every loader checks fields itself so that a bad file stops with file, line/row and field named.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from memrl.data.io import (
    check_unique_ids,
    clean_answers,
    expect_list,
    expect_object,
    first_jsonl_value,
    get_field,
    get_id,
    get_string,
    iter_jsonl,
    make_record,
    read_json,
    string_list,
    type_name,
    validation_message,
    write_atomic,
    write_jsonl_atomic,
)
from memrl.data.records import Document, QARecord
from memrl.errors import MemrlInputError, require

FORMATS = ("auto", "official", "ircot", "memrl", "parquet", "hf")
"""Values accepted by `load_hotpotqa(format=...)` and `memrl prepare hotpotqa format=...`."""

HF_PROBE_TIMEOUT_S = 3.0
"""How long to wait for the Hub before declaring it unreachable (never hang offline)."""


# ---------------------------------------------------------------------------------------------
# dispatch


def load_hotpotqa(source: str | Path, format: str = "auto") -> list[QARecord]:
    """Load HotpotQA-style questions from a file or `hf:NAME[:SPLIT]`.

    `format="auto"` decides by suffix: `.parquet`; `.jsonl` (IRCoT when the first record has
    `question_text`, memrl when it has `question`); `.json` (the official list); `hf:` prefix.
    """
    if format not in FORMATS:
        raise MemrlInputError(f"unknown format '{format}'; expected one of {', '.join(FORMATS)}")
    if isinstance(source, str) and source.startswith("hf:"):
        if format not in ("auto", "hf"):
            raise MemrlInputError(
                f"'{source}' is a Hugging Face dataset; format must be auto or hf"
            )
        return load_hf_hotpotqa(source)
    if format == "hf":
        raise MemrlInputError(
            f"format hf needs a source of the form hf:NAME[:SPLIT], got '{source}'"
        )
    path = Path(source)
    if format == "auto":
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            format = "parquet"
        elif suffix == ".jsonl":
            format = sniff_jsonl_format(path)
        elif suffix == ".json":
            return _records_from_json_value(read_json(path), path)
        else:
            raise MemrlInputError(
                f"cannot tell the format from the suffix '{suffix}'; "
                "use .json/.jsonl/.parquet or pass the format explicitly",
                location=str(path),
            )
    loaders = {
        "official": load_official_hotpotqa,
        "ircot": load_ircot_jsonl,
        "memrl": load_records_jsonl,
        "parquet": load_memagent_parquet,
    }
    return loaders[format](path)


def sniff_jsonl_format(path: str | Path) -> str:
    """`ircot` or `memrl`, from the keys of the first non-blank line."""
    path = Path(path)
    first = first_jsonl_value(path)
    if isinstance(first, dict):
        if "question_text" in first:
            return "ircot"
        if "question" in first:
            return "memrl"
    raise MemrlInputError(
        "cannot tell the JSONL format: the first record has neither 'question_text' (IRCoT) "
        "nor 'question' (memrl)",
        location=f"{path}:{_first_line_number(path)}",
    )


def _first_line_number(path: Path) -> int:
    for lineno, _ in iter_jsonl(path):
        return lineno
    return 1


def _records_from_json_value(data: Any, path: Path) -> list[QARecord]:
    if (
        isinstance(data, list)
        and data
        and isinstance(data[0], dict)
        and "input" in data[0]
        and "question" not in data[0]
    ):
        raise MemrlInputError(
            "this looks like a RULER-HQA file (records with 'input'), which is already "
            "prepared: read it with memrl.data.load_ruler_hqa instead",
            location=str(path),
        )
    return _official_from_value(data, path)


# ---------------------------------------------------------------------------------------------
# official HotpotQA JSON (and hotpot_qa-style Hugging Face rows)


def load_official_hotpotqa(path: str | Path) -> list[QARecord]:
    """The official HotpotQA JSON list (train / dev distractor / dev fullwiki)."""
    path = Path(path)
    return _official_from_value(read_json(path), path)


def _official_from_value(data: Any, path: Path) -> list[QARecord]:
    expect_list(data, str(path), "questions", "HotpotQA questions")
    locations = [f"{path} item {i}" for i in range(len(data))]
    records = [official_record(item, loc) for item, loc in zip(data, locations)]
    return check_unique_ids(records, locations)


def official_record(item: Any, location: str) -> QARecord:
    """One official HotpotQA question (list-of-pairs or HF dict-of-lists columns)."""
    obj = expect_object(item, location, "question")
    id_key = "_id" if "_id" in obj or "id" not in obj else "id"
    qid = get_id(obj, id_key, location)
    question = get_string(obj, "question", location)
    if "answer" not in obj:
        raise MemrlInputError(
            "missing field 'answer' (the HotpotQA test set ships without answers: "
            "use the train or dev file)",
            location=location,
        )
    answer = get_string(obj, "answer", location)
    if "context" not in obj:
        raise MemrlInputError("missing field 'context'", location=location)
    paragraphs = _official_context(obj["context"], location)
    supporting = _supporting_titles(obj.get("supporting_facts"), location)
    documents = [
        Document(
            title=title,
            text="".join(sentences),
            is_supporting=None if supporting is None else title in supporting,
        )
        for title, sentences in paragraphs
    ]
    return make_record(location, id=qid, question=question, answers=[answer], documents=documents)


def _official_context(value: Any, location: str) -> list[tuple[str, list[str]]]:
    """`[[title, [sentences]], ...]` or HF's `{"title": [...], "sentences": [[...], ...]}`."""
    if isinstance(value, dict):
        titles = string_list(get_field(value, "title", list, location, prefix="context."),
                             "context.title", location)
        sentences = get_field(value, "sentences", list, location, prefix="context.")
        if len(titles) != len(sentences):
            raise MemrlInputError(
                f"field 'context': {len(titles)} titles but {len(sentences)} sentence lists",
                location=location,
            )
        return [
            (t, string_list(s, f"context.sentences[{i}]", location))
            for i, (t, s) in enumerate(zip(titles, sentences))
        ]
    if not isinstance(value, list):
        raise MemrlInputError(f"field 'context' must be a list, got {type_name(value)}",
                              location=location)
    out = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise MemrlInputError(
                f"field 'context[{i}]' must be a [title, [sentences]] pair", location=location
            )
        out.append((pair[0], string_list(pair[1], f"context[{i}][1]", location)))
    return out


def _supporting_titles(value: Any, location: str) -> set[str] | None:
    """Titles named in `supporting_facts` (list of [title, sent_id] or HF dict); None if absent."""
    if value is None:
        return None
    if isinstance(value, dict):
        titles = get_field(value, "title", list, location, prefix="supporting_facts.")
        return set(string_list(titles, "supporting_facts.title", location))
    if not isinstance(value, list):
        raise MemrlInputError(
            f"field 'supporting_facts' must be a list, got {type_name(value)}", location=location
        )
    titles = set()
    for i, fact in enumerate(value):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)
                and isinstance(fact[1], int) and not isinstance(fact[1], bool)):
            raise MemrlInputError(
                f"field 'supporting_facts[{i}]' must be a [title, sentence_index] pair",
                location=location,
            )
        titles.add(fact[0])
    return titles


# ---------------------------------------------------------------------------------------------
# IRCoT processed_data JSONL


def load_ircot_jsonl(path: str | Path) -> list[QARecord]:
    """IRCoT `processed_data/*.jsonl`: answers are all spans of all answer objects."""
    path = Path(path)
    records, locations = [], []
    for lineno, value in iter_jsonl(path):
        location = f"{path}:{lineno}"
        records.append(ircot_record(value, location))
        locations.append(location)
    return check_unique_ids(records, locations)


def ircot_record(value: Any, location: str) -> QARecord:
    """One IRCoT line."""
    obj = expect_object(value, location)
    qid = get_id(obj, "question_id", location)
    question = get_string(obj, "question_text", location)
    spans: list[str] = []
    for i, answer_obj in enumerate(get_field(obj, "answers_objects", list, location)):
        prefix = f"answers_objects[{i}]."
        expect_object(answer_obj, location, f"'answers_objects[{i}]'")
        spans += string_list(get_field(answer_obj, "spans", list, location, prefix=prefix),
                             f"{prefix}spans", location)
    answers = clean_answers(spans, "answers_objects[].spans", location)
    documents = []
    for i, ctx in enumerate(get_field(obj, "contexts", list, location)):
        prefix = f"contexts[{i}]."
        expect_object(ctx, location, f"'contexts[{i}]'")
        documents.append(Document(
            title=get_field(ctx, "title", str, location, prefix=prefix),
            text=get_field(ctx, "paragraph_text", str, location, prefix=prefix),
            is_supporting=get_field(ctx, "is_supporting", bool, location, prefix=prefix,
                                    required=False),
        ))
    return make_record(location, id=qid, question=question, answers=answers, documents=documents)


# ---------------------------------------------------------------------------------------------
# memrl's own JSONL


def load_records_jsonl(path: str | Path) -> list[QARecord]:
    """memrl JSONL: one `QARecord.model_dump()` per line (unknown keys are errors)."""
    path = Path(path)
    records, locations = [], []
    for lineno, value in iter_jsonl(path):
        location = f"{path}:{lineno}"
        expect_object(value, location)
        try:
            records.append(QARecord.model_validate(value))
        except ValidationError as exc:
            raise MemrlInputError(validation_message(exc), location=location) from None
        locations.append(location)
    return check_unique_ids(records, locations)


def save_records_jsonl(records: Iterable[QARecord], path: str | Path) -> Path:
    """Write memrl JSONL atomically (temp file + rename)."""
    return write_jsonl_atomic(path, (r.model_dump(mode="json") for r in records))


def save_records(records: Sequence[QARecord], path: str | Path) -> Path:
    """Write `.jsonl` (memrl) or `.parquet` (MemAgent), chosen by suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return save_records_jsonl(records, path)
    if suffix == ".parquet":
        return save_memagent_parquet(records, path)
    raise MemrlInputError(f"output must end in .jsonl or .parquet, got '{suffix}'",
                          location=str(path))


# ---------------------------------------------------------------------------------------------
# MemAgent / verl parquet

_PARQUET_FEATURE = "reading and writing MemAgent parquet files"
PARQUET_COLUMNS = ("prompt", "context", "reward_model")


def load_memagent_parquet(path: str | Path) -> list[QARecord]:
    """MemAgent parquet: question = last user message of `prompt`, answers = ground_truth.

    The id is `extra_info.question_id` (written by memrl), else `extra_info.index`, else the
    row number; the context string is kept as is (documents are not recoverable from it).
    """
    path = Path(path)
    pq = require("pyarrow.parquet", extra="parquet", feature=_PARQUET_FEATURE)
    if not path.is_file():
        raise MemrlInputError("file not found", location=str(path))
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for non-parquet bytes
        raise MemrlInputError(f"not a readable parquet file: {exc}", location=str(path)) from None
    missing = [c for c in PARQUET_COLUMNS if c not in table.column_names]
    if missing:
        raise MemrlInputError(
            f"missing column(s) {', '.join(missing)} (has: {', '.join(table.column_names)})",
            location=str(path),
        )
    if table.num_rows == 0:
        raise MemrlInputError("file has no rows", location=str(path))
    records, locations = [], []
    for row_index, row in enumerate(table.to_pylist()):
        location = f"{path} row {row_index}"
        records.append(memagent_row_record(row, row_index, location))
        locations.append(location)
    return check_unique_ids(records, locations)


def memagent_row_record(row: Mapping[str, Any], row_index: int, location: str) -> QARecord:
    """One parquet row (already converted to Python values)."""
    question = _last_user_message(row.get("prompt"), location)
    context = get_field(row, "context", str, location)
    reward = get_field(row, "reward_model", dict, location)
    truth = get_field(reward, "ground_truth", (str, list), location, prefix="reward_model.")
    if isinstance(truth, str):
        truth = [truth]
    answers = clean_answers(string_list(truth, "reward_model.ground_truth", location),
                            "reward_model.ground_truth", location)
    extra = get_field(row, "extra_info", dict, location, required=False) or {}
    qid = str(row_index)
    num_docs = None
    if extra.get("question_id") is not None:
        qid = get_id(extra, "question_id", location, prefix="extra_info.")
    elif extra.get("index") is not None:
        qid = get_id(extra, "index", location, prefix="extra_info.")
    if extra.get("num_docs") is not None:
        num_docs = get_field(extra, "num_docs", int, location, prefix="extra_info.")
    return make_record(location, id=qid, question=question, answers=answers, context=context,
                       num_docs=num_docs)


def _last_user_message(prompt: Any, location: str) -> str:
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if not isinstance(prompt, list):
        raise MemrlInputError(
            f"field 'prompt' must be a list of chat messages, got {type_name(prompt)}",
            location=location,
        )
    for i in range(len(prompt) - 1, -1, -1):
        message = expect_object(prompt[i], location, f"'prompt[{i}]'")
        if message.get("role") == "user":
            return get_string(message, "content", location, prefix=f"prompt[{i}].")
    raise MemrlInputError("field 'prompt' has no message with role 'user'", location=location)


def save_memagent_parquet(records: Sequence[QARecord], path: str | Path, *,
                          data_source: str = "hotpotqa") -> Path:
    """Write MemAgent parquet atomically: the question as the user message, the rendered
    context, `ground_truth` = all answers; `extra_info` keeps index, question_id, num_docs."""
    pa = require("pyarrow", extra="parquet", feature=_PARQUET_FEATURE)
    pq = require("pyarrow.parquet", extra="parquet", feature=_PARQUET_FEATURE)
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("context", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()),
                                    ("ground_truth", pa.list_(pa.string()))])),
        ("extra_info", pa.struct([("index", pa.int64()), ("question_id", pa.string()),
                                  ("num_docs", pa.int64())])),
    ])
    rows = [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": r.question}],
            "context": r.render_context(),
            "reward_model": {"style": "rule", "ground_truth": list(r.answers)},
            "extra_info": {"index": i, "question_id": r.id, "num_docs": _num_docs(r)},
        }
        for i, r in enumerate(records)
    ]
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return write_atomic(path, sink.getvalue().to_pybytes())


def save_memagent_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows of MemAgent's published parquet (processing.py; see
    `memrl.data.ruler_hqa.memagent_training_rows`) atomically, with the column types pandas
    gives them there: `data_source`, `prompt` (list of {role, content}), `context`, `ability`,
    `reward_model` {style, ground_truth: list}, `extra_info` {index, question, num_docs}."""
    pa = require("pyarrow", extra="parquet", feature=_PARQUET_FEATURE)
    pq = require("pyarrow.parquet", extra="parquet", feature=_PARQUET_FEATURE)
    if not rows:
        raise MemrlInputError("no rows to write", location=str(path))
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("context", pa.string()),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()),
                                    ("ground_truth", pa.list_(pa.string()))])),
        ("extra_info", pa.struct([("index", pa.int64()), ("question", pa.string()),
                                  ("num_docs", pa.int64())])),
    ])
    table = pa.Table.from_pylist(list(rows), schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return write_atomic(path, sink.getvalue().to_pybytes())


def _num_docs(record: QARecord) -> int | None:
    if record.num_docs is not None:
        return record.num_docs
    return len(record.documents) if record.documents else None


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets

_TRUE = {"1", "ON", "YES", "TRUE"}


def hf_offline() -> bool:
    """True when HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks for the local cache only."""
    return any(os.environ.get(v, "").strip().upper() in _TRUE
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """`hf:NAME` / `hf:NAME:SPLIT` / `hf:NAME:CONFIG:SPLIT` → (name, config, split).

    The split defaults to `validation`; `hotpot_qa` defaults to its `distractor` config.
    """
    parts = spec.removeprefix("hf:").split(":")
    if not parts[0] or len(parts) > 3 or any(not p for p in parts):
        raise MemrlInputError(
            f"bad Hugging Face dataset '{spec}': expected hf:NAME[:SPLIT] or hf:NAME:CONFIG:SPLIT"
        )
    name, config, split = parts[0], None, "validation"
    if len(parts) == 2:
        split = parts[1]
    elif len(parts) == 3:
        config, split = parts[1], parts[2]
    if config is None and name.split("/")[-1] == "hotpot_qa":
        config = "distractor"
    return name, config, split


def probe_hub(timeout: float = HF_PROBE_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to the Hub so that offline runs fail fast."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parts = urlsplit(endpoint)
    host = parts.hostname or "huggingface.co"
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise MemrlInputError(
            f"cannot reach the Hugging Face Hub at {endpoint} within {timeout:g} s ({exc}); "
            "for a dataset already in the local cache set HF_HUB_OFFLINE=1, "
            "or pass a local file instead"
        ) from None


def load_hf_hotpotqa(spec: str) -> list[QARecord]:
    """A hotpot_qa-style Hugging Face dataset (`id, question, answer, context,
    supporting_facts` columns). Never hangs offline: offline env → cache only; otherwise
    the Hub is probed with a short timeout first."""
    name, config, split = parse_hf_spec(spec)
    datasets = require("datasets", extra="datasets", feature="loading Hugging Face datasets")
    offline = hf_offline()
    if not offline:
        probe_hub()
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        where = f"{name}" + (f" ({config})" if config else "") + f" split {split}"
        if offline:
            raise MemrlInputError(
                f"Hugging Face dataset {where} is not in the local cache and offline mode is set "
                f"(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): {type(exc).__name__}: {exc}"
            ) from None
        raise MemrlInputError(
            f"could not load Hugging Face dataset {where}: {type(exc).__name__}: {exc}"
        ) from None
    records, locations = [], []
    for i, row in enumerate(dataset):
        location = f"hf:{name} {split} row {i}"
        records.append(official_record(dict(row), location))
        locations.append(location)
    if not records:
        raise MemrlInputError(f"Hugging Face dataset {name} split {split} has no rows")
    return check_unique_ids(records, locations)
