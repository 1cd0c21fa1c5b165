"""memrl.rl: training by RL, in two rooms (the third, run infrastructure, is `memrl.run`).

- `memrl.rl.maths`: the algorithm's maths and `RolloutBatch`: pure functions over tensors,
  each tested against a hand-computed example; no process group, no model.
- `memrl.rl.trainer`: the machinery that applies it to a model: `Actor` (log-probs, the PPO
  update) and `Reference`, the separate `Critic` and the value head (`values`), the
  per-token forward (`logprobs`), padding-free packing, FSDP sharding, the optimizer, the
  update's running averages, and the question stream with dynamic sampling (`rollout`).
- `memrl.rl.config`: the `rl`, `optim` and `critic` config sections both rooms read.

It never imports an agent, a task, an engine or a recipe: it sees `Trajectory`s. The rooms'
imports are ruled in tests/test_layering.py (maths below trainer, trainer below `memrl.run`).
"""
