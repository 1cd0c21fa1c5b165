"""The typed batch, packing and collation: hand-built alignment and never-drop properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.errors import MemrlInputError
from memrl.rl.maths.batch import Conversation, RolloutBatch, collate, pack_token_budget
from memrl.rl.maths.losses import LOSS_AGG_MODES, logprobs_from_logits, policy_loss
from memrl.trajectory import Trajectory, Turn


def turn(prompt, response, kind="memory_update", finish="stop"):
    return Turn(
        kind=kind,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-0.1 * (i + 1) for i in range(len(response))],
        response_text="x",
        finish_reason=finish,
    )


TRAJS = [
    Trajectory(
        record_id="q1",
        turns=[
            turn([1, 2], [3, 4]),
            turn([5], [6, 7, 8], finish="length"),
            turn([9, 10, 11], [12], kind="final"),
        ],
        reward=1.0,
    ),
    Trajectory(record_id="q1", sample_index=1, turns=[turn([1], [2], kind="final")], reward=0.0),
]


# ---------------------------------------------------------------- Conversation / RolloutBatch

def test_sample_checks_and_sizes():
    s = Conversation([1, 2], [3, 4, 5], [-1.0, -1.0, -1.0], 0, "q", 0, "final")
    assert s.num_tokens == 5
    assert s.num_loss_tokens == 3
    assert Conversation([1], [3], [-1.0], 0, "q", 0, "f", trainable=False).num_loss_tokens == 0
    with pytest.raises(ValueError):
        Conversation([1], [3, 4], [-1.0], 0, "q", 0, "final")
    with pytest.raises(ValueError):
        Conversation([], [3], [-1.0], 0, "q", 0, "final")


def test_one_sample_per_turn_and_one_reward_per_trajectory():
    batch = RolloutBatch.from_trajectories(TRAJS)
    assert [(s.traj_index, s.turn_index, s.turn_kind) for s in batch.conversations] == [
        (0, 0, "memory_update"), (0, 1, "memory_update"), (0, 2, "final"), (1, 0, "final")
    ]
    assert [s.group_id for s in batch.conversations] == ["q1"] * 4
    second = batch.conversations[1]
    assert second.prompt_ids == [5] and second.response_ids == [6, 7, 8]
    assert batch.conversations[1].rollout_logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert [s.truncated for s in batch.conversations] == [False, True, False, False]
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.group_ids == ("q1", "q1")
    assert batch.response_tokens.tolist() == [6, 1]  # all turns of each trajectory
    assert batch.old_logprobs is None and batch.advantages is None


def test_the_batch_is_frozen_and_each_step_makes_a_new_version():
    batch = RolloutBatch.from_trajectories(TRAJS)
    with pytest.raises(AttributeError):
        batch.advantages = torch.zeros(2)  # nobody patches a batch
    old = [torch.tensor(s.rollout_logprobs) for s in batch.conversations]
    with_lp = batch.with_logprobs(old)
    done = with_lp.with_advantages(torch.tensor([0.5, -0.5]))
    assert batch.old_logprobs is None and with_lp.advantages is None
    assert done.old_logprobs is not None and done.advantages.tolist() == [0.5, -0.5]
    with pytest.raises(ValueError, match="log-prob rows"):
        batch.with_logprobs(old[:2])
    with pytest.raises(ValueError, match="shape"):
        batch.with_logprobs([torch.zeros(1)] * 4)
    with pytest.raises(ValueError, match="finite"):
        batch.with_advantages(torch.tensor([0.5, math.nan]))


def test_overlong_mask_vs_keep():
    masked = RolloutBatch.from_trajectories(TRAJS).conversations
    assert [s.trainable for s in masked] == [True, False, True, True]
    assert [s.num_loss_tokens for s in masked] == [2, 0, 1, 1]
    kept = RolloutBatch.from_trajectories(TRAJS, overlong="keep").conversations
    assert [s.trainable for s in kept] == [True] * 4
    assert len(masked) == len(kept) == 4  # masking never drops a conversation


def test_from_trajectories_errors():
    with pytest.raises(MemrlInputError):
        RolloutBatch.from_trajectories(TRAJS, overlong="drop")
    with pytest.raises(ValueError, match="no reward"):
        RolloutBatch.from_trajectories([Trajectory("q", turns=[turn([1], [2])])])
    with pytest.raises(ValueError, match="finite"):
        RolloutBatch.from_trajectories([Trajectory("q", turns=[turn([1], [2])], reward=math.inf)])


def test_mini_batches_take_whole_groups_in_order():
    trajs = [Trajectory(g, i, [turn([1], [2]), turn([1], [3])], reward=0.0)
             for g, i in (("a", 0), ("b", 0), ("a", 1), ("c", 0))]
    batch = RolloutBatch.from_trajectories(trajs)
    assert batch.mini_batches(2) == [[0, 1, 2, 3, 4, 5], [6, 7]]
    assert batch.mini_batches(1) == [[0, 1, 4, 5], [2, 3], [6, 7]]
    assert batch.mini_batches(5) == [list(range(8))]
    with pytest.raises(ValueError):
        batch.mini_batches(0)


def test_kl_sums_over_every_turn_of_a_trajectory():
    batch = RolloutBatch.from_trajectories(TRAJS)
    old = [torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.5]),
           torch.tensor([-1.0])]
    ref = [torch.zeros(2), torch.zeros(3), torch.zeros(1), torch.zeros(1)]
    kl = batch.with_logprobs(old, ref).kl("k1")
    assert kl.tolist() == [3.5, -1.0]
    with pytest.raises(ValueError):
        batch.kl("k1")


# ---------------------------------------------------------------- packing / mini-batches

def test_pack_first_fit_decreasing_by_hand():
    samples = (5, 3, 8, 2, 12)
    # longest first: 12 alone (oversize); 8 new; 5 new; 3 joins 5; 2 joins 8
    assert pack_token_budget(samples, 10) == [[4], [2, 3], [0, 1]]
    # padded cost = rows x longest: 8+2 would cost 16, 5+3+2 would cost 15
    assert pack_token_budget(samples, 10, padded=True) == [[4], [2], [0, 1], [3]]


def test_pack_errors_and_empty():
    assert pack_token_budget([], 5) == []
    with pytest.raises(MemrlInputError):
        pack_token_budget([2], 0)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40), max_size=30),
    budget=st.integers(min_value=1, max_value=60),
    padded=st.booleans(),
)
def test_pack_never_drops_and_respects_budget(sizes, budget, padded):
    batches = pack_token_budget(sizes, budget, padded=padded)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(sizes)))  # every index exactly once
    for b in batches:
        assert b
        cost = len(b) * max(sizes[i] for i in b) if padded else sum(sizes[i] for i in b)
        assert cost <= budget or (len(b) == 1 and sizes[b[0]] > budget)
    assert pack_token_budget(sizes, budget, padded=padded) == batches  # deterministic


# ---------------------------------------------------------------- collate

A = Conversation([5, 6], [7, 8, 2], [-0.1, -0.2, -0.3], 0, "q", 0, "memory_update")
B = Conversation([11], [12], [-0.4], 1, "q", 0, "final", truncated=True, trainable=False)


def test_collate_by_hand():
    adv = [torch.full((3,), 0.5), torch.tensor([-1.0])]
    b = collate([A, B], pad_id=0, advantages=adv)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 2], [11, 12, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 1, 1, 1]]
    # logits at t predict token t+1
    assert b["labels"].tolist() == [[6, 7, 8, 2, 0], [12, 0, 0, 0, 0]]
    assert b["response_mask"].int().tolist() == [[0, 1, 1, 1, 0], [1, 0, 0, 0, 0]]
    assert b["loss_mask"].int().tolist() == [[0, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
    torch.testing.assert_close(
        b["rollout_logprobs"], torch.tensor([[0, -0.1, -0.2, -0.3, 0], [-0.4, 0, 0, 0, 0]])
    )
    torch.testing.assert_close(
        b["advantages"], torch.tensor([[0, 0.5, 0.5, 0.5, 0], [-1.0, 0, 0, 0, 0]])
    )
    assert b["traj_index"].tolist() == [0, 1]
    assert b["num_loss_tokens"].tolist() == [3, 0]
    with pytest.raises(ValueError):
        collate([], pad_id=0)


def test_collate_alignment_with_a_bigram_model():
    # A "model" whose logits at position t depend only on input token t: W[i, i+1] = ln 3,
    # else 0, over a vocabulary of 13. So p(next = i+1 | i) = 3/15 and any other token 1/15.
    vocab = 13
    w = torch.zeros(vocab, vocab)
    for i in range(vocab - 1):
        w[i, i + 1] = math.log(3.0)
    b = collate([A, B], pad_id=0)
    logits = w[b["input_ids"]]  # (B, L, V): logits[b, t] from token t
    logp = logprobs_from_logits(logits, b["labels"])
    # A's response 7, 8, 2 follows 6, 7, 8: 7|6 and 8|7 are bigrams, 2|8 is not
    got = logp[0][b["response_mask"][0]]
    torch.testing.assert_close(got, torch.tensor([math.log(0.2), math.log(0.2), math.log(1 / 15)]))
    # B's response 12 follows 11: a bigram
    torch.testing.assert_close(logp[1][b["response_mask"][1]], torch.tensor([math.log(0.2)]))


def test_loss_norm_of_a_mini_batch_by_hand():
    trajs = [
        Trajectory("g", 0, [turn([1], [2, 3, 4]), turn([1], [2], finish="length")], reward=0.0),
        Trajectory("h", 0, [turn([1], [2, 3])], reward=0.0),
    ]
    batch = RolloutBatch.from_trajectories(trajs)  # loss tokens 3, 0 (overlong), 2
    expected = {
        "token-mean": ([1, 1, 1], 5),
        "seq-mean-token-sum": ([1, 1, 1], 2),
        "seq-mean-token-mean": ([3, 1, 2], 2),
        "traj-mean-token-mean": ([3, 3, 2], 2),
    }
    for mode, (rows, divisor) in expected.items():
        norm = batch.loss_norm([0, 1, 2], mode)
        assert (norm.row_divisor.tolist(), norm.divisor) == (rows, divisor), mode
    assert batch.loss_norm([0, 1], "token-mean").divisor == 3


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_packed_micro_batches_give_the_full_batch_loss(mode):
    """The trainer's recipe: weights over the mini-batch, then any packing, same loss."""
    trajs = [
        Trajectory("q1", 0, [turn([1, 2, 3], [4, 5, 6, 7]), turn([1], [2], kind="final")],
                   reward=1.0),
        Trajectory("q1", 1, [turn([1, 2], [3, 4, 5], finish="length"), turn([9], [8, 7])],
                   reward=0.0),
        Trajectory("q2", 0, [turn([4] * 6, [5] * 5), turn([1], [3, 3, 3]), turn([2], [2])],
                   reward=0.5),
    ]
    batch = RolloutBatch.from_trajectories(trajs)
    batch = batch.with_logprobs([torch.tensor(s.rollout_logprobs) for s in batch.conversations])
    batch = batch.with_advantages(torch.tensor([1.0, -1.0, 0.25]))
    everything = list(range(len(batch.conversations)))
    g = torch.Generator().manual_seed(0)

    def forward(batch):  # fake current-policy log-probs: a fixed function of the tokens
        return -0.2 + 0.01 * (batch["input_ids"] * 7 % 11).to(torch.float32)

    kw = dict(clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode, scale_factor=5.0)
    full = batch.collate(everything, pad_id=0)
    perturb = torch.randn(full["input_ids"].shape, generator=g) * 0.3
    full_loss, _ = policy_loss(forward(full) + perturb, full["old_logprobs"], full["advantages"],
                               full["loss_mask"], traj_ids=full["traj_index"], **kw)
    norm = batch.loss_norm(everything, mode, scale_factor=5.0)
    total = 0.0
    for idx in pack_token_budget([s.num_tokens for s in batch.conversations], 12):
        mb = batch.collate(idx, pad_id=0)
        width = mb["input_ids"].shape[1]
        loss, _ = policy_loss(forward(mb) + perturb[idx, :width], mb["old_logprobs"],
                              mb["advantages"], mb["loss_mask"], norm=norm.rows(idx), **kw)
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), rel=1e-6, abs=1e-7)


def test_response_rows_cut_each_row_at_its_response_positions():
    from memrl.rl.maths.batch import response_rows

    values = torch.tensor([[0.5, 1.5, 2.5], [3.5, 4.5, 5.5]], dtype=torch.bfloat16,
                          requires_grad=True)
    mask = torch.tensor([[False, True, True], [True, False, False]])
    rows = response_rows(values, mask)
    assert [r.tolist() for r in rows] == [[1.5, 2.5], [3.5]]
    assert all(r.dtype == torch.float32 and r.device.type == "cpu" and not r.requires_grad
               for r in rows)
