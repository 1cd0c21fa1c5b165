"""The training batch: trajectories → one typed `RolloutBatch`, built once per step.

One `Conversation` per Turn (its prompt and response); every conversation belongs to a
trajectory, and every
trajectory to a group (its question). The batch holds what the update needs, each piece
added in the recipe's order and never changed afterwards (`RolloutBatch` is frozen; the recipe
makes the next version with `with_logprobs` / `with_advantages`):

    conversations       token ids, rollout log-probs, turn kind, trainable flag (each)
    group_ids, rewards  one per trajectory
    response_tokens     response tokens of each trajectory, all its turns together
    old_logprobs        the policy's log-probs before the update (per conversation; None
                        on-policy: the update's own forward gives them)
    ref_logprobs        the reference policy's log-probs (per conversation; with a KL term)
    advantages          one per trajectory, shared by all its conversations
    values, returns     PPO (rl.adv_estimator=gae): the critic's value and the GAE return
    token_advantages    at each response token (per sample); the update then uses these

No conversation is ever dropped or trimmed to make a batch divide evenly: the micro-batches
vary in size instead (`pack_token_budget`), and the loss norm (`RolloutBatch.loss_norm`)
keeps the objective exact however the conversations are split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from memrl.errors import MemrlInputError
from memrl.rl.maths.losses import LossNorm, kl_penalty, loss_norm
from memrl.trajectory import Trajectory

__all__ = [
    "OVERLONG_MODES",
    "RolloutBatch",
    "Conversation",
    "collate",
    "on_device",
    "pack_token_budget",
    "response_rows",
]

OVERLONG_MODES = ("mask", "keep")


@dataclass(frozen=True)
class Conversation:
    """One conversation of one trajectory, ready to train on."""

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    """The engine's log-probability of each response token (the behaviour policy)."""
    traj_index: int
    """Position of the trajectory in the batch (index into `RolloutBatch.rewards`)."""
    group_id: str
    """The question id (`Trajectory.record_id`): trajectories of one group share it."""
    turn_index: int
    turn_kind: str
    truncated: bool = False
    """The response was cut at max_new_tokens (finish_reason "length")."""
    trainable: bool = True
    """False: the conversation is kept (for logging, batching) but its tokens carry no loss."""

    def __post_init__(self) -> None:
        if len(self.rollout_logprobs) != len(self.response_ids):
            raise ValueError(
                f"conversation has {len(self.response_ids)} response tokens but "
                f"{len(self.rollout_logprobs)} logprobs"
            )
        if not self.prompt_ids:
            # The first response token is predicted by the logits at the last prompt position.
            raise ValueError(
                "conversation has an empty prompt: its first response token has no logit")

    @property
    def num_tokens(self) -> int:
        """Prompt + response tokens: what the conversation costs in a forward pass."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_loss_tokens(self) -> int:
        return len(self.response_ids) if self.trainable else 0


# Overlong filtering (DAPO, arXiv:2503.14476 §3.4; verl's overlong buffer/filter): a response
# cut at max_new_tokens is not a judgement on the policy's answer, so with overlong="mask" a
# truncated turn (finish_reason "length") stays in the batch with trainable=False (zero loss
# weight); overlong="keep" trains on it like any other turn. Only the truncated turn is
# masked: the trajectory's other turns keep their advantage.
@dataclass(frozen=True)
class RolloutBatch:
    """Everything one training step learns from (see the module docstring)."""

    conversations: tuple[Conversation, ...]
    group_ids: tuple[str, ...]
    rewards: Tensor
    """(T,) float32: each trajectory's reward."""
    response_tokens: Tensor
    """(T,) long: response tokens of each trajectory over all its turns."""
    old_logprobs: tuple[Tensor, ...] | None = None
    ref_logprobs: tuple[Tensor, ...] | None = None
    advantages: Tensor | None = None
    """(T,) float32. With token_advantages: their mean over the trajectory's response tokens
    (for the logs; the update uses token_advantages)."""
    values: tuple[Tensor, ...] | None = None
    """The critic's V(s_t) at every response token (per sample; rl.adv_estimator=gae)."""
    returns: tuple[Tensor, ...] | None = None
    """The critic's targets, GAE advantage + value, per response token (per sample)."""
    token_advantages: tuple[Tensor, ...] | None = None
    """Per response token (per sample): given, the policy loss uses these."""
    group_order: tuple[str, ...] | None = None
    """Data parallelism: every group of the step on every rank, in the order one process
    would hold them, so that mini-batch k is the same questions on any number of ranks
    (`mini_batches`). None: this batch's own groups, in order."""

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        *,
        overlong: str = "mask",
        group_order: Sequence[str] | None = None,
    ) -> RolloutBatch:
        """One Conversation per Turn, trajectory by trajectory, turn by turn; rewards must be set.
        `group_order`: the step's groups over all data-parallel ranks (see the field)."""
        if overlong not in OVERLONG_MODES:
            raise MemrlInputError(
                f"overlong must be one of {', '.join(OVERLONG_MODES)}, got {overlong!r}",
                location="rl.overlong",
            )
        conversations = []
        for traj_index, traj in enumerate(trajectories):
            if traj.reward is None:
                raise ValueError(f"trajectory {traj_index} ({traj.record_id}) has no reward")
            for turn_index, turn in enumerate(traj.turns):
                conversations.append(
                    Conversation(
                        prompt_ids=list(turn.prompt_ids),
                        response_ids=list(turn.response_ids),
                        rollout_logprobs=[float(x) for x in turn.response_logprobs],
                        traj_index=traj_index,
                        group_id=traj.record_id,
                        turn_index=turn_index,
                        turn_kind=turn.kind,
                        truncated=turn.truncated,
                        trainable=not (turn.truncated and overlong == "mask"),
                    )
                )
        rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)
        if not torch.isfinite(rewards).all():
            raise ValueError(f"rewards must be finite, got {rewards.tolist()}")
        tokens = torch.zeros(len(trajectories), dtype=torch.long)
        for s in conversations:
            tokens[s.traj_index] += len(s.response_ids)
        order = None
        if group_order is not None:
            order = tuple(dict.fromkeys(group_order))
            missing = set(t.record_id for t in trajectories) - set(order)
            if missing:
                raise ValueError(f"groups {sorted(missing)} are not in group_order")
        return cls(
            tuple(conversations), tuple(t.record_id for t in trajectories), rewards, tokens,
            group_order=order,
        )

    # ---- the next version of the batch (the recipe's steps, in order)
    def with_logprobs(
        self, old: Sequence[Tensor] | None, ref: Sequence[Tensor] | None = None
    ) -> RolloutBatch:
        """Old and reference log-probs per conversation. old None: the update takes them
        from its own forward (on-policy: `RLConfig.old_logprob_source`)."""
        for name, values in (("old", old), ("reference", ref)):
            if values is not None:
                self._check_per_conversation(name, values)
        return dataclasses.replace(
            self, old_logprobs=None if old is None else tuple(old),
            ref_logprobs=None if ref is None else tuple(ref),
        )

    def with_rewards(self, rewards: Tensor) -> RolloutBatch:
        if rewards.shape != self.rewards.shape:
            raise ValueError(f"rewards must have shape {tuple(self.rewards.shape)}")
        return dataclasses.replace(self, rewards=rewards.to(torch.float32))

    def with_advantages(self, advantages: Tensor) -> RolloutBatch:
        if advantages.shape != self.rewards.shape or not torch.isfinite(advantages).all():
            raise ValueError(f"advantages must be {tuple(self.rewards.shape)} finite numbers")
        return dataclasses.replace(self, advantages=advantages.to(torch.float32))

    def with_values(self, values: Sequence[Tensor]) -> RolloutBatch:
        self._check_per_conversation("value", values)
        return dataclasses.replace(self, values=tuple(v.to(torch.float32) for v in values))

    def with_token_advantages(
        self, advantages: Sequence[Tensor], returns: Sequence[Tensor]
    ) -> RolloutBatch:
        """Per-token advantages and value targets; `advantages` (T,) becomes each
        trajectory's mean over its response tokens (0 for none)."""
        for name, rows in (("advantage", advantages), ("return", returns)):
            self._check_per_conversation(name, rows)
            if not all(torch.isfinite(r).all() for r in rows):
                raise ValueError(f"{name}s must be finite")
        total = torch.zeros(self.num_trajectories, dtype=torch.float64)
        for s, a in zip(self.conversations, advantages, strict=True):
            total[s.traj_index] += a.double().sum()
        mean = total / self.response_tokens.clamp(min=1).double()
        return dataclasses.replace(
            self.with_advantages(mean.to(torch.float32)),
            token_advantages=tuple(a.to(torch.float32) for a in advantages),
            returns=tuple(r.to(torch.float32) for r in returns),
        )

    def _check_per_conversation(self, name: str, values: Sequence[Tensor]) -> None:
        if len(values) != len(self.conversations):
            raise ValueError(f"{len(values)} {name} log-prob rows for "
                             f"{len(self.conversations)} conversations")
        for i, (v, s) in enumerate(zip(values, self.conversations, strict=True)):
            if v.shape != (len(s.response_ids),):
                raise ValueError(f"{name} log-probs of conversation {i}: shape {tuple(v.shape)}")

    # ---- views
    @property
    def num_trajectories(self) -> int:
        return len(self.group_ids)

    def traj_index(self, indices: Sequence[int] | None = None) -> Tensor:
        """Trajectory of each conversation (of `indices`, default all), long (S,)."""
        idx = range(len(self.conversations)) if indices is None else indices
        return torch.tensor([self.conversations[i].traj_index for i in idx], dtype=torch.long)

    def kl(self, kind: str) -> Tensor:
        """KL(π_old ‖ π_ref) estimate (`kl_penalty` of `kind`) summed over every response
        token of every conversation of each trajectory, (T,): the reward penalty of verl's
        `apply_kl_penalty` with an outcome reward (arXiv:1909.08593 §2)."""
        if self.old_logprobs is None or self.ref_logprobs is None:
            raise ValueError("the KL penalty needs old and reference log-probs in the batch")
        out = torch.zeros(self.num_trajectories, dtype=torch.float32)
        rows = zip(self.conversations, self.old_logprobs, self.ref_logprobs, strict=True)
        for s, old, ref in rows:
            out[s.traj_index] += kl_penalty(old, ref, kind).sum().to(torch.float32)
        return out

    def mini_batches(self, groups_per_mini_batch: int) -> list[list[int]]:
        """Conversation indices of each mini-batch: `groups_per_mini_batch` questions each (verl
        ppo_mini_batch_size), with all conversations of all their trajectories, in order.

        With a `group_order` the mini-batches are those of the whole data-parallel step:
        this rank gets its conversations of each (possibly none), and every rank gets as many."""
        if groups_per_mini_batch < 1:
            raise ValueError(f"groups_per_mini_batch must be >= 1, got {groups_per_mini_batch}")
        order = (
            list(self.group_order)
            if self.group_order is not None
            else list(dict.fromkeys(s.group_id for s in self.conversations))
        )
        where = {g: i // groups_per_mini_batch for i, g in enumerate(order)}
        out: list[list[int]] = [[] for _ in range(-(-len(order) // groups_per_mini_batch))]
        for i, s in enumerate(self.conversations):
            out[where[s.group_id]].append(i)
        return out

    def loss_norm(
        self, indices: Sequence[int], mode: str, *, scale_factor: float | None = None
    ) -> LossNorm:
        """The loss norm of `mode` over these conversations (a whole mini-batch)."""
        n = torch.tensor([self.conversations[i].num_loss_tokens for i in indices], dtype=torch.long)
        return loss_norm(n, mode, traj_ids=self.traj_index(indices), scale_factor=scale_factor)

    def collate(self, indices: Sequence[int], pad_id: int) -> dict[str, Tensor]:
        """`collate` of these conversations, with the batch's old / ref log-probs and advantages."""
        conversations = [self.conversations[i] for i in indices]
        per_conversation = {}
        if self.old_logprobs is not None:
            per_conversation["old_logprobs"] = [self.old_logprobs[i] for i in indices]
        if self.ref_logprobs is not None:
            per_conversation["ref_logprobs"] = [self.ref_logprobs[i] for i in indices]
        if self.token_advantages is not None:
            per_conversation["advantages"] = [self.token_advantages[i] for i in indices]
        elif self.advantages is not None:
            per_conversation["advantages"] = [
                self.advantages[s.traj_index].expand(len(s.response_ids)) for s in conversations
            ]
        for name in ("values", "returns"):
            rows = getattr(self, name)
            if rows is not None:
                per_conversation[name] = [rows[i] for i in indices]
        return collate(conversations, pad_id, **per_conversation)


# Dynamic batch size (verl use_dynamic_bsz / ppo_max_token_len_per_gpu), first-fit-decreasing
# bin packing: take conversations longest first (ties: lower index first) and put each into the
# first micro-batch it fits in, else open a new one. Deterministic. A conversation longer than
# budget gets a micro-batch of its own (never dropped, never trimmed). The cost of a
# micro-batch is its real token count (padding-free, as verl's remove-padding path), or with
# padded=True rows x longest row, the size of a right-padded `collate` batch.
def pack_token_budget(
    sizes: Sequence[int], max_tokens_per_micro_batch: int, *, padded: bool = False
) -> list[list[int]]:
    """Indices of items of these token `sizes` grouped into micro-batches within the budget."""
    budget = max_tokens_per_micro_batch
    if budget < 1:
        raise MemrlInputError(
            f"max_tokens_per_micro_batch must be >= 1, got {budget}",
            location="max_tokens_per_micro_batch",
        )
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


def on_device(tensors: dict[str, Tensor], keys: Sequence[str], device: Any
               ) -> dict[str, Tensor]:
    """`keys` of a `collate` batch (those it has) copied to `device`, queued without
    waiting for the device: a blocking copy from the host would first wait for every
    kernel queued before it (from pageable memory, CUDA stages the bytes at once, so the
    host tensors may go after the call)."""
    return {k: tensors[k].to(device, non_blocking=True) for k in keys
            if tensors.get(k) is not None}


def response_rows(values: Tensor, response_mask: Tensor) -> list[Tensor]:
    """Each row's values at its response positions, float32 on the CPU: (B, L) `values`
    of a `collate` batch (on any device) copied to the host once, then cut by
    `response_mask` (B, L) bool."""
    values, mask = values.detach().float().cpu(), response_mask.cpu()
    return [values[row][mask[row]] for row in range(values.shape[0])]


# Alignment. A causal LM's logits at position t predict token t+1. Every per-token tensor
# here is indexed by the *logit* position t, so log-probs taken from `model(input_ids).logits`
# at t line up with the response tensors with no further shifting:
#   labels[b, t]        = input_ids[b, t+1]      (pad_id at the last real token and beyond)
#   response_mask[b, t] = labels[b, t] is a response token
# For a prompt of P tokens and a response of R tokens, response token j sits at input
# position P+j and is predicted at t = P+j-1: response_mask[b, P-1 : P+R-1] is set and
# per-token values (log-probs, advantages) of token j sit at [b, P-1+j].
def collate(
    conversations: Sequence[Conversation], pad_id: int, **per_conversation: Sequence[Tensor]
) -> dict[str, Tensor]:
    """Right-padded (batch, seq) tensors for a forward pass and the loss.

    Keys: input_ids, attention_mask, position_ids, labels (long, (B, L)); response_mask,
    loss_mask (bool, (B, L); loss_mask = response_mask of trainable conversations);
    rollout_logprobs (float32, (B, L), 0 off the response); traj_index, num_loss_tokens
    (long, (B,)); and every keyword given, each a per-conversation (R,) tensor, placed like
    rollout_logprobs.
    """
    if not conversations:
        raise ValueError("collate needs at least one conversation")
    bsz, seq = len(conversations), max(s.num_tokens for s in conversations)
    input_ids = torch.full((bsz, seq), pad_id, dtype=torch.long)
    labels = torch.full((bsz, seq), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((bsz, seq), dtype=torch.long)
    response_mask = torch.zeros((bsz, seq), dtype=torch.bool)
    extra = {"rollout_logprobs": [torch.tensor(s.rollout_logprobs) for s in conversations]}
    extra.update({k: list(v) for k, v in per_conversation.items()})
    placed = {k: torch.zeros((bsz, seq), dtype=torch.float32) for k in extra}
    for b, s in enumerate(conversations):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        input_ids[b, : p + r] = ids
        labels[b, : p + r - 1] = ids[1:]
        attention_mask[b, : p + r] = 1
        response_mask[b, p - 1 : p + r - 1] = True
        for k, rows in extra.items():
            placed[k][b, p - 1 : p + r - 1] = rows[b].to(torch.float32)
    trainable = torch.tensor([s.trainable for s in conversations], dtype=torch.bool)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        # As verl's compute_position_id_with_mask: 0..n-1, then n-1 repeated over the padding.
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "labels": labels,
        "response_mask": response_mask,
        "loss_mask": response_mask & trainable.unsqueeze(-1),
        **placed,
        "traj_index": torch.tensor([s.traj_index for s in conversations], dtype=torch.long),
        "num_loss_tokens": torch.tensor([s.num_loss_tokens for s in conversations],
                                        dtype=torch.long),
    }

