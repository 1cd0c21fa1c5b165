"""OpenAIEngine: request bodies and answers (everywhere), and a real vLLM OpenAI-compatible
server started on 127.0.0.1 (where vLLM is installed): one server listed twice plus a dead
URL, evaluation completes with every episode scored; killing a server mid-rollout loses no
request."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from helpers import free_port, needs_vllm, start_vllm_server, stop_process
from hypothesis import given
from hypothesis import strategies as st

from memrl.cli import main as cli_main
from memrl.errors import MemrlInputError
from memrl.inference import SamplingParams, encode_chat
from memrl.inference.config import OpenAIConfig
from memrl.inference.openai import (
    OpenAIEngine,
    PoolLostError,
    ServerError,
    save_policy_weights,
    token_id,
    wait_until_ready,
)


def test_body_and_answer_follow_the_hf_conventions(tiny_tokenizer):
    gen = OpenAIEngine(OpenAIConfig(base_urls=["http://127.0.0.1:1"], model="m"),
                          tiny_tokenizer)
    body = gen.request_body([1, 2], SamplingParams(max_new_tokens=5, temperature=0.7, seed=9,
                                                   stop=("x",)))
    assert body["prompt"] == [1, 2] and body["seed"] == 9  # the request's own seed
    assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True
    assert body["stop"] == ["x"] and body["include_stop_str_in_output"] is True
    assert "ignore_eos" not in body
    assert gen.request_body([1], SamplingParams(ignore_eos=True))["ignore_eos"] is True
    eos = tiny_tokenizer.eos_token_id
    hello = tiny_tokenizer.encode(" the city", add_special_tokens=False)
    answer = {"choices": [{"finish_reason": "stop", "logprobs": {
        "tokens": [f"token_id:{t}" for t in [*hello, eos]],
        "token_logprobs": [-0.5] * (len(hello) + 1)}}]}
    g = gen.to_generation(answer, SamplingParams(stop=("the",)))
    assert g.token_ids == [*hello, eos] and g.logprobs == [-0.5] * (len(hello) + 1)
    assert g.text == " the" and g.finish_reason == "stop"
    with pytest.raises(ServerError, match="no token ids"):
        gen.to_generation({"choices": [{"finish_reason": "stop", "logprobs": {
            "tokens": ["a"], "token_logprobs": [0.0]}}]}, SamplingParams())


@given(st.lists(st.one_of(st.text(max_size=12), st.integers(), st.none()), max_size=5))
def test_token_id_parser_takes_only_token_id_strings(tokens):
    for t in tokens:
        got = token_id(t)
        assert got is None or (isinstance(t, str) and int(t.split(":", 1)[1]) == got >= 0)
    assert token_id("token_id:42") == 42 and token_id("token_id:") is None
    assert token_id("token_id:-1") is None and token_id("token_id:٣") is None


def test_no_server_up_fails_and_bad_urls_are_user_errors(tiny_tokenizer):
    port = free_port()  # nothing listens there
    gen = OpenAIEngine(OpenAIConfig(base_urls=[f"http://127.0.0.1:{port}"], model="m",
                                       max_retries=2), tiny_tokenizer, notify=lambda _: None)
    with pytest.raises(PoolLostError, match=f"127.0.0.1:{port}: connection refused"):
        gen.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert gen.stats()[f"http://127.0.0.1:{port}"]["down"] is True
    with pytest.raises(MemrlInputError, match="http://"):
        OpenAIEngine(OpenAIConfig(base_urls=["127.0.0.1:8000"]), tiny_tokenizer)
    with pytest.raises(MemrlInputError, match="weights_dir"):
        gen.sync_weights(object(), 1)


def test_saved_weights_hold_every_parameter_and_the_tied_lm_head(tiny_model_dir, tmp_path):
    """The servers reload from this file: a tied model's lm_head.weight (which
    save_pretrained leaves out) must be in it, or a server's output layer stays stale."""
    from safetensors.torch import load_file

    from memrl.inference import load_model

    policy = load_model(tiny_model_dir, device="cpu", dtype="float32")
    assert policy.config.tie_word_embeddings
    save_policy_weights(policy, tmp_path / "step")
    saved = load_file(str(tmp_path / "step" / "model.safetensors"))
    assert set(saved) == {n for n, _ in policy.named_parameters()} | {"lm_head.weight"}
    assert saved["lm_head.weight"].equal(policy.get_input_embeddings().weight.detach())


