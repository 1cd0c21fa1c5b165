"""MemAgent: prompts byte for byte, chunking, memory overwrite, lockstep batching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memrl.agents import (
    PROMPT_PRESETS,
    MemAgent,
    MemAgentConfig,
    MemAgentDetails,
    MemAgentPrompts,
    MemAgentTurn,
    ProgressEvent,
    chunk_context,
    resolve_prompts,
    rich_progress_callback,
    split_token_ids,
)
from memrl.agents.prompts import fill_template
from memrl.inference.base import derive_seed, request_params
from memrl.inference.chat import encode_chat, render_chat
from memrl.data.records import Document, QARecord
from memrl.errors import MemrlInputError
from memrl.inference.scripted import ScriptedGenerator

# The published MemAgent prompts: the compatibility spec, written out literally.
UPDATE = (
    "You are presented with a problem, a section of an article that may contain the answer to "
    "the problem, and a previous memory. Please read the provided section carefully and update "
    "the memory with the new information that helps to answer the problem. Be sure to retain "
    "all relevant details from the previous memory while adding any new, useful information."
    "\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n<section>\n"
    "{chunk}\n</section>\n\nUpdated memory:\n"
)
FINAL = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{}.\n\n<problem> \n{prompt}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)
NO_MEMORY = "No previous memory"


def record(rid: str, context: str, question: str = "Who?", answer: str = "Paris") -> QARecord:
    return QARecord(id=rid, question=question, answers=[answer], context=context)


def context_of(tokenizer, num_tokens: int, tag: str) -> str:
    """A context of exactly `num_tokens` tokens that contains `tag`'s letters."""
    words = " ".join(f"{tag}{i}" for i in range(num_tokens))
    ids = tokenizer.encode(words, add_special_tokens=False)[:num_tokens]
    text = tokenizer.decode(ids)
    assert len(tokenizer.encode(text, add_special_tokens=False)) == num_tokens
    return text


# ---------------------------------------------------------------- prompts


def test_memagent_preset_is_the_published_prompt_byte_for_byte():
    preset = PROMPT_PRESETS["memagent"]
    assert preset.update_template == UPDATE
    assert preset.final_template == FINAL
    assert preset.no_memory == NO_MEMORY
    assert "\\boxed{}" in preset.final_template and "\\\\" not in preset.final_template
    assert resolve_prompts("memagent") is preset


def test_published_preset_asks_for_doubled_braces_byte_for_byte(tiny_tokenizer):
    """The published 7B / 14B training runs' final prompt: MemAgent's sync agent never
    formats TEMPLATE_FINAL_BOXED, so the model reads `\\boxed{{}}`; everything else is the
    `memagent` preset's."""
    preset = PROMPT_PRESETS["memagent-published"]
    memagent = PROMPT_PRESETS["memagent"]
    assert preset.update_template == UPDATE and preset.no_memory == NO_MEMORY
    text = preset.final_text(prompt="Who? {memory}", memory="M {prompt}")
    assert text == (
        "You are presented with a problem and a previous memory. Please answer the problem "
        "based on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n"
        "Who? {memory}\n</problem>\n\n<memory>\nM {prompt}\n</memory>\n\nYour answer:\n")
    assert text.encode() == memagent.final_text(prompt="Who? {memory}", memory="M {prompt}"
                                                ).encode().replace(b"\\boxed{}",
                                                                   b"\\boxed{{}}")
    # and so through the agent's chat rendering: the braces reach the model doubled
    agent = MemAgent(scripted(tiny_tokenizer), MemAgentConfig(prompts="memagent-published"))
    rendered = tiny_tokenizer.decode(agent.final_prompt_ids("Who?", "M"))
    assert rendered == render_chat(tiny_tokenizer, preset.final_text(prompt="Who?", memory="M"))
    assert rendered.count("\\boxed{{}}") == 1 and "\\boxed{}" not in rendered


def test_fill_template_keeps_braces_in_values_and_template():
    text = PROMPT_PRESETS["memagent"].update_text(
        prompt="What is {x}?", memory="{chunk} and {}", chunk="f(x) = {a: 1} {0} {memory}"
    )
    assert text == (
        UPDATE.replace("{prompt}", "What is {x}?")
        .replace("{memory}", "{chunk} and {}", 1)
        .replace("{chunk}\n</section>", "f(x) = {a: 1} {0} {memory}\n</section>")
    )
    final = PROMPT_PRESETS["memagent"].final_text(prompt="Q", memory="M")
    assert final.endswith("put the answer in \\boxed{}.\n\n<problem> \nQ\n</problem>\n\n"
                          "<memory>\nM\n</memory>\n\nYour answer:\n")
    assert fill_template("{prompt}{other}{chunk}", prompt="p") == "p{other}{chunk}"


