"""Biographies: natural sentences, namesake distractors, held-out people, forms and questions.

The generated text is parsed back with a regex per sentence form, so the properties below are
checked on what the agent reads, not on the generator's own bookkeeping.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.agents.memagent import MemAgentConfig
from memrl.agents.oracle import OracleGenerator, corrected, hard_distractor
from memrl.cli import main
from memrl.data.biographies import (
    asked_person,
    FORMS,
    INSTRUMENTS,
    JOBS,
    KINDS,
    QUESTIONS,
    SHARED_VALIDATION_START,
    SPLITS,
    VALIDATION_START,
    biography_paragraphs,
    biography_question,
    biography_questions,
    biography_sentence,
    can_use_pronoun,
    is_namesake_slot,
    make_biography_records,
    name_pool,
    namesake_count,
    pronoun_of,
    shared_namesakes,
    vocabulary,
    write_biographies,
    write_biography_eval,
)
from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.records import QARecord
from memrl.data.ruler_hqa import load_ruler_hqa_dir
from memrl.data.synthetic import entity_split
from memrl.errors import MemrlInputError
from memrl.tasks.memagent_qa import MemAgentQATask, score_trajectory

NAME = r"[A-Z][a-z]+ [A-Z][a-z]+"
VALUE = {
    "birthplace": r"[A-Z][a-z]+", "residence": r"[A-Z][a-z]+", "employer": NAME,
    "birth_year": r"\d{4}", "occupation": r"[a-z]+", "instrument": r"[a-z]+(?: [a-z]+)?",
}
SUBJECT = {"n": rf"(?P<n>{NAME}|He|She)", "p": rf"(?P<p>{NAME}'s|His|Her)"}


def form_regex(form: str, kind: str) -> re.Pattern[str]:
    out = re.escape(form)
    for slot, pattern in SUBJECT.items():
        out = out.replace(re.escape("{" + slot + "}"), pattern)
    out = out.replace(re.escape("{a}"), rf"an? (?P<v>{VALUE[kind]})")
    return re.compile(out.replace(re.escape("{v}"), rf"(?P<v>{VALUE[kind]})"))


@functools.cache
def parsers() -> dict[str, list[tuple[str, re.Pattern[str]]]]:
    return {s: [(k, form_regex(f, k)) for k in KINDS for f in FORMS[k][s]] for s in SPLITS}


def parse(sentence: str, split: str) -> tuple[str, str, str]:
    """(kind, subject, value) of a sentence, which must be written in exactly one form of
    `split` and in no form of the other split."""
    other = "eval" if split == "train" else "train"
    assert not [k for k, rx in parsers()[other] if rx.fullmatch(sentence)], sentence
    found = [(k, m) for k, rx in parsers()[split] if (m := rx.fullmatch(sentence))]
    assert len(found) == 1, (sentence, [k for k, _ in found])
    kind, m = found[0]
    subject = m.groupdict().get("n") or m.group("p").removesuffix("'s")
    return kind, subject, m.group("v")


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.) ", text)


def facts_of(doc_text: str, title: str, split: str) -> dict[str, tuple[str, str]]:
    """kind → (sentence, value) of one biography; checks who each sentence is about."""
    out = {}
    pronoun = {"he": ("He", "His"), "she": ("She", "Her")}[pronoun_of(title.split()[0])]
    parts = sentences(doc_text)
    assert 2 <= len(parts) <= 4
    for i, s in enumerate(parts):
        kind, subject, value = parse(s, split)
        assert subject == title or (i > 0 and subject in pronoun), (title, s)
        assert kind not in out
        out[kind] = (s, value)
    return out


# --- by hand ----------------------------------------------------------------------------------


def test_sentences_by_hand():
    assert biography_sentence("{n} was born in {v}.", "Kovan Drel", "Brastor") == \
        "Kovan Drel was born in Brastor."
    assert biography_sentence("{p} employer is {v}.", "Kovan Drel", "Basnart Mills") == \
        "Kovan Drel's employer is Basnart Mills."
    assert biography_sentence("{p} employer is {v}.", "Kovan Drel", "Basnart Mills",
                              "she") == "Her employer is Basnart Mills."
    assert biography_sentence("{n} works as {a}.", "Mira Solt", "architect", "he") == \
        "He works as an architect."
    assert biography_sentence("As {a}, {n} keeps long hours.", "Mira Solt", "potter") == \
        "As a potter, Mira Solt keeps long hours."
    assert not can_use_pronoun("At {v}, {n} is a valued member of staff.")
    with pytest.raises(MemrlInputError, match="cannot take a pronoun"):
        biography_sentence("{v} employs {n}.", "Mira Solt", "Basnart Mills", "he")


def test_namesake_slots_by_hand():
    assert [k for k in range(12) if is_namesake_slot(k, 0.25)] == [3, 7, 11]
    assert namesake_count(15, 0.25) == 3 and namesake_count(1023, 0.25) == 255
    assert namesake_count(10, 0.3) == 3 and namesake_count(7, 0.0) == 0
    assert namesake_count(7, 1.0) == 7


def test_one_record_by_hand():
    """Pins the data set (train, seed 0, question 0, N=3): a change of generator shows here."""
    (r,) = make_biography_records(1, 3, seed=0)
    assert r.question == "What is Vidru Thilkwell's place of birth?"
    assert r.answers == ["Lildale"] and r.facts == ["Vidru Thilkwell was born in Lildale."]
    assert r.render_context() == (
        "Document 1:\nMosrola Haano\nMosrola Haano has worked as a mechanic for many years. "
        "Mosrola Haano, who plays the harmonica, performs at local weddings. Mosrola Haano, "
        "who lives in Vimhaven, walks to the market every morning. Mosrola Haano joined "
        "Treargai Mills and has worked there ever since.\n\n"
        "Document 2:\nVidru Thilkwell\nVidru Thilkwell was born in Lildale. Vidru Thilkwell, "
        "a plumber by profession, rarely takes a holiday.\n\n"
        "Document 3:\nStigi Rartell\nStigi Rartell lives in Jeswold. Her trade is that of a "
        "stonemason. Stigi Rartell's employer is Zabreirt Printers. Stigi Rartell was born in "
        "1929."
    )
    assert [d.is_supporting for d in r.documents] == [False, True, False]


# --- the vocabulary and the forms -------------------------------------------------------------


def test_forms_and_questions_are_many_and_split_in_disjoint_halves():
    assert len(KINDS) >= 5
    for kind in KINDS:
        train, held_out = FORMS[kind]["train"], FORMS[kind]["eval"]
        assert len(train) + len(held_out) >= 8 and not set(train) & set(held_out)
        for form in (*train, *held_out):
            assert form.count("{v}") + form.count("{a}") == 1
            assert form.count("{n}") + form.count("{p}") == 1
        questions = QUESTIONS[kind]
        assert len(questions["train"]) + len(questions["eval"]) >= 5
        assert not set(questions["train"]) & set(questions["eval"])


def test_values_are_open_and_none_contains_another():
    vocab = vocabulary()
    assert len(JOBS) >= 30 and len(INSTRUMENTS) >= 30
    assert len(vocab.towns) >= 500 and len(vocab.companies) >= 500
    for values in (JOBS, INSTRUMENTS, vocab.towns, vocab.companies):
        # so a (sub-EM) prediction of another value never contains the gold one
        assert not [(a, b) for a in values for b in values if a != b and a in b]


def test_name_halves_are_disjoint_and_no_last_name_extends_another():
    vocab = vocabulary()
    for part in (vocab.first_names, vocab.last_names):
        assert not set(part["train"]) & set(part["eval"])
        for split in SPLITS:
            assert len(part[split]) >= 1000
            assert all(entity_split(w) == split for w in part[split])
    lasts = sorted(vocab.last_names["train"] + vocab.last_names["eval"])
    assert not [(a, b) for a, b in zip(lasts, lasts[1:]) if b.startswith(a)]
    words = [*vocab.towns, *(c.split()[0] for c in vocab.companies)]
    firsts = {*vocab.first_names["train"], *vocab.first_names["eval"]}
    assert not (set(words) & (firsts | set(lasts))) and not (firsts & set(lasts))


# --- properties of the records ----------------------------------------------------------------


def check_record(r: QARecord, split: str, num_docs: int, hard_share: float) -> None:
    (gold,) = [d for d in r.documents if d.is_supporting]
    (fact,) = r.facts
    (answer,) = r.answers
    name = gold.title
    first, last = name.split()
    assert len(r.documents) == num_docs == r.num_docs
    assert len({d.title for d in r.documents}) == num_docs
    # the question: one of the split's paraphrases, about the gold paragraph's person
    asked = [k for k in KINDS if r.question in {q.format(n=name) for q in QUESTIONS[k][split]}]
    assert len(asked) == 1, r.question
    kind = asked[0]
    gold_facts = facts_of(gold.text, name, split)
    assert gold_facts[kind] == (fact, answer)
    assert name in fact and answer in fact and fact in gold.text
    assert r.render_context().count(fact) == 1
    people = [d.title.split() for d in r.documents]
    assert all(entity_split(a) == split and entity_split(b) == split for a, b in people)
    namesakes = 0
    for d in r.documents:
        if d is gold:
            continue
        assert name not in d.text and name not in d.title  # never a fact about the asked name
        stated = facts_of(d.text, d.title, split)
        f, la = d.title.split()
        if f == first or la == last:
            namesakes += 1
            assert kind in stated and stated[kind][1] != answer
    assert namesakes == namesake_count(num_docs - 1, hard_share)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), num_docs=st.integers(1, 40),
       hard_share=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]), split=st.sampled_from(SPLITS),
       start=st.integers(0, 50))
def test_every_record_is_answerable_only_from_its_gold_sentence(seed, num_docs, hard_share,
                                                                 split, start):
    records = make_biography_records(3, num_docs, seed, split=split, hard_share=hard_share,
                                     start=start)
    assert [r.id for r in records] == [f"bio-{split}-{seed}-{i}" for i in range(start, start + 3)]
    assert len({r.question for r in records}) == 3  # the oracle finds records by question
    for r in records:
        check_record(r, split, num_docs, hard_share)
    again = make_biography_records(3, num_docs, seed, split=split, hard_share=hard_share,
                                   start=start)
    assert again == records


def test_seeds_differ_and_train_and_eval_people_are_disjoint():
    train = make_biography_records(300, 8, seed=0, split="train")
    held_out = make_biography_records(300, 8, seed=0, split="eval")
    assert make_biography_records(5, 8, seed=1) != train[:5]
    names = [{d.title for r in rs for d in r.documents} for rs in (train, held_out)]
    firsts = [{n.split()[0] for n in ns} for ns in names]
    lasts = [{n.split()[1] for n in ns} for ns in names]
    assert not (firsts[0] & firsts[1]) and not (lasts[0] & lasts[1])
    assert len({r.question for r in train}) == 300
    assert {r.question.split(" ")[0] for r in train} >= {"In", "Where", "What", "Which", "Who"}


def test_distractors_at_n_are_a_prefix_of_those_at_a_larger_n():
    small, large = (biography_questions(4, n, seed=3, split="eval") for n in (8, 40))
    for a, b in zip(small, large, strict=True):
        assert (a.question, a.answer, a.fact, a.gold) == (b.question, b.answer, b.fact, b.gold)
        assert b.distractors[:7] == a.distractors
        assert a.namesakes(8) == 1 and b.namesakes(40) == 9


def test_arguments_are_checked():
    cases = [
        (dict(num_questions=0, num_docs=4), "num_questions must be an integer of at least 1"),
        (dict(num_questions=2, num_docs=0), "num_docs must be an integer of at least 1"),
        (dict(num_questions=2, num_docs=4, split="test"), "split must be one of train, eval"),
        (dict(num_questions=2, num_docs=4, hard_share=1.5), "hard_share must be a number"),
        (dict(num_questions=2, num_docs=5000, hard_share=1.0), "namesakes per question"),
        (dict(num_questions=2, num_docs=4, start=-1), "start must be an integer"),
        (dict(num_questions=10**7, num_docs=4), "questions per split"),
    ]
    for kwargs, message in cases:
        with pytest.raises(MemrlInputError, match=message):
            make_biography_records(**kwargs)


# --- the evaluation files ---------------------------------------------------------------------


def test_eval_files_hold_the_same_questions_at_every_n(tmp_path):
    ns = [4, 16, 64]
    paths = write_biography_eval(tmp_path, ns, num_questions=6, seed=2, hard_share=0.25)
    assert [p.name for p in paths] == ["eval_4.json", "eval_16.json", "eval_64.json"]
    loaded = load_ruler_hqa_dir(tmp_path, ns)
    first = [(r.id, r.question, r.answers, r.facts) for r in loaded[4]]
    assert len(first) == 6
    positions = set()
    for n in ns:
        assert [(r.id, r.question, r.answers, r.facts) for r in loaded[n]] == first
        items = json.loads((tmp_path / f"eval_{n}.json").read_text())
        for r, item in zip(loaded[n], items, strict=True):
            assert r.num_docs == n and item["namesakes"] == namesake_count(n - 1, 0.25)
            assert item["kind"] == KINDS[int(r.id) % len(KINDS)]
            titles = re.findall(r"Document \d+:\n([^\n]+)\n", r.context)
            assert len(titles) == n and f"Document {n}:\n" in r.context
            (fact,) = r.facts
            assert r.context.count(fact) == 1 and r.answers[0] in fact
            (gold,) = [t for t in titles if t in fact]
            positions.add(titles.index(gold))
    assert len(positions) > 3  # the gold paragraph is not always at the same place
    again = tmp_path / "again"
    write_biography_eval(again, ns, num_questions=6, seed=2, hard_share=0.25)
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in paths)


def test_validation_questions_are_held_out_and_not_evaluation_questions(tmp_path):
    paths = write_biographies(tmp_path, train_questions=20, train_docs=6, val_questions=8,
                              eval_questions=10, eval_docs=[6, 12])
    assert [p.name for p in paths] == ["train.jsonl", "val.jsonl", "eval_6.json",
                                       "eval_12.json"]
    train, val = load_hotpotqa(paths[0]), load_hotpotqa(paths[1])
    assert [r.id for r in val] == [f"bio-eval-0-{VALIDATION_START + i}" for i in range(8)]
    for r in val:
        check_record(r, "eval", 6, 0.25)
    evaluation = load_ruler_hqa_dir(tmp_path, [6])[6]
    assert not {r.question for r in val} & {r.question for r in evaluation}
    assert train == make_biography_records(20, 6, 0, split="train")


# --- shared names: only the whole name tells people apart ----------------------------------


def check_shared_record(r: QARecord, split: str, num_docs: int, hard_share: float) -> None:
    """The reference check of a shared-names record: the answer re-derived from the parsed
    facts of the one biography titled with the asked name; every namesake states the asked
    kind, naming themselves in full, with another value; both kinds of namesake are there."""
    name = asked_person(r.question)
    first, last = name.split()
    kind = next(k for k in KINDS if r.question in {q.format(n=name) for q in QUESTIONS[k][split]})
    firsts, lasts = name_pool(split, "shared")
    assert len(r.documents) == num_docs == len({d.title for d in r.documents})
    parsed = {d.title: facts_of(d.text, d.title, split) for d in r.documents}
    (gold,) = [d for d in r.documents if d.title == name]
    assert gold.is_supporting and parsed[name][kind] == (r.facts[0], r.answers[0])
    sides = set()
    for d in r.documents:
        f, la = d.title.split()
        assert f in firsts and la in lasts
        if d is gold:
            continue
        assert name not in d.text  # never a fact about the asked name
        if f == first or la == last:
            sentence, value = parsed[d.title][kind]
            assert value != r.answers[0] and d.title in sentence
            sides.add("first" if f == first else "last")
    assert sides == [set(), {"first"}, {"first", "last"}][min(num_docs, 3) - 1]
    assert sum(f == first or la == last for f, la in (d.title.split() for d in r.documents)
               if f"{f} {la}" != name) >= shared_namesakes(num_docs - 1, hard_share)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), num_docs=st.integers(1, 60),
       hard_share=st.sampled_from([0.0, 0.25, 0.5]), split=st.sampled_from(SPLITS),
       start=st.integers(0, 50))
def test_shared_names_records_need_the_whole_name(seed, num_docs, hard_share, split, start):
    kwargs = dict(split=split, hard_share=hard_share, start=start, names="shared")
    records = make_biography_records(3, num_docs, seed, **kwargs)
    assert [r.id for r in records] == [f"bio-shared-{split}-{seed}-{i}"
                                       for i in range(start, start + 3)]
    for r in records:
        check_shared_record(r, split, num_docs, hard_share)
    assert make_biography_records(3, num_docs, seed, **kwargs) == records  # deterministic


def test_shared_names_are_shared_by_many_and_nested_across_lengths():
    small, large = (biography_questions(12, n, seed=4, split="eval", names="shared")
                    for n in (24, 1536))
    assert {q.kind for q in small} == set(KINDS)  # every attribute asked
    for a, b in zip(small, large, strict=True):
        assert (a.question, a.answer, a.fact, a.gold) == (b.question, b.answer, b.fact, b.gold)
        assert b.distractors[:23] == a.distractors  # the same question at every length
        assert a.namesakes(24) >= shared_namesakes(23, 0.25) == 7
        assert b.namesakes(1536) >= shared_namesakes(1535, 0.25) == 385
    titles = [d.title.split() for d in large[0].distractors]
    for part in (0, 1):  # every name part of the pools recurs among many people
        counts = {}
        for t in titles:
            counts[t[part]] = counts.get(t[part], 0) + 1
        assert sorted(counts.values())[len(counts) // 2] >= 2
    assert biography_questions(2, 24, seed=4, split="eval", names="shared")[0].name != \
        biography_questions(2, 24, seed=5, split="eval", names="shared")[0].name


def test_shared_names_train_and_eval_are_held_out(tmp_path):
    for part in (0, 1):
        assert not set(name_pool("train", "shared")[part]) & set(name_pool("eval", "shared")[part])
    paths = write_biographies(tmp_path, train_questions=30, train_docs=8, val_questions=6,
                              eval_questions=6, eval_docs=[8, 32], names="shared")
    train, val = load_hotpotqa(paths[0]), load_hotpotqa(paths[1])
    assert [r.id for r in val] == [f"bio-shared-eval-0-{SHARED_VALIDATION_START + i}"
                                   for i in range(6)]
    for r in train:
        check_shared_record(r, "train", 8, 0.25)  # parsed in training forms only
    for r in val:
        check_shared_record(r, "eval", 8, 0.25)  # in held-out forms and phrasings only
    evaluation = load_ruler_hqa_dir(tmp_path, [8, 32])
    assert [r.question for r in evaluation[8]] == [r.question for r in evaluation[32]]
    people = [{d.title for r in rs for d in r.documents} for rs in (train, val)]
    people[1] |= {t for r in evaluation[32] for t in re.findall(r"Document \d+:\n([^\n]+)\n",
                                                                r.context)}
    for part in (0, 1):
        assert not {p.split()[part] for p in people[0]} & {p.split()[part] for p in people[1]}
    assert not {r.question for r in val} & {r.question for r in evaluation[8]}


def test_cli_writes_the_shared_names_task(tmp_path, capsys):
    assert main(["prepare", "biographies", "--out", str(tmp_path), "names=shared",
                 "train_questions=5", "train_docs=4", "val_questions=2",
                 "eval_questions=3", "num_docs=[4,8]"]) == 0
    assert load_hotpotqa(tmp_path / "train.jsonl") == make_biography_records(
        5, 4, 0, split="train", names="shared")
    assert main(["prepare", "biographies", "--out", str(tmp_path / "x"), "names=few"]) == 2
    assert "names: must be one of distinct, shared" in capsys.readouterr().err


# --- the oracle reads them --------------------------------------------------------------------


AGENT = MemAgentConfig(chunk_size=64, max_memory_tokens=128, max_final_tokens=48,
                       temperature=0)


def test_the_oracle_keeps_the_gold_fact_and_answers_it(tiny_tokenizer, tmp_path):
    train = make_biography_records(4, 8, seed=5, split="train")
    write_biography_eval(tmp_path, [8], num_questions=4, seed=5)
    held_out = load_ruler_hqa_dir(tmp_path, [8])[8]
    for records in (train, held_out):
        oracle = OracleGenerator(tiny_tokenizer, records, AGENT)
        trajs = MemAgentQATask(AGENT).rollout(oracle, records, num_samples=1, seed=0)
        for t, r in zip(trajs, records, strict=True):
            assert t.details.num_chunks >= 3
            assert t.details.memories[-1] == r.facts[0]
            assert t.details.final_response == f"\\boxed{{{r.answers[0]}}}"
            assert t.answer == r.answers[0] and t.reward == 1.0


def test_the_oracle_answers_where_the_prompts_ask_and_is_scored_there(tiny_tokenizer):
    """Prompts `memagent-answer-is` (the published evaluation's final prompt): the oracle
    answers "Therefore, the answer is ...", and both the training format and the published
    protocol read that answer; the boxed format would read none."""
    records = make_biography_records(3, 6, seed=2, split="train")
    agent = AGENT.model_copy(update={"prompts": "memagent-answer-is"})
    for protocol in ("memagent-boxed", "memagent"):
        trajs = MemAgentQATask(agent, protocol=protocol).rollout(
            OracleGenerator(tiny_tokenizer, records, agent), records, num_samples=1, seed=0)
        for t, r in zip(trajs, records, strict=True):
            assert t.details.final_response == f"Therefore, the answer is {r.answers[0]}."
            assert t.answer == r.answers[0] and t.metrics["sub_em"] == 1.0
    assert score_trajectory(trajs[0], records[0]).answer is None  # boxed: no \\boxed{}


def test_hard_distractor_is_a_namesakes_sentence_about_the_asked_attribute():
    record = QARecord(id="q", question="In which country was Dajal Xyz born?", answers=["Peru"],
                      context="Dajal Xyz works as a baker. Dajal Abc was born in Chile. "
                              "Dajal Xyz was born in Peru. Mika Lo was born in Fiji.",
                      facts=["Dajal Xyz was born in Peru."])
    assert hard_distractor(record, record.facts) == "Dajal Abc was born in Chile."
    assert hard_distractor(record.model_copy(update={"question": "Zzz?"}), record.facts) is None
    assert corrected("any", 1.0) and not corrected("any", 0.0)
    ids = [f"bio-{i}" for i in range(400)]
    assert 0.2 < sum(corrected(i, 0.25) for i in ids) / len(ids) < 0.3


def test_oracle_corrections_train_the_recovery_never_the_mistake(tiny_tokenizer):
    """With oracle_corrections=1 every episode whose hard distractor is read before its last
    chunk shows, at the next update, a memory holding that sentence, answered with the right
    memory; the update that wrote it is not in the trajectory."""
    records = make_biography_records(6, 8, seed=5, split="train")
    agent = AGENT.model_copy(update={"oracle_corrections": 1.0})
    plain = MemAgentQATask(AGENT).rollout(OracleGenerator(tiny_tokenizer, records, AGENT),
                                          records, num_samples=1, seed=0)
    oracle = OracleGenerator(tiny_tokenizer, records, agent)
    trajs = MemAgentQATask(agent).rollout(oracle, records, num_samples=1, seed=0)
    assert len({rid for rid, _ in oracle.mistakes}) == len(records)
    recovered = 0
    for t, p, r in zip(trajs, plain, records, strict=True):
        (k,) = [k for rid, k in oracle.mistakes if rid == r.id]
        wrong = hard_distractor(r, r.facts)
        assert len(t.turns) == len(p.turns) - 1  # the mistaken update is dropped
        assert [u.detail.chunk_index for u in t.turns if u.kind == "memory_update"] == [
            i for i in range(t.details.num_chunks) if i != k]
        assert wrong in t.details.memories[k] and wrong not in p.details.memories[k]
        after = next(iter(u for u in t.turns if u.detail.chunk_index in (k + 1, None)))
        assert wrong in tiny_tokenizer.decode(after.prompt_ids)  # the next prompt shows it
        assert wrong not in after.response_text  # ... and the answer drops it
        recovered += after.kind == "memory_update"
        assert t.details.final_response == p.details.final_response  # still the gold answer
    assert recovered >= 1


# --- the command line -------------------------------------------------------------------------


def test_cli_writes_the_task_deterministically(tmp_path, capsys):
    args = ["prepare", "biographies", "--out", str(tmp_path / "a"), "train_questions=12",
            "train_docs=5", "val_questions=3", "eval_questions=4", "num_docs=[5,10]", "seed=7"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("wrote") == 4 and "eval_10.json" in out
    assert load_hotpotqa(tmp_path / "a" / "train.jsonl") == \
        make_biography_records(12, 5, 7, split="train")
    assert len(load_ruler_hqa_dir(tmp_path / "a", [5, 10])[10]) == 4
    args[3] = str(tmp_path / "b")
    assert main(args) == 0
    for name in ("train.jsonl", "val.jsonl", "eval_5.json", "eval_10.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert main(["prepare", "biographies", "--out", str(tmp_path / "c"), "split=eval",
                 "eval_questions=2", "num_docs=3"]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["eval_3.json"]


@pytest.mark.parametrize("extra, message", [
    (["split=dev"], "split: must be one of all, train, eval"),
    (["hard_share=2"], "hard_share must be a number from 0 to 1"),
    (["split=train", "num_docs=[8]"], "num_docs: sets the evaluation files' N"),
    (["train_docs=0"], "num_docs must be an integer of at least 1"),
    (["split=eval", "eval_questions=0"], "num_questions must be an integer"),
    (["num_docs=[]"], "num_docs: Value should have at least 1 item"),
])
def test_cli_bad_arguments_are_one_line_errors(tmp_path, capsys, extra, message):
    assert main(["prepare", "biographies", "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


_NAME_PART = st.from_regex(r"[A-Z][a-z]{1,12}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(first=_NAME_PART, last=_NAME_PART)
def test_asked_person_reads_back_the_name_of_every_question_paraphrase(first, last):
    """`asked_person` inverts `biography_question` over every kind's train and eval
    paraphrases; a question of no paraphrase gives None."""
    name = f"{first} {last}"
    for by_split in QUESTIONS.values():
        for templates in by_split.values():
            for template in templates:
                assert asked_person(biography_question(template, name)) == name
    assert asked_person(f"Who is {name}?") is None
    assert asked_person("") is None


def test_asked_person_on_generated_questions():
    for q in biography_questions(40, 8, seed=3, split="eval"):
        assert asked_person(q.question) is not None
        assert asked_person(q.question) in q.fact


def test_biography_paragraphs_are_a_prefix_stable_filler_of_the_split():
    """Filler of other tasks (memrl.data.state_tracking): paragraph k depends only on
    (seed, split, k); its people are the split's."""
    for split in SPLITS:
        many = biography_paragraphs(12, 3, split=split)
        assert biography_paragraphs(5, 3, split=split) == many[:5]
        assert biography_paragraphs(5, 4, split=split) != many[:5]
        firsts = set(vocabulary().first_names[split])
        assert all(any(w in firsts for w in re.findall(r"[A-Z][a-z]+", p)) for p in many)
        assert all(2 <= p.count(". ") + 1 <= 4 for p in many)
    with pytest.raises(MemrlInputError, match="split must be one of"):
        biography_paragraphs(1, split="test")
