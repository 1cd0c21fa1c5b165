"""`memrl eval locomo` scored as the memory literature does: set-F1, BLEU-1 and an LLM judge
(tested with a scripted engine), the held-out side of the conversation split, resumable runs."""

from __future__ import annotations

import json

import pytest

from memrl.agents.memupdate import MemUpdateConfig
from memrl.cli import main
from memrl.data.locomo import DialogueTurn, MemoryEpisode, MemoryFact, save_episodes
from memrl.errors import MemrlInputError
from memrl.eval.locomo import evaluate_locomo, literature_scores
from memrl.inference.scripted import ScriptedGenerator
from memrl.memory.embedder import HashingEmbedder
from memrl.rewards.locomo_metrics import judge_prompt
from test_eval_locomo import locomo_argv


def test_literature_scores_hand_computed():
    row = {"answers": ["Paris"], "prediction_final": "Paris, France", "hits_final": ["x"]}
    # set-F1: {paris, france} vs {paris}: P = 1/2, R = 1 -> 2/3
    # BLEU-1: 1 of 2 unigrams match, hypothesis longer than reference (no penalty) -> 1/2
    assert literature_scores(row) == {"set_f1": pytest.approx(2 / 3), "bleu1": 0.5,
                                      "judge": None, "judge_unreadable": None}
    assert literature_scores(row, "CORRECT", judged=True)["judge"] == 1.0
    assert literature_scores(row, None, judged=True) == {
        "set_f1": pytest.approx(2 / 3), "bleu1": 0.5, "judge": 0.0, "judge_unreadable": 1.0}
    # retrieval answerer: the top retrieved memory is the answer scored
    retrieval = {"answers": [2022], "hits_final": ["In 2022 she moved.", "other"]}
    assert literature_scores(retrieval)["set_f1"] == pytest.approx(2 * 0.25 / 1.25)
    assert literature_scores({"answers": ["a"], "hits_final": []})["set_f1"] == 0.0


def episode(i: int, conversation: str, category: int, answer: str) -> MemoryEpisode:
    dialogue = [DialogueTurn(session=2, dia_id="D2:1", speaker="Ann",
                             text=f"Code number {i} is {answer}.", date="2 May 2023"),
                DialogueTurn(session=2, dia_id="D2:2", speaker="Bob", text="Ok.",
                             date="2 May 2023")]
    return MemoryEpisode(
        id=f"{conversation}-qa{i}", sample_id=conversation, qa_index=i,
        question=f"What is code number {i}?", answers=[answer], category=category,
        adversarial=category == 5, evidence=["D2:1"], evidence_sessions=[2],
        dialogue=dialogue, initial_memory=[MemoryFact(text="Ann likes tea.", source="D1:1")],
    )


@pytest.fixture
def data_dir(tmp_path):
    # ten conversations: the held-out side of the split is conv-48, 49 and 50 (codes 7, 8, 9)
    name = {7: "conv-48", 8: "conv-49", 9: "conv-50"}
    episodes = [episode(k, name.get(k, f"conv-{k}"), 1 + k % 2, str(4400 + k))
                for k in range(10)]
    episodes.append(episode(10, "conv-49", 5, "7777"))
    d = tmp_path / "locomo"
    save_episodes(episodes, d)
    return d


def agent(tokenizer):
    """Stores the first dialogue line, so the top memory holds the answer."""

    def respond(prompt: str) -> str:
        if not prompt.rsplit("<|im_start|>", 2)[-2].startswith("user"):
            return "Done."
        line = next(x for x in prompt.splitlines() if x.startswith("[D2:1]"))
        payload = json.dumps({"name": "memory_insert",
                              "arguments": {"text": line.split(": ", 1)[1]}})
        return f"<tool_call>{payload}</tool_call>"

    return ScriptedGenerator(tokenizer, respond)


def judge(tokenizer, prompts):
    """CORRECT when the gold occurs in the generated answer; code 7's verdict is unreadable."""

    def respond(prompt: str) -> str:
        prompts.append(prompt)
        gold = prompt.rsplit("Gold answer: ", 1)[1].split("\n", 1)[0]
        generated = prompt.rsplit("Generated answer: ", 1)[1].split("\n", 1)[0]
        if "number 7" in generated:
            return "I cannot tell."
        label = "CORRECT" if gold in generated else "WRONG"
        return f'```json\n{{"label": "{label}"}}\n```'

    return ScriptedGenerator(tokenizer, respond)


