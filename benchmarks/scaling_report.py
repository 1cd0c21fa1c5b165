"""Weak-scaling efficiencies from `benchmarks/scaling_gpu.sh`'s result files:

    python benchmarks/scaling_report.py DIR [--json-out FILE]

DIR holds `update_<shape>_gpus<N>.json` (train_step_gpu.py --update-only) and
`step_<shape>_gpus<N>.json` (the full step). Efficiency at N GPUs is throughput(N) /
(N x throughput(1)): update tokens/s for the update, trajectories/s for the step. Prints a
table and writes one JSON with `world_size`, `scaling_efficiency` (update and step) and
`gpu_seconds_per_trajectory` per N."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

NAME = re.compile(r"(update|step)_(?P<shape>[\w.]+)_gpus(?P<n>\d+)\.json$")


def read_runs(folder: Path) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """{(kind, shape): {N: result}} of the files in `folder`."""
    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        m = NAME.match(path.name)
        if m:
            runs.setdefault((m.group(1), m.group("shape")), {})[int(m.group("n"))] = \
                json.loads(path.read_text())
    return runs


def throughput(kind: str, result: dict[str, Any]) -> float:
    """Update tokens/s of the best budget (all GPUs), or trajectories/s of a full step."""
    if kind == "update":
        return max(b["update_tokens_per_s"] for b in result["budgets"] if "error" not in b)
    mean = result["mean_excluding_warmup"]
    return mean["trajectories_all_ranks"] / mean["perf/step_time_s"]


def scaling(runs: dict[tuple[str, str], dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (kind, shape, N): throughput, efficiency against N = 1, and a full step's
    GPU-seconds per trajectory."""
    rows = []
    for (kind, shape), by_n in sorted(runs.items()):
        base = throughput(kind, by_n[1]) if 1 in by_n else None
        for n, result in sorted(by_n.items()):
            value = throughput(kind, result)
            rows.append({
                "kind": kind, "shape": shape, "world_size": n, "throughput": value,
                "scaling_efficiency": None if base is None else value / (n * base),
                "gpu_seconds_per_trajectory": (result.get("gpu_seconds_per_trajectory") or {})
                .get("total") if kind == "step" else None,
            })
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    rows = scaling(read_runs(args.folder))
    print("kind | shape | GPUs | throughput | efficiency | GPU-s/trajectory")
    for r in rows:
        eff = "-" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.1%}"
        cost = "-" if r["gpu_seconds_per_trajectory"] is None else \
            f"{r['gpu_seconds_per_trajectory']:.2f}"
        print(f"{r['kind']} | {r['shape']} | {r['world_size']} | {r['throughput']:.1f} | "
              f"{eff} | {cost}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