def test_custom_prompts_must_have_their_placeholders():
    with pytest.raises(ValidationError, match=r"\{chunk\}"):
        MemAgentPrompts(update_template="{prompt} {memory}")
    with pytest.raises(ValidationError, match=r"\{memory\}"):
        MemAgentPrompts(final_template="{prompt}")
    custom = MemAgentPrompts(update_template="Q={prompt} M={memory} C={chunk}", no_memory="-")
    assert custom.update_text(prompt="q", memory="m", chunk="c") == "Q=q M=m C=c"
    with pytest.raises(MemrlInputError, match="unknown prompt preset 'nope'"):
        resolve_prompts("nope")
    with pytest.raises(MemrlInputError, match="final_template"):
        resolve_prompts({"final_template": "no placeholders"})
    with pytest.raises(ValidationError, match="unknown prompt preset"):
        MemAgentConfig(prompts="nope")


def test_encode_chat_is_the_rendered_single_user_message(tiny_tokenizer):
    rendered = render_chat(tiny_tokenizer, "hello {x}")
    assert rendered == "<|im_start|>user\nhello {x}<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_chat(tiny_tokenizer, "hello {x}")
    assert ids == tiny_tokenizer.encode(rendered, add_special_tokens=False)
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")


# ---------------------------------------------------------------- chunking


def test_split_token_ids_exact():
    ids = list(range(100, 110))
    assert split_token_ids(ids, 4) == ([[100, 101, 102, 103], [104, 105, 106, 107], [108, 109]],
                                       False)
    assert split_token_ids(ids, 4, max_chunks=2) == ([[100, 101, 102, 103],
                                                      [104, 105, 106, 107]], True)
    assert split_token_ids(ids, 5, max_chunks=2) == ([ids[:5], ids[5:]], False)
    assert split_token_ids([], 3) == ([], False)
    with pytest.raises(ValueError):
        split_token_ids(ids, 0)


def test_chunk_context_decodes_each_chunk(tiny_tokenizer):
    text = context_of(tiny_tokenizer, 10, "w")
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    chunks = chunk_context(tiny_tokenizer, text, chunk_size=4)
    assert chunks.token_counts == [4, 4, 2]
    assert chunks.texts == [tiny_tokenizer.decode(ids[i : i + 4]) for i in (0, 4, 8)]
    assert "".join(chunks.texts) == text
    assert chunks.context_tokens == 10 and not chunks.capped
    capped = chunk_context(tiny_tokenizer, text, chunk_size=4, max_chunks=2)
    assert capped.texts == chunks.texts[:2] and capped.capped and capped.context_tokens == 10
    assert chunk_context(tiny_tokenizer, "", chunk_size=4).num_chunks == 0


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=300), chunk_size=st.integers(1, 50),
       max_chunks=st.none() | st.integers(1, 5))
def test_chunks_cover_the_context_exactly_once(tiny_tokenizer, text, chunk_size, max_chunks):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    pieces, capped = split_token_ids(ids, chunk_size, max_chunks)
    flat = [t for piece in pieces for t in piece]
    assert flat == (ids if not capped else ids[: max_chunks * chunk_size])
    assert all(len(piece) == chunk_size for piece in pieces[:-1])
    assert capped == (max_chunks is not None and len(ids) > max_chunks * chunk_size)
    chunks = chunk_context(tiny_tokenizer, text, chunk_size, max_chunks)
    assert chunks.texts == [tiny_tokenizer.decode(piece) for piece in pieces]
    assert chunks.token_counts == [len(piece) for piece in pieces]
    assert chunks.context_tokens == len(ids) and chunks.capped == capped


# ---------------------------------------------------------------- the agent


def scripted(tokenizer):
    """Updates answer "memory <n>" (n counts update calls); finals answer \\boxed{Paris}."""
    counter = {"n": 0}

    def respond(prompt: str) -> str:
        if "Updated memory:" in prompt:
            counter["n"] += 1
            return f"memory {counter['n']}"
        return "The answer is \\boxed{Paris}."

    return ScriptedGenerator(tokenizer, respond)


