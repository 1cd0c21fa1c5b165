"""Memory diagnostics of a MemAgent evaluation: what the memory keeps, chunk by chunk.

Computed from the lines of a trajectories file only (so a resumed evaluation writes exactly
what an uninterrupted one would). Per episode and chunk k (0-based), `chunk_rows` gives

    answer_in_memory  a gold answer is in the memory after chunk k
                      (`memrl.rewards.evidence.answer_in_text`; None for yes / no answers)
    facts_in_memory   the fraction of the supporting facts whose key content is in that
                      memory (`facts_in_text`); None when the record does not know its facts
    evidence_seen     the gold evidence has been read by chunk k: every supporting fact when
                      the record knows them, else the gold answer's first appearance in the
                      context (`evidence_chunk`); None when the line carries no `evidence`
    memory_tokens / memory_chars   the length of that memory

`aggregate_traces` turns the episodes of one document count N into curves over the chunk
index (`by_chunk`) and over the chunks since the evidence entered (`after_evidence`: at
d = 0, 1, ... the share of episodes whose memory holds the answer d chunks after the chunk
that completed the evidence, i.e. P(answer in memory | evidence read d chunks ago)), and a
summary: the answer in the final memory, `captured` (the answer was in memory at or after
its evidence chunk), `kept_to_end` (captured and still there after the last chunk), the
answer in memory *before* its evidence was read (a guess or a distractor's mention), and
the memory length, and on the biographies task whom the final memories are about
(`memory_subject`: the asked person, a namesake, someone else, nobody; `final_memory_about`).
`write_diagnostics` writes `evidence_in_memory.json` and `.png`.

For the MemoryUpdate agent on LoCoMo, `memory_per_session` gives the memory size (entries,
characters) before and after an episode and its operations per dialogue session read (an
episode reads the sessions holding its question's evidence), from the same kind of lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.agents.prompts import MEMAGENT_NO_MEMORY
from memrl.data.biographies import asked_person
from memrl.data.locomo import parse_dia_ids
from memrl.eval.report import plot_panels, write_json
from memrl.rewards.evidence import GoldContent, evidence_chunk

DIAGNOSTICS_FILE = "evidence_in_memory.json"
DIAGNOSTICS_PLOT = "evidence_in_memory.png"
ABOUT = (
    "Memory diagnostics (docs/protocols.md): per chunk, whether the memory holds a gold "
    "answer (normalised, whole words) and which fraction of the supporting facts (every key "
    "word: capitalised words and numbers); curves over the chunk index (by_chunk) and over "
    "the chunks since the gold evidence was read (after_evidence); memory length per chunk."
)


def chunk_rows(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-chunk diagnostics of one trajectories line (see the module docstring)."""
    memories = [str(m) for m in row.get("memories") or []]
    evidence = row.get("evidence")
    facts = evidence.get("facts") if isinstance(evidence, dict) else None
    gold = GoldContent.of([str(a) for a in row.get("answers") or []],
                          [str(f) for f in facts] if isinstance(facts, list) else [])
    entered = evidence_chunk(evidence)
    tokens = list(row.get("memory_tokens") or [])
    out = []
    for k, memory in enumerate(memories):
        answer, held = gold.check(memory)
        out.append({
            "chunk": k,
            "answer_in_memory": answer,
            "facts_in_memory": held,
            "evidence_seen": None if evidence is None else entered is not None and k >= entered,
            "memory_tokens": tokens[k] if k < len(tokens) else None,
            "memory_chars": len(memory),
        })
    return out


SUBJECTS = ("asked", "namesake", "other", "empty")
"""Whom a final memory is about (`memory_subject`)."""


def memory_subject(name: str, memory: str, no_memory: str = MEMAGENT_NO_MEMORY) -> str:
    """Whom `memory` is about, for a question about the person `name` ("First Last"):
    `asked` when it names them in full (whole words), else `namesake` when it holds their
    first or last name as a word, else `other`; `empty` for a blank memory or the agent's
    initial one (`no_memory`)."""
    memory = memory.strip()
    if memory in ("", no_memory):
        return "empty"
    if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", memory):
        return "asked"
    return "namesake" if set(re.findall(r"\w+", memory)) & set(name.split()) else "other"


