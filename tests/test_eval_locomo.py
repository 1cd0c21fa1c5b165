"""`memrl eval locomo`: aggregation, the library function with a scripted agent, and the CLI
end to end with the tiny model; bad inputs are one-line errors with exit code 2."""

from __future__ import annotations

import json
import math

import pytest

from memrl.agents.memupdate import MemUpdateConfig
from memrl.cli import main as cli_main
from memrl.data.locomo import DialogueTurn, MemoryEpisode, MemoryFact, save_episodes
from memrl.errors import MemrlInputError
from memrl.eval.locomo import aggregate, check_categories, evaluate_locomo, table_rows
from memrl.eval.report import read_jsonl
from memrl.inference.scripted import ScriptedGenerator
from memrl.memory.embedder import HashingEmbedder


def make_episode(i: int, category: int, lines: list[str], answer: str) -> MemoryEpisode:
    dialogue = [
        DialogueTurn(session=2, dia_id=f"D2:{k + 1}", speaker="Ann" if k % 2 == 0 else "Bob",
                     text=text, date="2 May 2023")
        for k, text in enumerate(lines)
    ]
    return MemoryEpisode(
        id=f"conv-e-qa{i}-0000000{i}", sample_id="conv-e", qa_index=i,
        question=f"What is code number {i}?", answers=[answer], category=category,
        adversarial=category == 5, evidence=["D2:1"], evidence_sessions=[2], dialogue=dialogue,
        initial_memory=[MemoryFact(text="Ann likes tea.", source="D1:1"),
                        MemoryFact(text="Bob runs on Sundays.", source="D1:2")],
    )


@pytest.fixture
def data_dir(tmp_path):
    episodes = [
        make_episode(1, 1, ["Code number 1 is 4417.", "Ok."], "4417"),
        make_episode(2, 1, ["Code number 2 is 5521.", "Ok."], "5521"),
        make_episode(3, 2, ["Code number 3 is 9001.", "Ok."], "9001"),
        make_episode(4, 5, ["Code number 4 is unknown.", "Ok."], "7777"),
    ]
    d = tmp_path / "locomo"
    save_episodes(episodes, d)
    return d


def traj(rid: str, reward: float, before: int, after: int, literature=None, **metrics):
    """A row of trajectories.jsonl, as aggregate reads it."""
    base = dict(score_initial=0.0, score_final=0.0, delta=0.0, recall_initial=0.0,
                recall_final=0.0, inserts=0.0, updates=0.0, deletes=0.0, searches=0.0,
                memory_growth_tokens=0.0, turns=1.0, format_error_rate=0.0, efficiency=1.0)
    base.update(metrics)
    lit = literature or {"set_f1": 0.0, "bleu1": 0.0, "judge": None, "judge_unreadable": None}
    return {"id": rid, "reward": reward, "scores": base, "literature": lit,
            "memory_before": {"count": before}, "memory_after": {"count": after}}


def test_aggregate_hand_computed():
    trajs = [
        traj("a", 0.5, 10, 12, score_final=1.0, delta=1.0, inserts=2.0, recall_final=1.0,
             memory_growth_tokens=20.0, format_error_rate=0.5,
             literature={"set_f1": 0.6, "bleu1": 0.3, "judge": None, "judge_unreadable": None}),
        traj("a", -0.1, 10, 10, score_initial=0.0, format_error_rate=1.0),
        traj("b", 0.0, 4, 3, score_initial=0.5, score_final=0.5, deletes=1.0,
             memory_growth_tokens=-6.0),
    ]
    r = aggregate(trajs)
    assert r["n"] == 3 and r["episodes"] == 2
    assert r["f1_initial"] == pytest.approx(0.5 / 3) and r["f1_final"] == pytest.approx(0.5)
    assert r["reward"] == pytest.approx(0.4 / 3)
    assert r["inserts"] == pytest.approx(2 / 3) and r["deletes"] == pytest.approx(1 / 3)
    assert r["memory_growth_tokens"] == pytest.approx(14 / 3)
    assert r["memory_growth_entries"] == pytest.approx(1 / 3)  # (2 + 0 - 1) / 3
    assert r["memory_size_final"] == pytest.approx(25 / 3)
    assert r["format_error_rate"] == pytest.approx(0.5)
    assert r["set_f1"] == pytest.approx(0.2) and r["bleu1"] == pytest.approx(0.1)
    assert r["judge"] is None  # no judge: not 0
    assert aggregate(trajs, scored=False)["f1_final"] is None
    rows = table_rows({"1": r, "all": r})
    assert rows[0][0] == "1 multi-hop" and rows[1][0] == "all"
    assert rows[0][3] == pytest.approx(50.0)  # F1 final in %


