"""Results over seeds: one JSON and one Markdown table from the per-seed results of a
pipeline run (`real_model_gpu.py --plan scaled`: RES/seed_<s>/summary.json, written by its
`report`), so no figure is copied by hand.

The JSON (`benchmarks/results/smollm2_memagent_rl_scaled.json` on a device run):

    {"seeds": [0, 1],
     "protocol": "memagent",
     "biographies": {"warm_start": {"1": [s0, s1], "16": [...], "64": [...]}, "rl": {...}},
     "ruler_hqa": {...},
     "memory": {"rl": {"64": {"asked": [n0, n1], "namesake": [...], ...}}, ...},
     "environment": {"0": {...}, "1": {...}}}

Keys of a row are length multiples of the suite's training length; each list holds one
score per seed in the order of "seeds" (None where that seed has no result). The table
gives each row per seed, its mean and spread (min-max), and RL minus the warm start per seed.
Imported by the scripts next to it; memrl's public names only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SUITES = ("biographies", "ruler_hqa")
ROWS = {"base_memagent": "base model as MemAgent", "warm_start": "warm start",
        "rl": "RL (GRPO)"}
"""The rows of the seed report, in order, and their names in the table."""
GAIN = ("rl", "warm_start")
"""The difference reported per seed: RL minus the warm start."""


def table_key(suite: str, protocol: str) -> str:
    """The key of a suite's table in a pipeline summary under `protocol`."""
    return f"{suite}_{'published' if protocol == 'memagent' else 'boxed'}"


def by_multiple(scores: Mapping[str, float | None], train_docs: int) -> dict[str, float | None]:
    """`{str(N): score}` of one row → `{str(N // train_docs): score}` (length multiples)."""
    return {str(int(n) // train_docs): s for n, s in scores.items()}


def combine_seeds(summaries: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The seeds JSON (module docstring) from each seed's pipeline summary."""
    seeds = sorted(summaries)
    protocols = {summaries[s]["protocol"] for s in seeds}
    if len(protocols) != 1:
        raise SystemExit(f"the seeds were evaluated under different protocols: {protocols}")
    protocol = protocols.pop()
    out: dict[str, Any] = {"seeds": seeds, "protocol": protocol}
    for suite in SUITES:
        per_seed = {}
        for s in seeds:
            plan = summaries[s]["plan"]["suites"].get(suite)
            table = summaries[s]["tables"].get(table_key(suite, protocol))
            if plan and table:
                per_seed[s] = {row: by_multiple(v, plan["train_docs"])
                               for row, v in table["scores"].items() if row in ROWS}
        if per_seed:
            out[suite] = _lists(per_seed, seeds)
    out["memory"] = _memory(summaries, seeds, protocol)
    out["environment"] = {str(s): summaries[s].get("environment") for s in seeds}
    return out


def _lists(per_seed: Mapping[int, Mapping[str, Mapping[str, Any]]], seeds: Sequence[int]
           ) -> dict[str, dict[str, list[Any]]]:
    """{seed: {row: {key: value}}} → {row: {key: [value per seed]}}, rows in `ROWS` order,
    keys by increasing multiple."""
    rows = [r for r in ROWS if any(r in v for v in per_seed.values())]
    out: dict[str, dict[str, list[Any]]] = {}
    for row in rows:
        keys = sorted({k for v in per_seed.values() for k in v.get(row, {})}, key=int)
        out[row] = {k: [per_seed.get(s, {}).get(row, {}).get(k) for s in seeds] for k in keys}
    return out


def _memory(summaries: Mapping[int, Mapping[str, Any]], seeds: Sequence[int], protocol: str
            ) -> dict[str, Any]:
    """Whom the final memories are about, per row, multiple and subject: a count per seed."""
    out: dict[str, Any] = {}
    key = table_key("biographies", protocol)
    for s in seeds:
        train_docs = summaries[s]["plan"]["suites"]["biographies"]["train_docs"]
        for row, per_n in (summaries[s].get("memory") or {}).get(key, {}).items():
            for n, m in per_n.items():
                cell = out.setdefault(row, {}).setdefault(str(int(n) // train_docs), {})
                for subject, count in m["final_memory_about"].items():
                    cell.setdefault(subject, [None] * len(seeds))[seeds.index(s)] = count
    return out


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(mean, min, max) of the values present; None when none is."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return sum(known) / len(known), min(known), max(known)


def _cell(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.1f}" if signed else f"{value:.1f}"


def _summary_cell(values: Sequence[float | None], signed: bool = False) -> str:
    s = spread(values)
    if s is None:
        return "-"
    mean, lo, hi = s
    seeds = sum(v is not None for v in values)
    more = "" if seeds == len(values) else f", {seeds} seed{'s' * (seeds > 1)}"
    return f"{_cell(mean, signed)} ({_cell(lo, signed)} to {_cell(hi, signed)}{more})"


def suite_markdown(result: Mapping[str, Any], suite: str) -> str:
    """One suite's table: each row per seed, its mean (min to max), and RL minus the warm
    start per seed and on the mean."""
    rows, seeds = result[suite], result["seeds"]
    keys = sorted({k for v in rows.values() for k in v}, key=int)
    lines = ["| row | " + " | ".join(f"{k}x" for k in keys) + " |",
             "|---|" + "---|" * len(keys)]

    def add(label: str, lists: Mapping[str, list[Any]], signed: bool = False) -> None:
        for i, s in enumerate(seeds):
            lines.append(f"| {label}, seed {s} | " + " | ".join(
                _cell((lists.get(k) or [None] * len(seeds))[i], signed) for k in keys) + " |")
        lines.append(f"| **{label}, mean (min to max)** | " + " | ".join(
            _summary_cell(lists.get(k) or [None] * len(seeds), signed) for k in keys) + " |")

    for row, lists in rows.items():
        add(ROWS[row], lists)
    if all(r in rows for r in GAIN):
        a, b = (rows[r] for r in GAIN)
        gain = {k: [None if x is None or y is None else x - y
                    for x, y in zip(a.get(k, []), b.get(k, []), strict=True)]
                for k in keys if k in a and k in b}
        add(f"{ROWS[GAIN[0]]} - {ROWS[GAIN[1]]}", gain, signed=True)
    return "\n".join(lines) + "\n"


def seeds_markdown(result: Mapping[str, Any]) -> str:
    """Every suite's table, titled, with the protocol and the seeds."""
    parts = [f"Seeds {', '.join(map(str, result['seeds']))}; protocol {result['protocol']}; "
             "sub-EM %.\n"]
    for suite in SUITES:
        if suite in result:
            parts.append(f"### {suite}\n\n{suite_markdown(result, suite)}")
    return "\n".join(parts)


def write_seed_report(res: Path, seeds: Sequence[int], out_json: Path | None = None
                      ) -> dict[str, Any]:
    """Read RES/seed_<s>/summary.json of each seed that has one; write RES/seeds.json (and
    `out_json`) and RES/seeds.md. Returns the JSON."""
    summaries = {s: json.loads((res / f"seed_{s}" / "summary.json").read_text())
                 for s in seeds if (res / f"seed_{s}" / "summary.json").is_file()}
    if not summaries:
        raise SystemExit(f"no seed_<s>/summary.json in {res} for seeds {list(seeds)}")
    result = combine_seeds(summaries)
    text = json.dumps(result, indent=1)
    for path in (res / "seeds.json", out_json):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    (res / "seeds.md").write_text(seeds_markdown(result))
    return result
