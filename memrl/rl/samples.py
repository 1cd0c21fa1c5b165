"""From trajectories to training tensors: samples, token-budget micro-batches, collation.

One `Sample` per conversation (Turn); every sample carries its trajectory's advantage. No
conversation is ever dropped or trimmed to make a batch divide evenly: the micro-batches vary
in size instead (`pack_token_budget`), and the loss weights (`sample_loss_weights`) keep the
objective exact however the samples are split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from memrl.agents.trajectory import Trajectory
from memrl.errors import MemrlInputError
from memrl.rl.losses import loss_row_weights

__all__ = [
    "OVERLONG_MODES",
    "Sample",
    "collate",
    "pack_token_budget",
    "sample_loss_weights",
    "split_mini_batches",
    "trajectories_to_samples",
]

OVERLONG_MODES = ("mask", "keep")


@dataclass
class Sample:
    """One conversation of one trajectory, ready to train on."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    """Rollout log-probability of each response token (the behaviour policy)."""
    advantage: float
    """The trajectory's advantage, shared by all its conversations."""
    traj_id: int
    """Position of the trajectory in the batch it came from."""
    group_id: str
    """The question id (`Trajectory.record_id`): trajectories of one group share it."""
    turn_index: int
    turn_kind: str
    truncated: bool = False
    """The response was cut at max_new_tokens (finish_reason "length")."""
    trainable: bool = True
    """False: the sample is kept (for logging, batching) but its tokens carry no loss."""

    def __post_init__(self) -> None:
        if len(self.old_logprobs) != len(self.response_ids):
            raise ValueError(
                f"sample has {len(self.response_ids)} response tokens but "
                f"{len(self.old_logprobs)} logprobs"
            )
        if not self.prompt_ids:
            # The first response token is predicted by the logits at the last prompt position.
            raise ValueError("sample has an empty prompt: its first response token has no logit")

    @property
    def num_tokens(self) -> int:
        """Prompt + response tokens: what the sample costs in a forward pass."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_loss_tokens(self) -> int:
        return len(self.response_ids) if self.trainable else 0


# Overlong filtering (DAPO, arXiv:2503.14476 §3.4; verl's overlong buffer/filter): a response
# cut at max_new_tokens is not a judgement on the policy's answer, so with overlong="mask" a
# truncated turn (finish_reason "length") stays in the batch with trainable=False (zero loss
# weight); overlong="keep" trains on it like any other turn. Only the truncated turn is
# masked: the trajectory's other turns keep their advantage.
def trajectories_to_samples(
    trajectories: Sequence[Trajectory],
    advantages: Tensor | Sequence[float],
    *,
    overlong: str = "mask",
) -> list[Sample]:
    """One Sample per Turn, in order, each with its trajectory's advantage."""
    if overlong not in OVERLONG_MODES:
        raise MemrlInputError(
            f"overlong must be one of {', '.join(OVERLONG_MODES)}, got {overlong!r}",
            location="overlong",
        )
    adv = advantages.tolist() if isinstance(advantages, Tensor) else list(advantages)
    if len(adv) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories but {len(adv)} advantages")
    samples = []
    for traj_id, (traj, a) in enumerate(zip(trajectories, adv, strict=True)):
        a = float(a)
        if a != a or a in (float("inf"), float("-inf")):
            raise ValueError(f"trajectory {traj_id} ({traj.record_id}) has advantage {a}")
        for turn_index, turn in enumerate(traj.turns):
            samples.append(
                Sample(
                    prompt_ids=list(turn.prompt_ids),
                    response_ids=list(turn.response_ids),
                    old_logprobs=[float(x) for x in turn.response_logprobs],
                    advantage=a,
                    traj_id=traj_id,
                    group_id=traj.record_id,
                    turn_index=turn_index,
                    turn_kind=turn.kind,
                    truncated=turn.truncated,
                    trainable=not (turn.truncated and overlong == "mask"),
                )
            )
    return samples


def sample_loss_weights(samples: Sequence[Sample], mode: str) -> Tensor:
    """Per-sample loss-token weights for ``mode`` over these samples (the full mini-batch).

    Slice by a micro-batch's indices and pass as ``row_weights`` to `policy_loss` / `agg_loss`.
    """
    n = torch.tensor([s.num_loss_tokens for s in samples], dtype=torch.long)
    traj = torch.tensor([s.traj_id for s in samples], dtype=torch.long)
    return loss_row_weights(n, mode, traj_ids=traj)


