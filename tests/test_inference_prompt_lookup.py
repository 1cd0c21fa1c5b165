"""Prompt-lookup decoding on the in-process engine (`HFEngine(prompt_lookup_tokens=K)`): greedy
single-prompt generation drafts tokens from the prompt and checks them in one forward pass;
it must give what one-token-at-a-time decoding gives (tokens, text, finish reason; logprobs to
float rounding), whatever the drafts, EOS, stop strings and max_new_tokens do."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.inference import HFEngine, SamplingParams
from memrl.inference.hf import lookup_draft

ATOL = 1e-4  # a K-token forward sums in another order than a one-token one
WORDS = "the cat sat on a mat by the river in the city where she was born".split()


def test_lookup_draft_hand_computed() -> None:
    # the last 3 tokens (2 3 4) occurred at 1..3: what followed them, at most 2 tokens
    assert lookup_draft([1, 2, 3, 4, 9, 8, 2, 3, 4], 2) == [9, 8]
    # the latest earlier occurrence wins over an earlier one
    assert lookup_draft([5, 7, 1, 5, 6, 6, 5], 3) == [6, 6, 5]
    # no 3-gram or 2-gram recurs: the last token alone (7 at 1, followed by 8 9 3 7),
    # and past the end the copy copies itself (8 ...)
    assert lookup_draft([1, 7, 8, 9, 3, 7], 6) == [8, 9, 3, 7, 8, 9]
    assert lookup_draft([4, 4], 3) == [4, 4, 4]
    # nothing recurs: none
    assert lookup_draft([1, 2, 3], 4) == []
    assert lookup_draft([1], 4) == []
    assert lookup_draft([1, 2, 1, 2], 0) == []


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def copying_model(tiny_model_dir):
    """The tiny model without attention output: each token's logits depend on that token
    alone, so greedy decoding falls into a cycle that the drafts predict: long drafts,
    accepted."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return m


class Forwards:
    """Counts a model's forward passes (a forward hook)."""

    def __init__(self, model) -> None:
        self.count = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, module, inputs, output) -> None:
        self.count += 1


def both(model, tokenizer, prompt, params, k=8, eos=None):
    """(plain generation, lookup generation, forward passes of each)."""
    engines = [HFEngine(model, tokenizer), HFEngine(model, tokenizer, prompt_lookup_tokens=k)]
    out = []
    for engine in engines:
        if eos is not None:
            engine.eos_token_ids = frozenset(eos)
        counter = Forwards(model)
        try:
            [gen] = engine.generate([prompt], params)
        finally:
            counter.handle.remove()
        out.append((gen, counter.count))
    (plain, n_plain), (lookup, n_lookup) = out
    return plain, lookup, n_plain, n_lookup


def assert_same(plain, lookup) -> None:
    assert lookup.token_ids == plain.token_ids
    assert lookup.text == plain.text
    assert lookup.finish_reason == plain.finish_reason
    torch.testing.assert_close(lookup.logprobs, plain.logprobs, atol=ATOL, rtol=0)


def prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    """Random word sequences, some repeated several times (drafts found in the prompt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 25))]
        out.append(tokenizer.encode(" ".join(words * rng.randint(1, 4))))
    return out


def test_same_greedy_output_as_plain_decoding(model, tiny_tokenizer) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=0)
    saved = 0
    for prompt in prompts(tiny_tokenizer, 24, seed=0):
        plain, lookup, n_plain, n_lookup = both(model, tiny_tokenizer, prompt, params)
        assert_same(plain, lookup)
        assert n_lookup <= n_plain
        saved += n_plain - n_lookup
    assert saved > 0  # some drafts of the random model were accepted, most rejected (cropped)


def test_long_accepted_drafts_and_drafts_past_max_new_tokens(copying_model,
                                                             tiny_tokenizer) -> None:
    for max_new in (1, 2, 7, 13, 120):
        params = SamplingParams(max_new_tokens=max_new, temperature=0)
        passes = [0, 0]
        for prompt in prompts(tiny_tokenizer, 4, seed=max_new):
            plain, lookup, n_plain, n_lookup = both(copying_model, tiny_tokenizer, prompt, params)
            assert_same(plain, lookup)
            assert len(lookup.token_ids) == max_new and lookup.finish_reason == "length"
            passes = [passes[0] + n_plain, passes[1] + n_lookup]
        if max_new == 120:
            assert passes[1] < passes[0] / 2  # the cycle is drafted and accepted


def cycling_prompt(copying_model, tokenizer, seed: int) -> tuple[list[int], SamplingParams]:
    """A prompt that ends with the copying model's own cycle (its greedy reply appended), and
    50-token greedy params: the reply goes on with the cycle, which the prompt drafts."""
    params = SamplingParams(max_new_tokens=50, temperature=0)
    prompt = prompts(tokenizer, 1, seed=seed)[0]
    [reply] = HFEngine(copying_model, tokenizer).generate([prompt], params)
    return prompt + reply.token_ids, params


def test_eos_inside_an_accepted_draft(copying_model, tiny_tokenizer) -> None:
    prompt, params = cycling_prompt(copying_model, tiny_tokenizer, seed=3)
    free, _, _, _ = both(copying_model, tiny_tokenizer, prompt, params)
    eos = free.token_ids[4]  # the cycle goes on from the prompt: drafted from the start
    plain, lookup, _, n_lookup = both(copying_model, tiny_tokenizer, prompt, params, eos=[eos])
    assert_same(plain, lookup)
    assert plain.finish_reason == "stop" and plain.token_ids[-1] == eos
    assert n_lookup < len(lookup.token_ids)
    ignoring = SamplingParams(max_new_tokens=50, temperature=0, ignore_eos=True)
    plain, lookup, _, _ = both(copying_model, tiny_tokenizer, prompt, ignoring, eos=[eos])
    assert_same(plain, lookup)
    assert len(lookup.token_ids) == 50


def test_stop_string_inside_a_draft(copying_model, tiny_tokenizer) -> None:
    prompt, params = cycling_prompt(copying_model, tiny_tokenizer, seed=5)
    free, _, _, _ = both(copying_model, tiny_tokenizer, prompt, params)
    stop = tiny_tokenizer.decode(free.token_ids[3:5])
    assert stop.strip() and "\ufffd" not in stop
    stopping = SamplingParams(max_new_tokens=50, temperature=0, stop=("never there", stop))
    plain, lookup, _, n_lookup = both(copying_model, tiny_tokenizer, prompt, stopping)
    assert_same(plain, lookup)
    assert plain.finish_reason == "stop" and plain.text.endswith(stop)
    assert len(plain.token_ids) < 50 and n_lookup < len(lookup.token_ids)


def test_batches_and_sampling_keep_the_plain_loop(model, tiny_tokenizer) -> None:
    pair = prompts(tiny_tokenizer, 2, seed=9)
    lookup = HFEngine(model, tiny_tokenizer, prompt_lookup_tokens=8)
    plain = HFEngine(model, tiny_tokenizer)
    for params in (SamplingParams(max_new_tokens=20, temperature=0),
                   SamplingParams(max_new_tokens=20, temperature=0.8, seed=1)):
        batch = pair if params.temperature == 0 else pair[:1]
        assert ([g.token_ids for g in lookup.generate(batch, params)]
                == [g.token_ids for g in plain.generate(batch, params)])
    with pytest.raises(ValueError, match="prompt_lookup_tokens must be >= 0"):
        HFEngine(model, tiny_tokenizer, prompt_lookup_tokens=-1)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(3, 120), min_size=1, max_size=60),
       repeat=st.integers(1, 3), max_new=st.integers(1, 30), k=st.integers(1, 10),
       copying=st.booleans())
def test_property_lookup_equals_plain(model, copying_model, tiny_tokenizer, ids, repeat,
                                      max_new, k, copying) -> None:
    params = SamplingParams(max_new_tokens=max_new, temperature=0)
    chosen = copying_model if copying else model
    plain, lookup, n_plain, n_lookup = both(chosen, tiny_tokenizer, ids * repeat, params, k=k)
    assert_same(plain, lookup)
    assert n_lookup <= n_plain