def test_engine_options_are_one_line_cli_errors(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text("[]")
    base = ["eval", f"model.path={tiny_model_dir}", f"eval.benchmarks=[ruler-hqa={data}]",
            "eval.num_docs=[2]", f"eval.out_dir={tmp_path / 'run'}", "eval.progress=false"]
    assert cli_main([*base, "rollout.engine=bogus"]) == 2
    assert "rollout.engine" in capsys.readouterr().err
    assert cli_main([*base, "rollout.engine=openai"]) == 2
    assert "rollout.engine openai needs rollout.openai.base_urls" in capsys.readouterr().err
    assert cli_main([*base, "rollout.engine=openai", "rollout.openai.timeout_s=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rollout.openai.timeout_s" in err


# One xdist worker runs every test of the module's server (scripts/test.sh: --dist loadgroup).
server_group = pytest.mark.xdist_group("vllm_server")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_vllm_server(tiny_model_dir, port, log)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", timeout_s=180)
    except ServerError:
        proc.kill()
        pytest.fail("vLLM server did not start:\n" + log.read_text()[-3000:])
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@needs_vllm
@server_group
@pytest.mark.slow
def test_server_logprobs_equal_the_hf_engine(server, tiny_model_dir, tiny_tokenizer):
    from memrl.inference import HFEngine, load_model

    gen = OpenAIEngine(OpenAIConfig(base_urls=[server]), tiny_tokenizer)
    hf = HFEngine(load_model(tiny_model_dir, device="cpu", dtype="float32"), tiny_tokenizer)
    prompts = [encode_chat(tiny_tokenizer, q) for q in ("hi", "Who was born there?")]
    params = SamplingParams(max_new_tokens=12, temperature=0, stop=("the",))
    ours, theirs = gen.generate(prompts, params), hf.generate(prompts, params)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.text for g in ours] == [g.text for g in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@needs_vllm
@server_group
@pytest.mark.slow
def test_eval_over_a_pool_with_a_dead_url_scores_every_episode(server, tiny_model_dir,
                                                              tmp_path):
    rows = [{"index": i, "input": f"Where is item {i}?", "answers": ["Paris"], "num_docs": 2,
             "context": f"Document 1:\nA\nItem {i} is in Paris.\n\nDocument 2:\nB\nNothing."}
            for i in range(6)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text(json.dumps(rows))
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    rc = cli_main(["eval", f"model.path={tiny_model_dir}", f"eval.benchmarks=[ruler-hqa={data}]",
                   "eval.num_docs=[2]", "rollout.n=2", "memagent.chunk_size=48",
                   "memagent.max_memory_tokens=8", "memagent.max_final_tokens=8",
                   "memagent.temperature=1.0", "memagent.top_p=1.0", "memagent.seed=1",
                   "rollout.engine=openai",
                   f"rollout.openai.base_urls=[{server}, {server}, {dead}]",
                   f"eval.out_dir={out}", "eval.progress=false"])
    assert rc == 0
    out = out / "ruler-hqa"
    results = json.loads((out / "results.json").read_text())
    assert results["results"]["2"]["n"] == 12  # 6 questions x 2 samples, all scored
    lines = (out / "trajectories_2.jsonl").read_text().splitlines()
    assert len(lines) == 12 and all("reward" in json.loads(x) for x in lines)


@pytest.mark.pipeline
@needs_vllm
@server_group
@pytest.mark.slow
def test_a_server_killed_mid_rollout_loses_no_request(server, tiny_model_dir, tiny_tokenizer,
                                                      tmp_path):
    port = free_port()
    doomed = start_vllm_server(tiny_model_dir, port, tmp_path / "doomed.log")
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", timeout_s=180)
        gen = OpenAIEngine(OpenAIConfig(base_urls=[server, f"http://127.0.0.1:{port}"],
                                           max_in_flight_per_server=4, timeout_s=60),
                              tiny_tokenizer)
        prompts = [encode_chat(tiny_tokenizer, f"Question number {i}?") for i in range(48)]
        url = f"http://127.0.0.1:{port}"

        def kill_while_busy() -> None:  # SIGKILL while it holds requests
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(
                    s.url == url and s.in_flight > 0 for s in gen.servers):
                time.sleep(0.01)
            os.killpg(doomed.pid, signal.SIGKILL)  # the server and its engine processes

        killer = threading.Thread(target=kill_while_busy)
        killer.start()
        gens = gen.generate(prompts, SamplingParams(max_new_tokens=64, temperature=1.0, seed=2,
                                                    ignore_eos=True))
        killer.join()
    finally:
        stop_process(doomed)
    assert len(gens) == 48 and all(g.token_ids for g in gens)
    stats = gen.stats()
    doomed_stats = stats[f"http://127.0.0.1:{port}"]
    # It died holding requests: they failed on it, or (a CPU so loaded that the server fell
    # silent past the stall bound before the kill landed) the health check took them back.
    assert doomed_stats["failures"] >= 1 or doomed_stats["lost"] is not None, doomed_stats
    assert stats[server]["requests"] > 24  # which the live server took over


@needs_vllm
@server_group
@pytest.mark.slow
def test_sync_weights_reaches_the_server(server, tiny_model_dir, tiny_tokenizer, tmp_path):
    """After an optimizer step the server samples the updated policy (last test: it changes
    the module server's weights)."""
    import torch

    from memrl.inference import load_model

    policy = load_model(tiny_model_dir, device="cpu", dtype="float32")
    prompts = [encode_chat(tiny_tokenizer, q) for q in ("hi", "Who was born there?")]
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy.train()
    sum(policy(torch.tensor([p]), labels=torch.tensor([p])).loss for p in prompts).backward()
    opt.step()
    policy.eval()
    gen = OpenAIEngine(OpenAIConfig(base_urls=[server], weights_dir=str(tmp_path / "w")),
                          tiny_tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=4)

    def gap(gens) -> float:
        out = 0.0
        for p, g in zip(prompts, gens, strict=True):
            with torch.no_grad():
                logits = policy(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])
            out = max(out, float((lp[:, 0] - torch.tensor(g.logprobs)).abs().max()))
        return out

    assert gap(gen.generate(prompts, params)) > 1e-2  # still the initial weights
    gen.sync_weights(policy, 1)
    gen.sync_weights(policy, 2)  # the step-1 files are removed
    assert [p.name for p in (tmp_path / "w").iterdir()] == ["step_000002"]
    assert gap(gen.generate(prompts, params)) < 1e-4


@needs_vllm
@server_group
@pytest.mark.slow
def test_grpo_on_a_server_samples_the_policy_after_every_update(server, tiny_model_dir,
                                                                  tmp_path):
    """Pool training gives the colocated engine's rollouts: after each of three updates
    (lr 1e-2 and an entropy bonus: every step moves every weight, tied embeddings included)
    the server's log-probs are the trainer's to the colocated engine's tolerance (1e-3)."""
    from memrl.config import load_config
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.synthetic import make_synthetic_records
    from memrl.recipes import grpo
    from memrl.recipes.config import TrainConfig
    from memrl.run.metrics import read_metrics

    save_records_jsonl(make_synthetic_records(6, num_docs=2, seed=0), tmp_path / "train.jsonl")
    cfg = load_config(TrainConfig, None, [
        f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'train.jsonl'}",
        f"trainer.out_dir={tmp_path / 'run'}", "data.train_batch_size=2", "rollout.n=2",
        "rl.ppo_mini_batch_size=2", "rl.dynamic_sampling=false", "rl.overlong=keep",
        "optim.lr=1e-2", "rl.entropy_coeff=0.01", "rl.use_kl_loss=false",
        "memagent.chunk_size=48", "memagent.max_chunks=2", "memagent.max_memory_tokens=8",
        "memagent.max_final_tokens=8", "rollout.temperature=0.7", "rollout.top_p=1.0",
        "trainer.total_steps=3", "trainer.log_sinks=[jsonl]", "rollout.engine=openai",
        f"rollout.openai.base_urls=[{server}]", f"rollout.openai.weights_dir={tmp_path / 'w'}",
    ])
    assert grpo.train(cfg).step == 3
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["actor/grad_norm"] > 0  # the weights moved: step k+1 samples new ones
        assert r["rollout/logprob_diff_max"] < 1e-3, r
