"""MemAgent's training protocol: centre truncation of max_chunks, the memagent_em reward of
the memagent task, and validation top-p (hand-computed cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memrl.agents.memagent import (
    MemAgent,
    MemAgentConfig,
    center_truncate,
    chunk_context,
    split_token_ids,
)
from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.inference.base import request_params
from memrl.inference.config import ValidationSamplingConfig
from memrl.inference.scripted import ScriptedGenerator
from memrl.tasks.memagent_qa import REWARDS, MemAgentQATask

# ---------------------------------------------------------------- centre truncation


def test_center_truncate_keeps_head_and_tail_halves():
    ids = list(range(10))
    assert center_truncate(ids, 6) == [0, 1, 2, 7, 8, 9]
    assert center_truncate(ids, 8) == [0, 1, 2, 3, 6, 7, 8, 9]
    # odd budget: max_length // 2 from each end, so one token fewer (verl's rule)
    assert center_truncate(ids, 7) == [0, 1, 2, 7, 8, 9]
    assert center_truncate(ids, 3) == [0, 9]
    assert center_truncate(ids, 1) == []  # verl's ids[-0:] would keep all ten
    # at or under the budget nothing is dropped
    assert center_truncate(ids, 10) == ids and center_truncate(ids, 50) == ids
    with pytest.raises(ValueError):
        center_truncate(ids, 0)


def test_split_token_ids_center_chunks_the_truncated_sequence():
    ids = list(range(10))
    # 2 chunks of 3 = budget 6: head 0..2 and tail 7..9, the middle 3..6 dropped
    assert split_token_ids(ids, 3, 2, "center") == ([[0, 1, 2], [7, 8, 9]], True)
    # budget 9, half 4: [0,1,2,3,6,7,8,9], chunked by 3: the middle chunk straddles the cut
    assert split_token_ids(ids, 3, 3, "center") == ([[0, 1, 2], [3, 6, 7], [8, 9]], True)
    # right truncation keeps the first max_chunks chunks
    assert split_token_ids(ids, 3, 2, "right") == ([[0, 1, 2], [3, 4, 5]], True)
    # a context within the budget is chunked whole, not capped, whatever the truncation
    assert split_token_ids(ids, 5, 2, "center") == ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], False)
    assert split_token_ids(ids, 4, None, "center") == split_token_ids(ids, 4)
    with pytest.raises(ValueError, match="truncation"):
        split_token_ids(ids, 3, 2, "left")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 60), chunk=st.integers(1, 9), max_chunks=st.integers(1, 6))
def test_center_truncation_properties(n, chunk, max_chunks):
    ids = list(range(n))
    pieces, capped = split_token_ids(ids, chunk, max_chunks, "center")
    flat = [t for p in pieces for t in p]
    budget = chunk * max_chunks
    assert capped == (n > budget)
    assert len(pieces) <= max_chunks and all(1 <= len(p) <= chunk for p in pieces)
    if n <= budget:
        assert flat == ids
    else:
        half = budget // 2
        assert flat == ids[:half] + ids[n - half:]


def test_memagent_reads_the_head_and_tail_chunks(tiny_tokenizer):
    """The agent passes its truncation to the chunker: a context of 4 pieces read with
    max_chunks=2 and centre truncation sees the first and the last piece."""
    words = [f"w{i}" for i in range(40)]
    text = " ".join(words)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    size = len(ids) // 4
    cfg = MemAgentConfig(chunk_size=size, max_chunks=2, truncation="center")
    seen = []
    gen = ScriptedGenerator(tiny_tokenizer, lambda prompt: seen.append(prompt) or "m")
    MemAgent(gen, cfg).run([QARecord(id="q", question="Q?", answers=["a"], context=text)])
    chunks = chunk_context(tiny_tokenizer, text, size, 2, "center")
    assert chunks.capped and chunks.num_chunks == 2
    assert chunks.texts[0] == tiny_tokenizer.decode(ids[:size])
    assert chunks.texts[1] == tiny_tokenizer.decode(ids[len(ids) - size:])
    assert chunks.texts[0] in seen[0] and chunks.texts[1] in seen[1] and len(seen) == 3


def test_truncation_is_validated():
    with pytest.raises(ValidationError):
        MemAgentConfig(truncation="middle")


# ---------------------------------------------------------------- memagent_em reward


def scripted_task(tiny_tokenizer, final: str, reward: str):
    def respond(prompt: str) -> str:
        return final if "Your answer:" in prompt else "memory"

    gen = ScriptedGenerator(tiny_tokenizer, respond)
    task = MemAgentQATask(MemAgentConfig(chunk_size=64, max_final_tokens=400), reward=reward)
    return gen, task


@pytest.mark.parametrize(
    ("final", "memagent_em", "sub_em"),
    [
        ("so \\boxed{Chief of Protocol}", 1.0, 1.0),
        # strip_string drops every space, so the article is not ignored: 0 (sub-EM says 1)
        ("\\boxed{the Chief of Protocol}", 0.0, 1.0),
        # only the last 300 characters count: a box before them is not seen
        ("\\boxed{Chief of Protocol}" + "x" * 300, 0.0, 1.0),
        ("no box here", 0.0, 0.0),
    ],
)
def test_memagent_em_is_a_reward_of_the_memagent_task(tiny_tokenizer, final, memagent_em,
                                                      sub_em):
    assert "memagent_em" in REWARDS
    gen, task = scripted_task(tiny_tokenizer, final, "memagent_em")
    record = QARecord(id="q", question="Who?", answers=["Chief of Protocol"], context="ctx")
    (t,) = task.rollout(gen, [record], num_samples=1, seed=0)
    assert t.details.final_response == final
    assert t.reward == memagent_em and t.metrics["memagent_em"] == memagent_em
    assert t.metrics["sub_em"] == sub_em


def test_memagent_em_is_best_over_ground_truths(tiny_tokenizer):
    gen, task = scripted_task(tiny_tokenizer, "\\boxed{NYC}", "memagent_em")
    record = QARecord(id="q", question="Where?", answers=["New York", "nyc"], context="ctx")
    (t,) = task.rollout(gen, [record], num_samples=1, seed=0)
    assert t.reward == 1.0


def test_unknown_reward_is_one_line_error():
    with pytest.raises(MemrlInputError, match="memagent_em"):
        MemAgentQATask(MemAgentConfig(), reward="memagent-em")


# ---------------------------------------------------------------- validation top-p


class Recording(ScriptedGenerator):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda prompt: "\\boxed{a}")
        self.params = []

    def generate(self, prompts, params):
        self.params += request_params(prompts, params)
        return super().generate(prompts, params)


def test_rollout_top_p_overrides_the_agent_config(tiny_tokenizer):
    task = MemAgentQATask(MemAgentConfig(chunk_size=64, top_p=1.0, temperature=1.0))
    record = QARecord(id="q", question="Q?", answers=["a"], context="some context")
    gen = Recording(tiny_tokenizer)
    task.rollout(gen, [record], num_samples=1, seed=0, temperature=1.0, top_p=0.7)
    assert {(p.temperature, p.top_p) for p in gen.params} == {(1.0, 0.7)}
    gen = Recording(tiny_tokenizer)
    task.rollout(gen, [record], num_samples=1, seed=0)
    assert {p.top_p for p in gen.params} == {1.0}


def test_val_top_p_is_checked():
    assert ValidationSamplingConfig().top_p is None
    assert ValidationSamplingConfig(top_p=0.7).top_p == 0.7
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError):
            ValidationSamplingConfig(top_p=bad)


def test_validation_samples_with_val_top_p(tiny_model_dir, tmp_path):
    """The recipe's validation passes rollout.val.n / temperature / top_p to the task."""
    from memrl.config import load_config
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.synthetic import make_synthetic_records
    from memrl.recipes import grpo
    from memrl.recipes.config import TrainConfig

    save_records_jsonl(make_synthetic_records(2, num_docs=2, seed=0), tmp_path / "t.jsonl")
    cfg = load_config(TrainConfig, None, [
        f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 't.jsonl'}",
        f"data.val_file={tmp_path / 't.jsonl'}", "data.train_batch_size=1",
        "rl.ppo_mini_batch_size=1", f"trainer.out_dir={tmp_path / 'run'}",
        "trainer.log_sinks=[jsonl]", "memagent.chunk_size=48", "memagent.max_chunks=1",
        "memagent.max_memory_tokens=2", "memagent.max_final_tokens=2",
        "rollout.top_p=1.0", "rollout.val.n=2", "rollout.val.temperature=1.0",
        "rollout.val.top_p=0.7",
    ])
    seen = []

    class Spy(MemAgentQATask):
        def rollout(self, engine, records, spec):
            seen.append({k: getattr(spec, k) for k in ("num_samples", "temperature", "top_p")})
            return super().rollout(engine, records, spec)

    run = grpo.setup(cfg, task=Spy(cfg.memagent))
    metrics = grpo.validate(run)
    assert seen == [{"num_samples": 2, "temperature": 1.0, "top_p": 0.7}]
    assert "val/score" in metrics
