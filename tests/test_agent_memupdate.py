"""MemoryUpdate agent: prompts, tool loop, lockstep batching, isolation of trial memories."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.inference.base import derive_seed, request_params
from memrl.agents.memupdate import (
    SYSTEM_PROMPT,
    MemoryUpdateAgent,
    MemUpdateConfig,
    create_base_namespace,
    dialogue_pieces,
    memory_diff,
    render_dialogue,
    render_memory_view,
)
from memrl.data.locomo import DialogueTurn, MemoryEpisode, MemoryFact
from memrl.inference.scripted import ScriptedGenerator
from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import MemoryStore
from memrl.memory.tools import tools_prompt


def make_episode(eid: str, lines: list[str], memory: list[str], **kw) -> MemoryEpisode:
    """An episode whose dialogue alternates Ann / Bob in session 1 (ids D1:1, D1:2, ...)."""
    dialogue = [
        DialogueTurn(session=1, dia_id=f"D1:{k + 1}", speaker="Ann" if k % 2 == 0 else "Bob",
                     text=text, date="1 May 2023")
        for k, text in enumerate(lines)
    ]
    fields = dict(
        id=eid, sample_id="conv-x", qa_index=0, question="What does Ann like?",
        answers=["tea"], category=4, adversarial=False, evidence=["D1:1"],
        evidence_sessions=[1], dialogue=dialogue,
        initial_memory=[MemoryFact(text=t, source="D9:1") for t in memory],
    )
    fields.update(kw)
    return MemoryEpisode(**fields)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def last_message(prompt: str) -> str:
    """Role and content of the last message before the generation prompt."""
    return prompt.rsplit("<|im_start|>", 2)[-2]


@pytest.fixture
def store():
    return MemoryStore(HashingEmbedder())


def setup_agent(tokenizer, store, respond, episodes, **config):
    for e in episodes:
        create_base_namespace(store, e)
    gen = ScriptedGenerator(tokenizer, respond)
    cfg = MemUpdateConfig(embedder="hashing", **config)
    return MemoryUpdateAgent(gen, store, cfg), gen


# ---- rendering ------------------------------------------------------------------------


def test_render_dialogue_and_pieces():
    ep = make_episode("e", ["Hi Bob!", "Hi Ann."], [])
    assert render_dialogue(ep.dialogue) == (
        "Session 1 (1 May 2023)\n[D1:1] Ann: Hi Bob!\n[D1:2] Bob: Hi Ann."
    )
    assert render_dialogue([]) == "(no dialogue)"
    turns = make_episode("e", list("abcde"), []).dialogue
    assert [len(p) for p in dialogue_pieces(turns, 2)] == [2, 2, 1]
    assert [len(p) for p in dialogue_pieces(turns, None)] == [5]
    assert dialogue_pieces([], 3) == [[]]


def test_render_memory_view():
    assert render_memory_view([], 0) == "The memory holds 0 entries."
    assert render_memory_view([], 3) == (
        "The memory holds 3 entries. Use memory_search to look them up."
    )
    assert render_memory_view([("m0", "Ann likes tea.")], 1) == (
        "The memory holds 1 entry. The most related ones:\n[m0] Ann likes tea."
    )
    assert render_memory_view([("m0", "x")], 2).endswith("Use memory_search to find others.")


def test_memory_diff():
    diff = memory_diff({"m0": "a", "m1": "b", "m2": "c"}, {"m0": "a", "m1": "B", "m3": "d"})
    assert (diff["added"], diff["removed"], diff["changed"]) == (1, 1, 1)
    assert diff["added_texts"] == [{"id": "m3", "text": "d"}]
    assert diff["removed_texts"] == [{"id": "m2", "text": "c"}]
    assert diff["changed_texts"] == [{"id": "m1", "before": "b", "after": "B"}]


# ---- the loop -------------------------------------------------------------------------


def test_first_prompt_shows_dialogue_memory_and_tools_not_question(tiny_tokenizer, store):
    ep = make_episode("e", ["I love green tea.", "Nice."], ["Ann likes tea.", "Bob runs."])
    prompts = []

    def respond(prompt):
        prompts.append(prompt)
        return "Nothing to store."

    agent, gen = setup_agent(tiny_tokenizer, store, respond, [ep], memory_view_k=1)
    (traj,) = agent.run([ep])
    assert gen.calls == [1]
    prompt = prompts[0]
    assert SYSTEM_PROMPT in prompt and tools_prompt() in prompt  # ChatML ignores tools=
    assert "[D1:1] Ann: I love green tea." in prompt
    assert "The memory holds 2 entries. The most related ones:\n[m0] Ann likes tea." in prompt
    assert ep.question not in prompt
    # No tool call: the piece (here the whole dialogue) is done after one reply.
    assert len(traj.turns) == 1 and traj.turns[0].kind == "tool"
    assert traj.details.turns == 1 and traj.details.format_error_turns == 0
    store.release(traj.details.namespace)


def test_tool_responses_are_prompt_tokens_not_response_tokens(tiny_tokenizer, store):
    ep = make_episode("e", ["I love green tea."], ["Ann likes tea."])
    replies = {
        "user": call("memory_insert", text="Ann loves green tea."),
        "tool": call("memory_search", query="tea", top_k=2),
    }

    def respond(prompt):
        last = last_message(prompt)
        if last.startswith("tool") and "[{" in last:
            return "Done."
        return replies["user" if last.startswith("user") else "tool"]

    agent, _ = setup_agent(tiny_tokenizer, store, respond, [ep], max_turns=5)
    (traj,) = agent.run([ep])
    assert [t.detail.turn_in_piece for t in traj.turns] == [0, 1, 2]
    for turn in traj.turns:
        response = tiny_tokenizer.decode(turn.response_ids)
        assert response == turn.response_text
        assert "<tool_response>" not in response
        assert len(turn.response_logprobs) == len(turn.response_ids)
    texts = [tiny_tokenizer.decode(t.prompt_ids) for t in traj.turns]
    # Each prompt is the whole conversation so far: it extends the previous one.
    for before, after, turn in zip(texts, texts[1:], traj.turns, strict=False):
        assert after.startswith(before)
        assert turn.response_text in after[len(before):]
    assert '<|im_start|>tool\n<tool_response>\n{"id": "m1", "result": "inserted"}' in texts[1]
    assert "Ann loves green tea." in texts[2].split("<tool_response>")[-1]  # search hit
    assert traj.details.ops == {"insert": 1, "update": 0, "delete": 0, "search": 1}
    assert traj.details.memory_before["count"] == 1 and traj.details.memory_after["count"] == 2
    assert [c["name"] for c in traj.details.calls] == ["memory_insert", "memory_search"]
    assert not store.get(ep.id, "m0").text.startswith("Ann loves")  # base untouched
    assert len(store.list(ep.id)) == 1


def test_lockstep_batches_every_active_episode(tiny_tokenizer, store):
    """Turn k of every unfinished (episode, sample) goes in one generate call."""
    long = make_episode("long", list("abcdef"), ["x"])  # 2 pieces of 3 turns
    short = make_episode("short", list("ab"), ["y"])  # 1 piece

    def respond(prompt):
        return call("memory_search", query="anything")

    agent, gen = setup_agent(tiny_tokenizer, store, respond, [long, short],
                             max_turns=2, session_chunk_turns=3)
    trajs = agent.run([long, short], num_samples=2)
    assert [(t.record_id, t.sample_index) for t in trajs] == [
        ("long", 0), ("long", 1), ("short", 0), ("short", 1)]
    assert gen.calls == [4, 4, 2, 2]
    assert [len(t.turns) for t in trajs] == [4, 4, 2, 2]
    assert [t.detail.piece for t in trajs[0].turns] == [0, 0, 1, 1]
    assert trajs[0].details.pieces == 2 and trajs[2].details.pieces == 1
    assert len({t.details.namespace for t in trajs}) == 4


def test_two_trials_of_one_base_never_see_each_other(tiny_tokenizer, store):
    """Two samples of one episode insert different secrets, then search for secrets."""
    ep = make_episode("iso", ["Hello."], ["Ann likes tea."])
    counter = iter(range(100))
    final_prompts = []

    def respond(prompt):
        last = last_message(prompt)
        if last.startswith("user"):
            return call("memory_insert", text=f"secret number {next(counter)}")
        if '"inserted"' in last:
            return call("memory_search", query="secret number", top_k=10)
        final_prompts.append(last)
        return "Done."

    agent, gen = setup_agent(tiny_tokenizer, store, respond, [ep], max_turns=3)
    t0, t1 = agent.run([ep], num_samples=2)
    assert gen.calls == [2, 2, 2]  # the edits of the two trials interleave
    texts0 = {r.text for r in store.list(t0.details.namespace)}
    texts1 = {r.text for r in store.list(t1.details.namespace)}
    assert "secret number 0" in texts0 and "secret number 1" not in texts0
    assert "secret number 1" in texts1 and "secret number 0" not in texts1
    assert "secret number 0" in final_prompts[0] and "secret number 1" not in final_prompts[0]
    assert "secret number 1" in final_prompts[1] and "secret number 0" not in final_prompts[1]
    assert [r.text for r in store.list(ep.id)] == ["Ann likes tea."]
    # Ids continue the base's counter in each trial, independently.
    assert store.list(t0.details.namespace)[-1].id == store.list(t1.details.namespace)[-1].id


def test_extra_parallel_calls_are_skipped_and_counted(tiny_tokenizer, store):
    ep = make_episode("par", ["Hello."], [])
    prompts = []

    def respond(prompt):
        prompts.append(prompt)
        if last_message(prompt).startswith("user"):
            return "".join(call("memory_insert", text=f"fact {i}") for i in range(3))
        return "Done."

    agent, _ = setup_agent(tiny_tokenizer, store, respond, [ep], max_parallel_calls=2)
    (traj,) = agent.run([ep])
    assert traj.details.ops["insert"] == 2
    assert traj.details.format_errors == {"too_many_calls": 1}
    assert traj.details.format_error_turns == 1
    assert traj.turns[0].detail.format_errors == ("too_many_calls",)
    assert "Error: 3 tool calls in one reply; only the first 2 were run, 1 skipped" in prompts[1]
    assert [r.text for r in store.list(traj.details.namespace)] == ["fact 0", "fact 1"]


def test_garbage_replies_cost_every_turn_and_change_nothing(tiny_tokenizer, store):
    ep = make_episode("junk", ["Hello."], ["Ann likes tea."])

    def respond(prompt):
        return '<tool_call>{"name": "memory_insert", "arguments": {"text": </tool_call> <tool_call>'

    agent, gen = setup_agent(tiny_tokenizer, store, respond, [ep], max_turns=3)
    (traj,) = agent.run([ep])
    assert gen.calls == [1, 1, 1]  # errors are shown to the model, so it goes on
    assert traj.details.format_error_turns == 3
    assert traj.details.format_errors == {"invalid_json": 3, "unclosed": 3}
    assert traj.details.memory_after == traj.details.memory_before
    assert "Error: tool call 1: not valid JSON" in tiny_tokenizer.decode(traj.turns[1].prompt_ids)


def test_tool_response_truncated(tiny_tokenizer, store):
    ep = make_episode("trunc", ["Hello."], [f"memory number {i} " * 5 for i in range(20)])
    prompts = []

    def respond(prompt):
        prompts.append(prompt)
        if last_message(prompt).startswith("user"):
            return call("memory_search", query="memory number", top_k=20)
        return "Done."

    agent, _ = setup_agent(tiny_tokenizer, store, respond, [ep], max_tool_response_length=120,
                           memory_view_k=0)
    agent.run([ep])
    body = last_message(prompts[1]).split("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
    assert len(body) == 120 and body.endswith("...[truncated]")


def test_keep_token_ids_false_and_seeds(tiny_tokenizer, store):
    ep = make_episode("ids", ["Hello."], [])
    seeds = []

    class Recording(ScriptedGenerator):
        def generate(self, prompts, params):
            seeds.extend(p.seed for p in request_params(prompts, params))
            return super().generate(prompts, params)

    create_base_namespace(store, ep)
    gen = Recording(tiny_tokenizer, lambda p: call("memory_search", query="x"))
    agent = MemoryUpdateAgent(gen, store, MemUpdateConfig(max_turns=3, seed=5))
    (traj,) = agent.run([ep], keep_token_ids=False)
    assert all(t.prompt_ids == [] and t.response_ids == [] for t in traj.turns)
    assert all(t.prompt_tokens > 0 for t in traj.turns)
    assert seeds == [derive_seed(5, "ids", 0, 0, t) for t in range(3)]  # reply t of the episode
    agent.run([ep], seed=100)
    assert seeds[3:] == [derive_seed(100, "ids", 0, 0, t) for t in range(3)]


def test_template_with_tools_gets_tools_argument(tiny_tokenizer, store):
    """A Qwen-style template renders `tools=` and wraps tool messages itself."""
    template = (
        "{% if tools %}<|im_start|>system\nTOOLS:{{ tools | length }}<|im_end|>\n{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
        "{{ m['content'] }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tok.chat_template = template
    ep = make_episode("qwen", ["Hello."], [])
    prompts = []

    def respond(prompt):
        prompts.append(prompt)
        return call("memory_insert", text="Ann said hello.") if len(prompts) == 1 else "Done."

    agent, _ = setup_agent(tok, store, respond, [ep])
    agent.run([ep])
    assert "TOOLS:4" in prompts[0] and tools_prompt() not in prompts[0]
    assert prompts[1].count("<tool_response>") == 1  # wrapped once, by the template


def test_unknown_base_namespace_is_an_error(tiny_tokenizer, store):
    ep = make_episode("missing", ["Hello."], [])
    agent = MemoryUpdateAgent(ScriptedGenerator(tiny_tokenizer, lambda p: ""), store)
    with pytest.raises(Exception, match="unknown namespace"):
        agent.run([ep])
    with pytest.raises(ValueError):
        agent.run([ep], num_samples=0)


_FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", '{"name": "memory_insert", "arguments": {"text": "x"}}',
    '{"name": "memory_delete", "arguments": {"id": "m0"}}', '{"name": "memory_update", '
    '"arguments": {"id": "m9", "text": "y"}}', '{"name": "nope"}', "{", "}", '"', "```json\n",
    '{"name": "memory_search", "arguments": {"query": "q", "top_k": 0}}', "hello", "\n",
])


@settings(max_examples=25, deadline=None)
@given(replies=st.lists(st.lists(_FRAGMENTS, max_size=6).map("".join), min_size=1, max_size=3))
def test_any_model_output_never_raises(tiny_tokenizer, replies):
    store = MemoryStore(HashingEmbedder(16))
    ep = make_episode("fuzz", ["Hello."], ["Ann likes tea."])
    it = iter(replies * 10)
    agent, _ = setup_agent(tiny_tokenizer, store, lambda p: next(it), [ep], max_turns=3,
                           max_parallel_calls=2)
    (traj,) = agent.run([ep])
    assert 1 <= traj.details.turns <= 3
    assert 0 <= traj.details.format_error_turns <= traj.details.turns
    assert [r.text for r in store.list(ep.id)] == ["Ann likes tea."]