# Dynamic batch size (verl use_dynamic_bsz / ppo_max_token_len_per_gpu), first-fit-decreasing
# bin packing: take samples longest first (ties: lower index first) and put each into the
# first micro-batch it fits in, else open a new one. Deterministic. A sample longer than the
# budget gets a micro-batch of its own (never dropped, never trimmed). The cost of a
# micro-batch is its real token count (padding-free, as verl's remove-padding path), or with
# padded=True rows x longest row, the size of a right-padded `collate` batch.
def pack_token_budget(
    samples: Sequence[Sample], max_tokens_per_micro_batch: int, *, padded: bool = False
) -> list[list[int]]:
    """Indices of ``samples`` grouped into micro-batches within the token budget."""
    budget = max_tokens_per_micro_batch
    if budget < 1:
        raise MemrlInputError(
            f"max_tokens_per_micro_batch must be >= 1, got {budget}",
            location="max_tokens_per_micro_batch",
        )
    sizes = [s.num_tokens for s in samples]
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    totals: list[int] = []  # real tokens of each bin
    for i in order:
        size = sizes[i]
        for b, members in enumerate(bins):
            # Decreasing order: the bin's first member is its longest, and >= size.
            cost = (len(members) + 1) * sizes[members[0]] if padded else totals[b] + size
            if cost <= budget:
                members.append(i)
                totals[b] += size
                break
        else:
            bins.append([i])
            totals.append(size)
    return [sorted(members) for members in bins]


def split_mini_batches(n: int, mini_batch_size: int) -> list[list[int]]:
    """Consecutive index ranges of ``mini_batch_size`` (verl ppo_mini_batch_size) covering
    all ``n`` samples; the last one is smaller when n does not divide evenly."""
    if mini_batch_size < 1:
        raise MemrlInputError(
            f"mini_batch_size must be >= 1, got {mini_batch_size}", location="mini_batch_size"
        )
    return [list(range(s, min(s + mini_batch_size, n))) for s in range(0, n, mini_batch_size)]


# Alignment. A causal LM's logits at position t predict token t+1. Every per-token tensor
# here is indexed by the *logit* position t, so `logprobs_from_logits(model(input_ids).logits,
# labels)` lines up with old_logprobs / response_mask / advantages with no further shifting:
#   labels[b, t]        = input_ids[b, t+1]      (pad_id at the last real token and beyond)
#   response_mask[b, t] = labels[b, t] is a response token
# For a prompt of P tokens and a response of R tokens, response token j sits at input
# position P+j and is predicted at t = P+j-1: response_mask[b, P-1 : P+R-1] is set and
# old_logprobs[b, P-1+j] is its rollout log-probability.
def collate(samples: Sequence[Sample], pad_id: int) -> dict[str, Tensor]:
    """Right-padded (batch, seq) tensors for a forward pass and the loss.

    Keys: input_ids, attention_mask, position_ids, labels (long, (B, L)); response_mask,
    loss_mask (bool, (B, L); loss_mask = response_mask of trainable samples); old_logprobs,
    advantages (float32, (B, L), 0 off the response); traj_ids, num_loss_tokens (long, (B,)).
    If the rollout sampled at temperature T, divide the logits by T before taking log-probs.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    bsz, seq = len(samples), max(s.num_tokens for s in samples)
    input_ids = torch.full((bsz, seq), pad_id, dtype=torch.long)
    labels = torch.full((bsz, seq), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((bsz, seq), dtype=torch.long)
    response_mask = torch.zeros((bsz, seq), dtype=torch.bool)
    old_logprobs = torch.zeros((bsz, seq), dtype=torch.float32)
    advantages = torch.zeros((bsz, seq), dtype=torch.float32)
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        input_ids[b, : p + r] = ids
        labels[b, : p + r - 1] = ids[1:]
        attention_mask[b, : p + r] = 1
        response_mask[b, p - 1 : p + r - 1] = True
        old_logprobs[b, p - 1 : p + r - 1] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        advantages[b, p - 1 : p + r - 1] = s.advantage
    trainable = torch.tensor([s.trainable for s in samples], dtype=torch.bool)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        # As verl's compute_position_id_with_mask: 0..n-1, then n-1 repeated over the padding.
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "labels": labels,
        "response_mask": response_mask,
        "loss_mask": response_mask & trainable.unsqueeze(-1),
        "old_logprobs": old_logprobs,
        "advantages": advantages,
        "traj_ids": torch.tensor([s.traj_id for s in samples], dtype=torch.long),
        "num_loss_tokens": torch.tensor([s.num_loss_tokens for s in samples], dtype=torch.long),
    }
