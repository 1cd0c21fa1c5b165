"""Compare two runs' metrics step by step (a resumed run against an uninterrupted one):

    python scripts/compare_metrics.py REFERENCE/metrics.jsonl RESUMED/metrics.jsonl [MAX_REL]

Prints, per step both logged, the largest relative difference over the keys they share
(times and perf/* left out) and the key where it is; with MAX_REL, exits 1 when a step's
largest difference is above it (else 0)."""

from __future__ import annotations

import sys

from memrl.run.metrics import read_metrics


def by_step(path: str) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for row in read_metrics(path):
        if "step" in row:
            rows.setdefault(int(row["step"]), {}).update(row)
    return rows


def main(reference: str, resumed: str, max_rel: str | None = None) -> int:
    ref, got = by_step(reference), by_step(resumed)
    largest = 0.0
    print(f"steps: reference {sorted(ref)}, resumed {sorted(got)}")
    for step in sorted(set(ref) & set(got)):
        keys = [k for k in ref[step] if k in got[step] and k != "time" and not
                k.startswith(("perf/", "timing/")) and isinstance(ref[step][k], (int, float))]
        worst, where = 0.0, None
        for k in keys:
            a, b = float(ref[step][k]), float(got[step][k])
            rel = abs(a - b) / max(abs(a), abs(b), 1e-12)
            if rel > worst:
                worst, where = rel, k
        print(f"step {step}: {len(keys)} keys, largest relative difference {worst:.2e}"
              + (f" ({where}: {ref[step][where]} vs {got[step][where]})" if where else ""))
        largest = max(largest, worst)
    return int(max_rel is not None and largest > float(max_rel))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
