"""The quickstart's learning check, fast: a model memrl builds from scratch, warm-started on
the oracle's trajectories, answers questions about entities it never saw in training, scored
with the real answer metric (sub-EM of the \\boxed{} answer).

What it checks is the last step of the task, reading the answer out of a memory that holds
the fact (the oracle's memory), where the untrained model scores 0; the whole task (finding
the fact in the chunks) takes the quickstart's longer training (see README).
"""

from __future__ import annotations

import pytest

from memrl.agents.memagent import MemAgent, MemAgentConfig
from memrl.agents.oracle import needed_facts
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.inference.base import SamplingParams
from memrl.inference.hf import HFGenerator
from memrl.inference.loader import load_pretrained
from memrl.models.tiny import build_tiny_model
from memrl.recipes import sft
from memrl.recipes.sft_config import SFTConfig
from memrl.rewards.qa import extract_boxed, qa_scores

AGENT = MemAgentConfig(
    chunk_size=32, max_memory_tokens=24, max_final_tokens=12, temperature=0,
    prompts={"update_template": "Problem: {prompt}\nMemory: {memory}\nSection: {chunk}\n"
                                "Updated memory:",
             "final_template": "Problem: {prompt}\nMemory: {memory}\nAnswer:"},
)


def answer_accuracy(model_dir, records) -> float:
    """Mean sub-EM of the greedy final answer when the memory holds the needed fact."""
    generator = HFGenerator(*load_pretrained(model_dir, device="cpu"))
    agent = MemAgent(generator, AGENT)
    prompts = [agent.final_prompt_ids(r.question, " ".join(needed_facts(r))) for r in records]
    gens = generator.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    return sum(qa_scores(extract_boxed(g.text), r.answers)["sub_em"]
               for g, r in zip(gens, records, strict=True)) / len(records)


@pytest.mark.slow
def test_a_warm_started_tiny_model_reads_answers_about_unseen_entities(tmp_path):
    train = make_synthetic_records(256, 4, seed=1, hops=1, entities="train")
    unseen = make_synthetic_records(40, 4, seed=2, hops=1, entities="eval")
    assert not {r.documents[0].title for r in train} & {r.documents[0].title for r in unseen}
    save_records_jsonl(train, tmp_path / "train.jsonl")
    prompts = AGENT.resolved_prompts
    corpus = [prompts.update_text(prompt=r.question, memory="x", chunk=r.render_context())
              + prompts.final_text(prompt=r.question, memory="x") for r in train[:200]]
    model = build_tiny_model(tmp_path / "model", seed=0, corpus=corpus, vocab_size=1024)
    before = answer_accuracy(model, unseen)

    cfg = load_config(SFTConfig, None, [
        f"model.path={model}", f"data.train_file={tmp_path / 'train.jsonl'}",
        f"trainer.out_dir={tmp_path / 'sft'}", "trainer.total_steps=300", "optim.lr=0.003",
        "optim.warmup_steps=5", "optim.weight_decay=0", "sft.batch_size=16",
        "sft.micro_batch_size=64", "sft.turn_kinds=[final]", "trainer.log_sinks=[jsonl]",
        "trainer.val_before_train=false",
    ]).model_copy(update={"memagent": AGENT})
    sft.train(cfg)
    from memrl.rl.checkpoint import export_checkpoint, latest_checkpoint

    export_checkpoint(latest_checkpoint(tmp_path / "sft" / "checkpoints"), tmp_path / "warm")
    after = answer_accuracy(tmp_path / "warm", unseen)
    assert before <= 0.1
    # The answer (a closed-list word) is read from a memory holding the fact about a person
    # never seen in training.
    assert after >= before + 0.15, (before, after)


@pytest.mark.slow
def test_quickstart_data_keeps_evaluation_entities_out_of_training(tmp_path):
    import re

    from memrl.data.hotpotqa import load_hotpotqa
    from memrl.data.ruler_hqa import load_ruler_hqa
    from memrl.quickstart import QuickstartPlan, prepare_quickstart
    from memrl.recipes.config import TrainConfig

    cfg = load_config(TrainConfig, "configs/quickstart.yaml", [
        f"model.path={tmp_path / 'model'}", f"data.train_file={tmp_path / 'train.jsonl'}",
        f"data.val_file={tmp_path / 'val.jsonl'}", f"trainer.out_dir={tmp_path / 'rl'}",
    ])
    eval_dir = prepare_quickstart(cfg)
    assert cfg.rl.reward == "sub_em"  # the real answer reward, never a proxy
    names = lambda text: set(re.findall(r"\b[A-Z][a-z]+\b", text))  # noqa: E731
    train_names = set().union(*(names(r.render_context()) for r in
                                load_hotpotqa(cfg.data.train_file)))
    for n in QuickstartPlan().eval_docs:
        for r in load_ruler_hqa(eval_dir / f"eval_{n}.json"):
            asked = names(r.question) - {"In", "By", "Which", "What"}
            assert asked and not asked & train_names, (n, r.question)
            assert r.context.count("Document ") == n