def locomo_argv(model, data, out, *overrides, **entry):
    """`memrl eval` of the memupdate agent on LoCoMo (`entry`: the benchmark's own keys),
    into `out`/locomo."""
    bench = {"name": "locomo", "data_dir": str(data), **entry}
    return ["eval", "agent=memupdate", f"model.path={model}", f"eval.out_dir={out}",
            f"eval.benchmarks=[{json.dumps(bench)}]", *overrides]


def test_categories_checking():
    assert check_categories([3, 1, 3]) == [1, 3]
    with pytest.raises(MemrlInputError, match="unknown category 9"):
        check_categories([1, 9])
    with pytest.raises(MemrlInputError):
        check_categories([])


def test_evaluate_locomo_with_a_scripted_agent(data_dir, tmp_path, tiny_tokenizer):
    """The agent stores the first dialogue line: every answerable question becomes answerable."""

    def respond(prompt: str) -> str:
        if not prompt.rsplit("<|im_start|>", 2)[-2].startswith("user"):
            return "Done."
        line = next(x for x in prompt.splitlines() if x.startswith("[D2:1]"))
        text = line.split(": ", 1)[1]
        payload = json.dumps({"name": "memory_insert", "arguments": {"text": text}})
        return f"<tool_call>{payload}</tool_call>"

    out = tmp_path / "run"
    results = evaluate_locomo(
        ScriptedGenerator(tiny_tokenizer, respond), data_dir,
        config=MemUpdateConfig(embedder="hashing"), out_dir=out, categories=[1, 2, 5],
        embedder=HashingEmbedder(), show_progress=False, episodes_per_run=2,
    )
    per = results["results"]
    assert set(per) == {"1", "2", "5", "all"}
    assert per["1"]["episodes"] == 2 and per["1"]["f1_initial"] == 0.0
    assert per["1"]["f1_final"] == 1.0 and per["all"]["f1_final"] == 1.0
    assert per["all"]["recall_final"] == 1.0 and per["all"]["inserts"] == 1.0
    assert per["all"]["memory_growth_entries"] == 1.0 and per["all"]["n"] == 3
    assert per["5"]["f1_final"] is None and per["5"]["recall_final"] == 1.0
    memory = per["all"]["memory"]  # one session read, one insert into two entries
    assert memory["sessions"] == 1.0 and memory["per_session"]["inserts"] == 1.0
    assert memory["memory_entries_initial"] == 2.0 and memory["memory_entries_final"] == 3.0
    saved = json.loads((out / "results.json").read_text())
    assert saved["num_episodes"] == 4 and saved["embedder"] == "hashing-256"
    rows = read_jsonl(out / "trajectories.jsonl")
    assert len(rows) == 4 and rows[0]["calls"][0]["name"] == "memory_insert"
    md = (out / "results.md").read_text()
    assert "| 1 multi-hop | 2 | 0.0 | 100.0 |" in md and "5 adversarial" in md
    assert "## Memory per dialogue session read" in md and "| all | 1.00 | 1.00 |" in md

    limited = evaluate_locomo(
        ScriptedGenerator(tiny_tokenizer, respond), data_dir,
        config=MemUpdateConfig(embedder="hashing"), out_dir=tmp_path / "run2", limit=1,
        show_progress=False,
    )
    assert limited["num_episodes"] == 1 and set(limited["results"]) == {"1", "all"}