def test_memory_is_overwritten_and_prompts_match_the_preset(tiny_tokenizer):
    tok = tiny_tokenizer
    rec = record("r0", context_of(tok, 12, "doc"), question="Where {is} it?")
    agent = MemAgent(scripted(tok), MemAgentConfig(chunk_size=5))
    [traj] = agent.run([rec])
    chunks = chunk_context(tok, rec.context, 5)
    assert chunks.num_chunks == 3
    assert [t.kind for t in traj.turns] == ["memory_update"] * 3 + ["final"]

    memory = NO_MEMORY
    for k, turn in enumerate(traj.turns[:3]):
        expected = render_chat(
            tok, UPDATE.replace("{prompt}", rec.question).replace("{memory}", memory)
            .replace("{chunk}", chunks.texts[k])
        )
        assert tok.decode(turn.prompt_ids, skip_special_tokens=False) == expected
        assert turn.prompt_ids == tok.encode(expected, add_special_tokens=False)
        assert turn.detail == MemAgentTurn(chunk_index=k)
        assert (turn.prompt_tokens, turn.response_tokens) == (len(turn.prompt_ids),
                                                              len(turn.response_ids))
        assert turn.response_text == f"memory {k + 1}"
        assert turn.response_ids == tok.encode(f"memory {k + 1}", add_special_tokens=False)
        assert len(turn.response_logprobs) == len(turn.response_ids)
        memory = turn.response_text

    final = traj.turns[-1]
    expected = render_chat(tok, FINAL.replace("{prompt}", rec.question).replace("{memory}", memory))
    final_text = tok.decode(final.prompt_ids, skip_special_tokens=False)
    assert final_text == expected
    assert "memory 3" in final_text and "memory 2" not in final_text
    assert not any(c in final_text for c in chunks.texts)
    assert traj.answer is None  # the agent does not extract answers: its task does
    assert final.detail == MemAgentTurn(chunk_index=None)
    assert traj.details == MemAgentDetails(
        memories=("memory 1", "memory 2", "memory 3"),
        num_chunks=3,
        context_tokens=12,
        capped=False,
        final_response="The answer is \\boxed{Paris}.",
    )
    assert traj.record_id == "r0" and traj.sample_index == 0 and traj.reward is None


def test_keep_token_ids_false_drops_ids_but_keeps_counts_and_texts(tiny_tokenizer):
    tok = tiny_tokenizer
    rec = record("r0", context_of(tok, 12, "doc"))
    full = MemAgent(scripted(tok), MemAgentConfig(chunk_size=5)).run([rec])[0]
    agent = MemAgent(scripted(tok), MemAgentConfig(chunk_size=5))
    light = agent.run([rec], keep_token_ids=False)[0]
    assert light.details == full.details and light.answer == full.answer
    for a, b in zip(full.turns, light.turns, strict=True):
        assert (b.prompt_ids, b.response_ids, b.response_logprobs) == ([], [], [])
        assert (a.prompt_tokens, a.response_tokens, a.detail) == (
            b.prompt_tokens, b.response_tokens, b.detail)
        assert a.response_text == b.response_text
        assert b.prompt_tokens == len(a.prompt_ids) > 0
        assert b.response_tokens == len(a.response_ids) > 0


def test_documents_are_rendered_and_braces_in_them_survive(tiny_tokenizer):
    docs = [Document(title="T{1}", text="set {a, b} and {}"), Document(title="U", text="x")]
    rec = QARecord(id="d", question="Q?", answers=["a"], documents=docs)
    agent = MemAgent(scripted(tiny_tokenizer), MemAgentConfig(chunk_size=10_000))
    [traj] = agent.run([rec])
    prompt = tiny_tokenizer.decode(traj.turns[0].prompt_ids, skip_special_tokens=False)
    section = "<section>\nDocument 1:\nT{1}\nset {a, b} and {}\n\nDocument 2:\nU\nx\n</section>"
    assert section in prompt


def test_lockstep_batching_one_call_per_step_then_one_final_call(tiny_tokenizer):
    tok = tiny_tokenizer
    records = [
        record("a", context_of(tok, 9, "a")),  # 3 chunks of 3
        record("b", context_of(tok, 3, "b")),  # 1 chunk
        record("c", context_of(tok, 5, "c")),  # 2 chunks
        record("d", ""),  # no chunk: final turn only
    ]
    gen = scripted(tok)
    trajs = MemAgent(gen, MemAgentConfig(chunk_size=3)).run(records, num_samples=2)
    assert gen.calls == [6, 4, 2, 8]
    assert [(t.record_id, t.sample_index) for t in trajs] == [
        (r, s) for r in "abcd" for s in range(2)
    ]
    assert [len(t.turns) for t in trajs] == [4, 4, 2, 2, 3, 3, 1, 1]
    empty = trajs[-1]
    assert empty.details.memories == () and empty.details.num_chunks == 0
    assert "<memory>\nNo previous memory\n</memory>" in tok.decode(empty.turns[0].prompt_ids)


def test_max_chunks_keeps_the_first_chunks_and_records_the_cap(tiny_tokenizer):
    tok = tiny_tokenizer
    rec = record("r", context_of(tok, 10, "z"))
    gen = scripted(tok)
    [traj] = MemAgent(gen, MemAgentConfig(chunk_size=3, max_chunks=2)).run([rec])
    assert gen.calls == [1, 1, 1]
    assert traj.details.num_chunks == 2 and traj.details.capped is True
    assert traj.details.context_tokens == 10
    chunks = chunk_context(tok, rec.context, 3)
    assert chunks.texts[1] in tok.decode(traj.turns[1].prompt_ids)


