"""memrl.run: the infrastructure of a run, around the algorithm and its trainer.

- `checkpoint`: atomic checkpoints, resume into the live model, keep-last-K, HF export; its
  `__init__` is the public entry point (apps and commands import nothing deeper).
- `record`: `run.json` of every run (how it ran, on what, which code and config, its exit).
- `metrics`: the metrics logger (metrics.jsonl, console, TensorBoard, W&B; secrets scrubbed).
- `trajectory_log`, `trajectory_files`: a JSONL row per trajectory per step, and reading and
  pruning those files without torch (for `memrl view`).
- `scaffold`: what every recipe shares: seeding, resume, the loop, checkpoints on the cadence.

It may import `memrl.rl` (both rooms); `memrl.rl` never imports it. Importing this package
loads nothing: `memrl view` reads trajectory files without torch.
"""