def final_memory_about(episodes: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """How many of the episodes' final memories are about each of `SUBJECTS`, over the
    episodes whose question asks about a person of the biographies task (`asked_person`);
    None when none does (another task)."""
    counts = dict.fromkeys(SUBJECTS, 0)
    found = False
    for e in episodes:
        name = asked_person(str(e.get("question") or ""))
        memories = e.get("memories") or []
        if name is None:
            continue
        found = True
        counts[memory_subject(name, str(memories[-1]) if memories else "")] += 1
    return counts if found else None


def _mean(values: Sequence[float | bool | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _curve(columns: Sequence[Sequence[Mapping[str, Any]]], key: str) -> list[float | None]:
    return [_mean([c[key] for c in column]) for column in columns]


def _first_evidence_chunk(rows: Sequence[Mapping[str, Any]]) -> int | None:
    return next((r["chunk"] for r in rows if r["evidence_seen"]), None)


def aggregate_traces(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Curves and summary over the trajectories lines of one N (every sample counts once)."""
    traces = [chunk_rows(e) for e in episodes]
    longest = max((len(t) for t in traces), default=0)
    by_index: list[list[dict[str, Any]]] = [[] for _ in range(longest)]
    after: list[list[dict[str, Any]]] = [[] for _ in range(longest)]
    located = captured = kept = early = 0
    for trace in traces:
        for r in trace:
            by_index[r["chunk"]].append(r)
        start = _first_evidence_chunk(trace)
        if start is None or trace[start]["answer_in_memory"] is None:
            continue
        located += 1
        for r in trace[start:]:
            after[r["chunk"] - start].append(r)
        got = any(r["answer_in_memory"] for r in trace[start:])
        captured += got
        kept += got and bool(trace[-1]["answer_in_memory"])
        early += any(r["answer_in_memory"] for r in trace[:start])
    while after and not after[-1]:
        after.pop()
    finals = [t[-1] for t in traces if t]
    tokens = [r["memory_tokens"] for t in traces for r in t if r["memory_tokens"] is not None]
    return {
        "episodes": len(episodes),
        "summary": {
            "answer_in_final_memory": _mean([r["answer_in_memory"] for r in finals]),
            "facts_in_final_memory": _mean([r["facts_in_memory"] for r in finals]),
            "evidence_located": located,
            "captured": captured / located if located else None,
            "kept_to_end": kept / captured if captured else None,
            "answer_before_evidence": early / located if located else None,
            "memory_tokens_mean": _mean(tokens),
            "memory_tokens_max": max(tokens, default=None),
            "memory_chars_mean": _mean([r["memory_chars"] for t in traces for r in t]),
            "final_memory_about": final_memory_about(episodes),
        },
        "by_chunk": {
            "episodes": [len(c) for c in by_index],
            "answer_in_memory": _curve(by_index, "answer_in_memory"),
            "facts_in_memory": _curve(by_index, "facts_in_memory"),
            "evidence_seen": _curve(by_index, "evidence_seen"),
            "memory_tokens": _curve(by_index, "memory_tokens"),
            "memory_chars": _curve(by_index, "memory_chars"),
        },
        "after_evidence": {
            "episodes": [len(c) for c in after],
            "answer_in_memory": _curve(after, "answer_in_memory"),
            "facts_in_memory": _curve(after, "facts_in_memory"),
        },
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.0f}%"


def summary_line(num_docs: int | str, diagnostics: Mapping[str, Any]) -> str:
    """One printed line of the diagnostics of one N."""
    s = diagnostics["summary"]
    parts = [f"N={num_docs} memory: gold answer in the final memory "
             f"{_pct(s['answer_in_final_memory'])}"]
    if s["evidence_located"]:
        parts.append(f"captured once read {_pct(s['captured'])} of "
                     f"{s['evidence_located']}, kept to the end {_pct(s['kept_to_end'])}")
    if s["facts_in_final_memory"] is not None:
        parts.append(f"supporting facts in the final memory {_pct(s['facts_in_final_memory'])}")
    about = s.get("final_memory_about")
    if about:
        parts.append("final memory about the asked person / a namesake / other / empty "
                     + " / ".join(str(about[k]) for k in SUBJECTS))
    if s["memory_tokens_mean"] is not None:
        parts.append(f"{s['memory_tokens_mean']:.0f} tokens per memory "
                     f"(max {s['memory_tokens_max']})")
    return " · ".join(parts)


def read_diagnostics(out_dir: str | Path) -> dict[str, Any]:
    """The per-N diagnostics already in `out_dir` (empty when none or unreadable: they
    are recomputed from the trajectories of every N this run evaluates)."""
    path = Path(out_dir) / DIAGNOSTICS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    per_n = data.get("per_num_docs") if isinstance(data, dict) else None
    return dict(per_n) if isinstance(per_n, dict) else {}


def write_diagnostics(out_dir: str | Path, per_n: Mapping[str, Mapping[str, Any]],
                      title: str = "") -> Path:
    """`evidence_in_memory.json` (every N, by increasing N) and its plot: the answer in
    memory by chunk and after the evidence, and the memory length by chunk, one curve per N.
    Returns the JSON path."""
    out = Path(out_dir)
    ordered = dict(sorted(per_n.items(), key=lambda kv: int(kv[0])))
    path = write_json(out / DIAGNOSTICS_FILE, {"about": ABOUT, "per_num_docs": ordered})
    pct = lambda ys: [None if y is None else 100.0 * y for y in ys]  # noqa: E731
    by_chunk = {f"N={n}": d["by_chunk"] for n, d in ordered.items() if d["episodes"]}
    after = {f"N={n}": d["after_evidence"] for n, d in ordered.items()
             if d["after_evidence"]["episodes"]}
    plot_panels(out / DIAGNOSTICS_PLOT, [
        {"title": "gold answer in memory", "xlabel": "chunk", "ylabel": "episodes (%)",
         "ylim": (-2, 102), "series": {k: (range(1, len(c["episodes"]) + 1),
                                           pct(c["answer_in_memory"]))
                                       for k, c in by_chunk.items()}},
        {"title": "after the evidence was read", "xlabel": "chunks since the evidence",
         "ylabel": "answer in memory (%)", "ylim": (-2, 102),
         "series": {k: (range(len(c["episodes"])), pct(c["answer_in_memory"]))
                    for k, c in after.items()}},
        {"title": "memory length", "xlabel": "chunk", "ylabel": "tokens",
         "series": {k: (range(1, len(c["episodes"]) + 1), c["memory_tokens"])
                    for k, c in by_chunk.items()}},
    ], title=title)
    return path


OPERATIONS = ("inserts", "updates", "deletes", "searches")
"""The tool operations counted per episode (`scores` of a MemoryUpdate trajectories line)."""


def sessions_read(row: Mapping[str, Any]) -> int:
    """The dialogue sessions a MemoryUpdate episode reads: those of its evidence ids
    (`D<session>:<turn>`); at least 1."""
    return max(1, len({s for e in row.get("evidence") or [] for s, _ in parse_dia_ids(str(e))}))


def memory_per_session(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over MemoryUpdate trajectories lines: sessions read, memory size (entries and
    characters) before and after, and per session read the operations and the growth."""

    def size(row: Mapping[str, Any], when: str, key: str) -> float | None:
        value = (row.get(when) or {}).get(key)
        return None if value is None else float(value)

    def growth(row: Mapping[str, Any], key: str) -> float | None:
        before, after = size(row, "memory_before", key), size(row, "memory_after", key)
        return None if before is None or after is None else after - before

    sessions = [sessions_read(r) for r in rows]
    values = {op: [(r.get("scores") or {}).get(op) for r in rows] for op in OPERATIONS}
    values["calls"] = [(r.get("scores") or {}).get("tool_calls") for r in rows]
    values["growth_entries"] = [growth(r, "count") for r in rows]
    values["growth_chars"] = [growth(r, "chars") for r in rows]
    per_session = {key: _mean([None if v is None else float(v) / k
                               for v, k in zip(vs, sessions, strict=True)])
                   for key, vs in values.items()}
    return {
        "sessions": _mean(sessions),
        "memory_entries_initial": _mean([size(r, "memory_before", "count") for r in rows]),
        "memory_entries_final": _mean([size(r, "memory_after", "count") for r in rows]),
        "memory_chars_initial": _mean([size(r, "memory_before", "chars") for r in rows]),
        "memory_chars_final": _mean([size(r, "memory_after", "chars") for r in rows]),
        "per_session": per_session,
    }


def session_line(name: str, memory: Mapping[str, Any]) -> str:
    """One printed line of `memory_per_session`."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    ops = memory["per_session"]
    return (f"{name}: {fmt(memory['sessions'])} sessions read per episode; per session "
            f"{fmt(ops['calls'])} tool calls: "
            + ", ".join(f"{fmt(ops[op])} {op}" for op in OPERATIONS)
            + f"; memory {fmt(memory['memory_entries_initial'])} → "
            f"{fmt(memory['memory_entries_final'])} entries, "
            f"{fmt(memory['memory_chars_initial'])} → {fmt(memory['memory_chars_final'])} chars")


SESSION_COLUMNS = ("category", "sessions/ep", "calls/session", "ins/session", "upd/session",
                   "del/session", "search/session", "entries init", "entries final", "chars init",
                   "chars final")


def session_rows(per_category: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """Rows of the memory-per-session table, from each category's `memory`
    (`memory_per_session`)."""
    rows = []
    for key, r in per_category.items():
        m = r["memory"]
        rows.append([key, m["sessions"], m["per_session"]["calls"],
                     *(m["per_session"][op] for op in OPERATIONS),
                     m["memory_entries_initial"], m["memory_entries_final"],
                     m["memory_chars_initial"], m["memory_chars_final"]])
    return rows
