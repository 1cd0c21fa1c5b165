"""HFEngine on the tiny model: batching, logprobs, stopping, seeding, module state."""

from __future__ import annotations

import pytest
import torch

from memrl.errors import MemrlInputError
from memrl.inference import (
    Engine,
    Generator,
    HFEngine,
    SamplingParams,
    load_model,
    load_pretrained,
)
from memrl.inference.hf import first_stop_end, top_p_filter

QUESTIONS = [
    "hi",
    "Who was born there?",
    "What is the capital of the country where he was born?",
    "Document 1: Paris is the capital of France. Document 2: Rome is in Italy. Which city?",
    "Answer in \\boxed{}: Is it yes or no?",
]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    m.eval()
    return m


@pytest.fixture(scope="module")
def generator(model, tiny_tokenizer) -> HFEngine:
    return HFEngine(model, tiny_tokenizer, generation_batch_size=8)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer) -> list[list[int]]:
    """Chat prompts of different lengths, rendered as text then encoded (transformers 5 way)."""
    out = []
    for q in QUESTIONS:
        text = tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        out.append(tiny_tokenizer.encode(text, add_special_tokens=False))
    assert len({len(p) for p in out}) == len(out), "prompts must differ in length"
    return out


def _teacher_forced_logprobs(model, prompt, response, temperature: float) -> torch.Tensor:
    """log p(response tokens) from one unpadded forward pass, as the RL loss recomputes them."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
# Padding changes matmul shapes and so float summation order: logprobs of the same tokens
# agree to ~1e-5 across batch layouts on CPU BLAS, not bit for bit.
LAYOUT_ATOL = 1e-4


def test_implements_generator_protocol(generator) -> None:
    assert isinstance(generator, Generator)
    assert generator.eos_token_ids == {generator.tokenizer.eos_token_id}
    assert generator.generate([], GREEDY) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generator.generate([[1, 2], []], GREEDY)


def test_greedy_is_deterministic(generator, prompts) -> None:
    a = generator.generate(prompts, GREEDY)
    b = generator.generate(prompts, GREEDY)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    # the tiny model's greedy output depends on the prompt, so the tests below see something
    assert len({tuple(g.token_ids) for g in a}) > 1


def test_batched_left_padded_equals_one_by_one(model, tiny_tokenizer, prompts) -> None:
    one_by_one = HFEngine(model, tiny_tokenizer, generation_batch_size=1)
    # generation_batch_size=2 splits 5 prompts into 3 sorted micro-batches: order must survive it
    for batch_size in (2, 8):
        batched = HFEngine(model, tiny_tokenizer, generation_batch_size=batch_size)
        got = batched.generate(prompts, GREEDY)
        want = [one_by_one.generate([p], GREEDY)[0] for p in prompts]
        for g, w in zip(got, want, strict=True):
            assert g.token_ids == w.token_ids
            assert g.text == w.text
            assert g.finish_reason == w.finish_reason
            torch.testing.assert_close(g.logprobs, w.logprobs, atol=LAYOUT_ATOL, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        GREEDY,
        SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=3),
        SamplingParams(max_new_tokens=16, temperature=1.3, seed=4),
    ],
    ids=["greedy", "t0.7-top_p0.9", "t1.3"],
)
def test_logprobs_match_teacher_forcing(generator, model, prompts, params) -> None:
    for prompt, gen in zip(prompts, generator.generate(prompts, params), strict=True):
        assert len(gen.logprobs) == len(gen.token_ids) > 0
        recomputed = _teacher_forced_logprobs(model, prompt, gen.token_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), recomputed, atol=1e-4, rtol=0)


def test_max_new_tokens_gives_length(generator, prompts) -> None:
    for gen in generator.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0)):
        assert len(gen.token_ids) == 5
        assert gen.finish_reason == "length"
        assert gen.text == generator.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def test_stop_string_cuts_generation(generator, prompts) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=11)
    [full] = generator.generate([prompts[1]], params)
    clean = [i for i in range(len(full.text) - 2) if "\ufffd" not in full.text[i : i + 3]]
    assert clean, f"no clean 3-character window in {full.text!r}"
    stop = full.text[clean[len(clean) // 2] : clean[len(clean) // 2] + 3]
    expected_text = full.text[: full.text.find(stop) + len(stop)]

    [cut] = generator.generate([prompts[1]], SamplingParams(
        max_new_tokens=40, temperature=1.0, seed=11, stop=("never appears", stop)
    ))
    assert cut.finish_reason == "stop"
    assert cut.text == expected_text
    assert len(cut.token_ids) < len(full.token_ids)
    # same seed, same draws: the stopped generation is a prefix of the free one, ending
    # at the first token whose text completes the stop string
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert cut.logprobs == full.logprobs[: len(cut.token_ids)]
    decode = generator.tokenizer.decode
    assert stop in decode(cut.token_ids, skip_special_tokens=True)
    assert stop not in decode(cut.token_ids[:-1], skip_special_tokens=True)


class _ForceEOS:
    """Forward hook on lm_head: make row `row` emit EOS at decode step `step`."""

    def __init__(self, eos: int, row: int, step: int) -> None:
        self.eos, self.row, self.step, self.calls = eos, row, step, 0

    def __call__(self, module, inputs, output):
        if self.calls == self.step:
            output = output.clone()
            output[self.row, -1, self.eos] += 1e4
        self.calls += 1
        return output


def test_eos_stops_one_row_and_is_kept_in_ids(model, tiny_tokenizer, prompts) -> None:
    generator = HFEngine(model, tiny_tokenizer, generation_batch_size=8)
    eos = tiny_tokenizer.eos_token_id
    pair = [prompts[3], prompts[1]]  # longest first: rows keep their input order
    params = SamplingParams(max_new_tokens=10, temperature=0)
    free = generator.generate(pair, params)
    handle = model.lm_head.register_forward_hook(_ForceEOS(eos, row=0, step=3))
    try:
        forced = generator.generate(pair, params)
    finally:
        handle.remove()
    stopped, other = forced
    assert stopped.token_ids == free[0].token_ids[:3] + [eos]
    assert stopped.finish_reason == "stop"
    assert len(stopped.logprobs) == 4
    assert "<|im_end|>" not in stopped.text
    assert stopped.text == tiny_tokenizer.decode(free[0].token_ids[:3])
    # the row that went on is unaffected by its finished neighbour
    assert other.token_ids == free[1].token_ids
    assert other.finish_reason == "length"
    torch.testing.assert_close(other.logprobs, free[1].logprobs, atol=LAYOUT_ATOL, rtol=0)


def test_ignore_eos_decodes_past_eos_to_max_new_tokens(model, tiny_tokenizer, prompts) -> None:
    generator = HFEngine(model, tiny_tokenizer, generation_batch_size=8)
    eos = tiny_tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=10, temperature=0, ignore_eos=True)
    handle = model.lm_head.register_forward_hook(_ForceEOS(eos, row=0, step=3))
    try:
        [gen] = generator.generate([prompts[3]], params)
    finally:
        handle.remove()
    assert len(gen.token_ids) == 10 and gen.finish_reason == "length"
    assert gen.token_ids[3] == eos  # EOS sampled, kept, and decoding went on
    assert "<|im_end|>" not in gen.text
    assert max((_teacher_forced_logprobs(model, prompts[3], gen.token_ids, 0)
                - torch.tensor(gen.logprobs))[4:].abs()) < LAYOUT_ATOL


def test_seed_reproducibility(generator, prompts) -> None:
    rng_before = torch.get_rng_state()
    p = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=123)
    a = generator.generate(prompts, p)
    b = generator.generate(prompts, p)
    c = generator.generate(prompts, SamplingParams(max_new_tokens=20, temperature=1.0,
                                                   top_p=0.95, seed=124))
    assert torch.equal(torch.get_rng_state(), rng_before), "a seeded call leaves global RNG"
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_tiny_top_p_is_greedy(generator, prompts) -> None:
    greedy = generator.generate(prompts, GREEDY)
    nucleus = generator.generate(
        prompts, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=0)
    )
    for g, n in zip(greedy, nucleus, strict=True):
        assert n.token_ids == g.token_ids
        # temperature 1 logprobs are the raw-logit logprobs greedy reports
        torch.testing.assert_close(n.logprobs, g.logprobs, atol=LAYOUT_ATOL, rtol=0)


def test_restores_module_mode(model, tiny_tokenizer, prompts) -> None:
    generator = HFEngine(model, tiny_tokenizer)
    seen: list[bool] = []
    handle = model.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    try:
        model.train()
        generator.generate(prompts[:2], SamplingParams(max_new_tokens=3, temperature=0))
        assert model.training
        assert seen and not any(seen), "generation runs in eval mode"
        model.eval()
        generator.generate(prompts[:2], SamplingParams(max_new_tokens=3, temperature=0))
        assert not model.training
    finally:
        handle.remove()
        model.eval()
    assert all(p.grad is None for p in model.parameters())


def test_loader_on_cpu(tiny_model_dir) -> None:
    model, tokenizer = load_pretrained(tiny_model_dir)
    generator = HFEngine(model, tokenizer, generation_batch_size=4)
    if not torch.cuda.is_available():
        assert generator.device.type == "cpu"
        # auto: float32 on a CPU, whatever its instructions (evaluations do not depend on it)
        assert next(generator.model.parameters()).dtype == torch.float32
    assert not generator.model.training
    assert generator.generation_batch_size == 4
    ids = generator.tokenizer.encode("hello", add_special_tokens=False)
    [gen] = generator.generate([ids], SamplingParams(max_new_tokens=2, temperature=0))
    assert len(gen.token_ids) == 2


def test_loader_bad_path_and_dtype_are_user_errors(tmp_path) -> None:
    with pytest.raises(MemrlInputError) as info:
        load_pretrained(tmp_path / "missing")
    assert str(tmp_path / "missing") in str(info.value)
    with pytest.raises(MemrlInputError, match="unknown torch dtype"):
        load_model(tmp_path, dtype="float13")
    with pytest.raises(MemrlInputError, match="unknown device"):
        load_model(tmp_path, device="gpu:7")


def test_engine_seam_of_the_in_process_engine(tiny_model_dir) -> None:
    """The HF engine samples from the module it wraps: syncing that module is nothing,
    syncing another copies its weights in; sleep/wake no-ops, and one async request equals
    the batched call."""
    import asyncio

    import torch

    model, tokenizer = load_pretrained(tiny_model_dir)
    engine = HFEngine(model, tokenizer)
    assert isinstance(engine, Engine)
    engine.sync_weights(model, step=3)
    assert engine.model is model
    other, _ = load_pretrained(tiny_model_dir)
    with torch.no_grad():
        other.model.norm.weight.add_(0.5)
    engine.sync_weights(other, step=3)
    assert torch.equal(model.model.norm.weight, other.model.norm.weight)
    with pytest.raises(ValueError, match="weights differ"):
        engine.sync_weights(torch.nn.Linear(2, 2), step=3)
    engine.sleep()
    engine.wake()
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=7)
    single = asyncio.run(engine.agenerate(ids, params))
    [batched] = engine.generate([ids], params)
    assert single.token_ids == batched.token_ids and single.logprobs == batched.logprobs


def test_top_p_filter_hand_computed() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    # sorted 0.5, 0.3, 0.15, 0.05; mass above each: 0, 0.5, 0.8, 0.95
    torch.testing.assert_close(top_p_filter(probs, 0.8), torch.tensor([[0.0, 0.5, 0.0, 0.3]]))
    torch.testing.assert_close(
        top_p_filter(probs, 0.81), torch.tensor([[0.0, 0.5, 0.15, 0.3]])
    )
    torch.testing.assert_close(top_p_filter(probs, 1e-9), torch.tensor([[0.0, 0.5, 0.0, 0.0]]))


def test_first_stop_end() -> None:
    assert first_stop_end("abc</m>def</m>", ["</m>"]) == 7
    assert first_stop_end("xx END yy STOP", ["STOP", "END"]) == 6
    assert first_stop_end("nothing", ["STOP"]) is None
    assert first_stop_end("text", []) is None


def test_generation_uses_the_current_cache_api(generator, prompts, caplog) -> None:
    """transformers 5.24 renamed the KV cache (`cache`; `past_key_values` warns on every call
    and goes in 5.40): generation passes it under the name the model takes, warning-free."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    try:
        with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
            warnings.simplefilter("error")
            out = generator.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0))
    finally:
        hf_logging.disable_propagation()
    assert [len(g.token_ids) for g in out] and all(g.token_ids for g in out)
    assert not [r for r in caplog.records if "cache" in r.getMessage()], caplog.records