def test_judge_split_and_resume_with_scripted_engines(data_dir, tmp_path, tiny_tokenizer):
    prompts: list[str] = []
    out = tmp_path / "run"
    kw = dict(config=MemUpdateConfig(embedder="hashing"), out_dir=out, categories=[1, 2, 5],
              embedder=HashingEmbedder(), show_progress=False, episodes_per_run=2,
              split="heldout", judge_name="scripted-judge")
    results = evaluate_locomo(agent(tiny_tokenizer), data_dir,
                              judge=judge(tiny_tokenizer, prompts), **kw)
    assert results["num_episodes"] == 4 and results["split"] == "heldout"
    per = results["results"]
    # held out: conv-48 (code 7, cat 2), conv-49 (code 8, cat 1, and one cat 5), conv-50 (cat 2)
    assert set(per) == {"1", "2", "5", "all"} and per["all"]["n"] == 3
    # the judge saw exactly mem0's prompt for the answerable episodes (not category 5)
    assert len(prompts) == 3
    assert any(p.find(judge_prompt("What is code number 8?", "4408",
                                   "Code number 8 is 4408.")) >= 0 for p in prompts)
    # code 7's verdict is unreadable: WRONG; codes 8 and 9 CORRECT
    assert per["1"]["judge"] == 1.0 and per["2"]["judge"] == 0.5
    assert per["all"]["judge"] == pytest.approx(2 / 3)
    assert per["all"]["judge_unreadable"] == pytest.approx(1 / 3)
    assert per["5"]["judge"] is None and per["5"]["set_f1"] is None
    # set-F1 of "Code number 8 is 4408." against "4408": 1 of 5 tokens -> 2 * .2 / 1.2
    assert per["1"]["set_f1"] == pytest.approx(1 / 3)
    md = (out / "results.md").read_text()
    assert "| set-F1 | BLEU-1 | judge |" in md and "scripted-judge" in md
    assert "Split `heldout`" in md
    assert "| 1 multi-hop | 1 | 33.3 | 20.0 | 100.0 | 0.0 |" in md  # literature table

    # re-running into the same directory generates nothing and gives the same results
    again_agent, again_prompts = agent(tiny_tokenizer), []
    again = evaluate_locomo(again_agent, data_dir, judge=judge(tiny_tokenizer, again_prompts),
                            resume=True, **kw)
    assert again_agent.calls == [] and again_prompts == []
    assert again["results"] == results["results"]
    # another judge (or none) is another protocol: refused
    with pytest.raises(MemrlInputError, match="different protocol"):
        evaluate_locomo(agent(tiny_tokenizer), data_dir, **{**kw, "judge_name": None})


def test_cli_split_and_judge_errors_are_one_line(data_dir, tiny_model_dir, tmp_path, capsys):
    base = [tiny_model_dir, data_dir, tmp_path / "out", "memupdate.embedder=hashing",
            "eval.progress=false"]
    for entry, message in (({"split": "dev"}, "unknown split 'dev'"),
                           ({"judge_model": str(tmp_path / "nope")},
                            "eval.benchmarks.0.judge_model")):
        assert main(locomo_argv(*base, **entry)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_prints_per_category_f1_bleu_and_judge(data_dir, tiny_model_dir, tmp_path,
                                                   capsys):
    rc = main(locomo_argv(
        tiny_model_dir, data_dir, tmp_path / "run", "memupdate.embedder=hashing",
        "memupdate.max_turns=1", "memupdate.max_response_tokens=8",
        "memupdate.session_chunk_turns=2", "memupdate.seed=0", "eval.progress=false",
        split="heldout", judge_model=str(tiny_model_dir)))
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for header in ("literature", "set-F1", "BLEU-1", "judge", "1 multi-hop", "all"):
        assert header in printed
    results = json.loads((tmp_path / "run" / "locomo" / "results.json").read_text())
    assert results["protocol"] == f"literature (judge: {tiny_model_dir})"
    assert results["results"]["heldout"]["num_records"] == 3
    assert 0.0 <= results["results"]["heldout"]["categories"]["all"]["judge"] <= 1.0
