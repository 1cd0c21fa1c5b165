"""Dense shaped rewards for smoke tests and demos on tiny random models.

A random tiny model never writes `\\boxed{answer}`, so an answer reward is 0 for every sample,
every GRPO group has equal rewards, and nothing is learned. The share of answer tokens that
occur in the document is reachable from the first step and still depends on what the agent
read, so it shows the whole RL loop (rollouts, advantages, updates) working end to end.
It is not a measure of answer quality: use em / f1 / sub_em for real runs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def context_overlap_reward(response_ids: Sequence[int], context_ids: Collection[int]) -> float:
    """Fraction of response tokens that occur in the context (0.0 for an empty response)."""
    if not response_ids:
        return 0.0
    return sum(1 for t in response_ids if t in context_ids) / len(response_ids)