class RecordingGenerator(ScriptedGenerator):
    def __init__(self, tokenizer, respond):
        super().__init__(tokenizer, respond)
        self.params = []

    def generate(self, prompts, params):
        self.params += request_params(prompts, params)
        return super().generate(prompts, params)


def test_sampling_params_per_turn_kind_and_truncation(tiny_tokenizer):
    tok = tiny_tokenizer
    long = " ".join(["memory"] * 50)
    gen = RecordingGenerator(
        tok, lambda p: long if "Updated memory:" in p else long + " \\boxed{x}"
    )
    config = MemAgentConfig(chunk_size=4, max_memory_tokens=5, max_final_tokens=7,
                            temperature=0.3, top_p=0.9, seed=11)
    [traj] = MemAgent(gen, config).run([record("r", context_of(tok, 8, "q"))])
    assert [p.max_new_tokens for p in gen.params] == [5, 5, 7]
    # turn t of episode (record "r", occurrence 0, sample 0)
    assert [p.seed for p in gen.params] == [derive_seed(11, "r", 0, 0, t) for t in range(3)]
    assert len({p.seed for p in gen.params}) == 3
    assert {(p.temperature, p.top_p) for p in gen.params} == {(0.3, 0.9)}
    update = traj.turns[0]
    assert len(update.response_ids) == 5 and update.finish_reason == "length" and update.truncated
    assert traj.details.memories[0] == tok.decode(update.response_ids)
    assert traj.turns[1].prompt_ids  # the truncated memory is what the next prompt carries
    assert traj.details.memories[0] in tok.decode(traj.turns[1].prompt_ids)
    assert "\\boxed" not in traj.details.final_response  # the \boxed{} was cut off


def test_empty_memory_stays_empty_and_special_tokens_are_stripped(tiny_tokenizer):
    tok = tiny_tokenizer
    replies = iter(["", "kept<|im_end|>", "no box here"])
    gen = ScriptedGenerator(tok, lambda p: next(replies))
    [traj] = MemAgent(gen, MemAgentConfig(chunk_size=3)).run([record("r", context_of(tok, 6, "e"))])
    assert traj.details.memories == ("", "kept")
    assert "<memory>\n\n</memory>" in tok.decode(traj.turns[1].prompt_ids)
    assert traj.turns[1].response_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "<memory>\nkept\n</memory>" in tok.decode(traj.turns[2].prompt_ids)
    assert traj.details.final_response == "no box here"


def test_progress_events_and_rich_bars(tiny_tokenizer):
    from rich.progress import Progress

    tok = tiny_tokenizer
    records = [record("a", context_of(tok, 6, "a")), record("b", context_of(tok, 3, "b"))]
    events: list[ProgressEvent] = []
    MemAgent(scripted(tok), MemAgentConfig(chunk_size=3)).run(records, 2, events.append)
    # One event per turn, in the lockstep order: update 0 of the four episodes, update 1 of
    # the two with a second chunk, then the four final answers.
    assert events[0] == ProgressEvent("start", episodes=4, chunks=6)
    assert [(e.kind, e.episodes, e.chunks) for e in events[1:]] == (
        [("chunks", 0, 1)] * 6 + [("final", 1, 0)] * 4)
    assert [e.turn.detail.chunk_index for e in events[1:7]] == [0, 0, 0, 0, 1, 1]
    assert [e.turn.kind for e in events[7:]] == ["final"] * 4
    with Progress(disable=True) as progress:
        on_event = rich_progress_callback(progress, "N=1")
        for _ in range(2):  # totals grow across runs
            MemAgent(scripted(tok), MemAgentConfig(chunk_size=3)).run(records, 1, on_event)
        tasks = {t.description: t for t in progress.tasks}
    assert (tasks["N=1 episodes"].total, tasks["N=1 episodes"].completed) == (4, 4)
    assert (tasks["N=1 chunks"].total, tasks["N=1 chunks"].completed) == (6, 6)


def test_config_validation():
    with pytest.raises(ValidationError):
        MemAgentConfig(chunk_size=0)
    with pytest.raises(ValidationError):
        MemAgentConfig(top_p=0)
    with pytest.raises(ValidationError):
        MemAgentConfig(unknown=1)
    assert MemAgentConfig().resolved_prompts is PROMPT_PRESETS["memagent"]
    with pytest.raises(ValueError):
        MemAgent(ScriptedGenerator(None, str)).run([], num_samples=0)
    assert MemAgent(ScriptedGenerator(None, str)).run([]) == []
