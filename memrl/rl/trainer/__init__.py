"""memrl.rl.trainer: the machinery that trains a model with `memrl.rl.maths`.

- `actor`: `Actor` (log-probs, entropy; the PPO update over epochs, mini-batches and
  micro-batches, its typed `UpdateStats`) and `Reference`.
- `logprobs`: the per-token forward (`response_logprobs`; with a value head, `response_pass`).
- `critic`, `values`: the separate value model (`Critic`) and what it shares with a value head
  on the policy (`PolicyValueHead`, `CriticStats`).
- `optim`: AdamW, verl's lr schedules, `optimizer_step` (clip, skip non-finite, step).
- `packing`: padding-free micro-batches (`packed_inputs`, rl.remove_padding).
- `sharding`: FSDP2 wrapping of policy, reference and critic.
- `averages`: the update's running averages, read from the device at once.
- `rollout`: the question stream and dynamic sampling (`collect_groups`).

It imports `memrl.rl.maths`, never the run infrastructure (`memrl.run`) or a recipe.
"""
