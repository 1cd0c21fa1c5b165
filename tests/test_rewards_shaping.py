from hypothesis import given
from hypothesis import strategies as st

from memrl.rewards.shaping import context_overlap_reward


def test_hand_computed():
    assert context_overlap_reward([1, 2, 3, 4], {2, 4, 9}) == 0.5
    assert context_overlap_reward([7, 7, 7], {7}) == 1.0
    assert context_overlap_reward([], {1}) == 0.0
    assert context_overlap_reward([5], set()) == 0.0


@given(st.lists(st.integers(0, 50)), st.sets(st.integers(0, 50)))
def test_in_unit_interval(response, context):
    r = context_overlap_reward(response, context)
    assert 0.0 <= r <= 1.0
    assert (r == 1.0) == (bool(response) and set(response) <= context)