def test_cli_end_to_end_with_the_tiny_model(data_dir, tiny_model_dir, tmp_path, capsys):
    rc = cli_main(locomo_argv(
        tiny_model_dir, data_dir, tmp_path / "run", "eval.limit=3", "memupdate.embedder=hashing",
        "rollout.n=2", "memupdate.max_turns=2", "memupdate.max_response_tokens=8",
        "memupdate.session_chunk_turns=1", "memupdate.seed=0", "eval.progress=false",
        categories=[1, 2]))
    assert rc == 0, capsys.readouterr().err
    out = tmp_path / "run" / "locomo"
    results = json.loads((out / "results.json").read_text())
    split = results["results"]["all"]
    assert split["num_records"] == 3 and results["num_samples"] == 2
    assert split["categories"]["all"]["n"] == 6
    for key in ("f1_final", "recall_final", "reward", "memory_growth_tokens"):
        assert math.isfinite(split["categories"]["all"][key])
    assert len(read_jsonl(out / "trajectories_all.jsonl")) == 6
    assert (out / "results.md").read_text().startswith("# LoCoMo")
    assert "LoCoMo" in capsys.readouterr().out


def test_cli_scores_as_evaluate_locomo_does(data_dir, tiny_model_dir, tmp_path, capsys):
    """The same seeds and episodes as `evaluate_locomo`: the same per-category results."""
    import torch

    from memrl.inference.factory import build_engine
    from memrl.inference.loader import load_pretrained

    keys = ["memupdate.embedder=hashing", "memupdate.max_turns=2",
            "memupdate.max_response_tokens=8", "memupdate.session_chunk_turns=1",
            "memupdate.seed=4", "memupdate.temperature=1.0", "model.device=cpu",
            "eval.progress=false"]
    assert cli_main(locomo_argv(tiny_model_dir, data_dir, tmp_path / "new", *keys,
                                categories=[1, 2, 5])) == 0, capsys.readouterr().err
    new = json.loads((tmp_path / "new" / "locomo" / "results.json").read_text())
    torch.manual_seed(4)
    model, tokenizer = load_pretrained(str(tiny_model_dir), device="cpu", dtype=None)
    engine = build_engine("hf", tokenizer, model=model, generation_batch_size=32)
    config = MemUpdateConfig(embedder="hashing", max_turns=2, max_response_tokens=8,
                             session_chunk_turns=1, seed=4, temperature=1.0)
    old = evaluate_locomo(engine, data_dir, config=config, out_dir=tmp_path / "old",
                          categories=[1, 2, 5], show_progress=False)
    categories = new["results"]["all"]["categories"]
    for key, result in old["results"].items():
        result.pop("seconds", None)
        assert {k: v for k, v in categories[key].items() if k != "seconds"} == result


@pytest.mark.parametrize(
    ("entry", "overrides", "message"),
    [
        ({"data_dir": "{missing}"}, [], "LoCoMo data not found"),
        ({"data_dir": "{empty}"}, [], "no episodes"),
        ({}, ["model.path={missing}"], "model directory not found"),
        ({}, ["model.path={empty}"], "no config.json"),
        ({"categories": [9]}, [], "unknown category 9"),
        ({"categories": ["one"]}, [], "categories"),
        ({}, ["memupdate.embedder=word2vec"], "memupdate.embedder"),
        ({}, ["memupdate.top_k=0"], "memupdate.top_k"),
    ],
)
def test_cli_bad_inputs_exit_2(entry, overrides, message, data_dir, tiny_model_dir, tmp_path,
                               capsys):
    (tmp_path / "empty").mkdir()
    fill = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    entry = {k: v.format(**fill) if isinstance(v, str) else v for k, v in entry.items()}
    data = entry.pop("data_dir", data_dir)
    argv = locomo_argv(tiny_model_dir, data, tmp_path / "out",
                       *(o.format(**fill) for o in overrides), **entry)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
