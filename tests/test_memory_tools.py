"""Memory tools: schemas, parsing model output (never raising), execution, responses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import MemoryStore
from memrl.memory.tools import (
    TOOL_NAMES,
    TOOLS,
    TRUNCATION_MARKER,
    ToolCall,
    ToolParseResult,
    ToolResult,
    execute_tool_call,
    format_tool_response,
    tools_prompt,
    parse_tool_calls,
    truncate,
    validate_arguments,
)


def call_text(name: str, arguments, *, indent=None) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, indent=indent)
    return f"<tool_call>\n{body}\n</tool_call>"


# ---- schemas ----------------------------------------------------------------------------


def test_tool_schemas_shape():
    assert TOOL_NAMES == ("memory_insert", "memory_update", "memory_delete", "memory_search")
    for tool in TOOLS:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert set(fn) == {"name", "description", "parameters"} and fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert by_name["memory_update"]["required"] == ["id", "text"]
    top_k = by_name["memory_search"]["properties"]["top_k"]
    assert (top_k["type"], top_k["minimum"], top_k["maximum"], top_k["default"]) == (
        "integer", 1, 50, 5
    )
    assert by_name["memory_search"]["required"] == ["query"]
    json.dumps(TOOLS)  # serialisable for a chat template


def test_tools_prompt_matches_qwen_template_block():
    one = [TOOLS[2]]
    assert tools_prompt(one) == (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOLS[2])
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    full = tools_prompt()
    assert full.count("\n{\"type\": \"function\"") == 4
    assert all(name in full for name in TOOL_NAMES)


# ---- parsing: valid ------------------------------------------------------------------------


def test_parse_several_calls_with_surrounding_text():
    out = (
        "I will store two facts.\n"
        + call_text("memory_insert", {"text": "Alice moved to Oslo."})
        + "\nand then\n"
        + '<tool_call>  {"name": "memory_search", "arguments": {"query": "Oslo", "top_k": 3}}'
        + "</tool_call>"
        + call_text("memory_update", {"id": "m2", "text": "Bob is 31."}, indent=2)
        + call_text("memory_delete", {"id": "m0"})
    )
    res = parse_tool_calls(out)
    assert res.errors == [] and res.error_kinds == []
    assert res.calls == [
        ToolCall("memory_insert", {"text": "Alice moved to Oslo."}),
        ToolCall("memory_search", {"query": "Oslo", "top_k": 3}),
        ToolCall("memory_update", {"id": "m2", "text": "Bob is 31."}),
        ToolCall("memory_delete", {"id": "m0"}),
    ]


def test_parse_arguments_as_json_string_and_code_fence():
    doubled = json.dumps({"name": "memory_insert", "arguments": json.dumps({"text": "x y"})})
    fenced = '```json\n{"name": "memory_delete", "arguments": {"id": "m1"}}\n```'
    res = parse_tool_calls(f"<tool_call>{doubled}</tool_call><tool_call>\n{fenced}\n</tool_call>")
    assert res.errors == []
    assert res.calls == [ToolCall("memory_insert", {"text": "x y"}),
                         ToolCall("memory_delete", {"id": "m1"})]


def test_parse_no_calls():
    assert parse_tool_calls("Nothing to remember here.") == ToolParseResult()
    assert parse_tool_calls("") == ToolParseResult()


# ---- parsing: each error kind ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, fragment",
    [
        ("<tool_call>{\"name\": \"memory_insert\"", "unclosed", "never closed"),
        ('{"name": "memory_insert"}</tool_call>', "unopened", "without a matching"),
        ("<tool_call>{name: memory_insert}</tool_call>", "invalid_json", "not valid JSON"),
        ("<tool_call></tool_call>", "invalid_json", "not valid JSON"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "invalid_json", "not valid JSON"),
        ('<tool_call>["memory_insert"]</tool_call>', "bad_format", "got an array"),
        ('<tool_call>{"arguments": {}}</tool_call>', "bad_format", '"name" must be a string'),
        ('<tool_call>{"name": "memory_insert"}</tool_call>', "bad_format", 'missing "arguments"'),
        ('<tool_call>{"name": "memory_insert", "arguments": [1]}</tool_call>', "bad_format",
         "must be an object, got an array"),
        ('<tool_call>{"name": "memory_insert", "arguments": "{oops"}</tool_call>',
         "invalid_json", '"arguments" string is not valid JSON'),
        ('<tool_call>{"name": "memory_forget", "arguments": {}}</tool_call>', "unknown_tool",
         "unknown tool 'memory_forget'; available: memory_insert, memory_update"),
        (call_text("memory_insert", {}), "bad_arguments", 'missing argument "text"'),
        (call_text("memory_insert", {"text": "a", "tag": "b"}), "bad_arguments",
         "unexpected argument 'tag'"),
        (call_text("memory_insert", {"text": 5}), "bad_arguments",
         'argument "text" must be a string, got an integer'),
        (call_text("memory_insert", {"text": "  "}), "bad_arguments", "must not be empty"),
        (call_text("memory_update", {"id": None, "text": "a"}), "bad_arguments",
         'argument "id" must be a string, got null'),
        (call_text("memory_search", {"query": "q", "top_k": 0}), "bad_arguments",
         "between 1 and 50, got 0"),
        (call_text("memory_search", {"query": "q", "top_k": 51}), "bad_arguments",
         "between 1 and 50, got 51"),
        (call_text("memory_search", {"query": "q", "top_k": 2.5}), "bad_arguments",
         "must be an integer, got a number"),
        (call_text("memory_search", {"query": "q", "top_k": True}), "bad_arguments",
         "must be an integer, got a boolean"),
        (call_text("memory_search", {"query": "q", "top_k": "3"}), "bad_arguments",
         "must be an integer, got a string"),
    ],
)
def test_parse_error_kinds(text, kind, fragment):
    res = parse_tool_calls(text)
    assert res.calls == []
    assert res.error_kinds == [kind]
    assert len(res.errors) == 1 and fragment in res.errors[0]


def test_parse_mixed_valid_and_invalid_counts_each():
    out = (
        call_text("memory_insert", {"text": "ok one"})
        + "<tool_call>{broken</tool_call>"
        + "<tool_call>"  # unclosed: the next opening tag starts a new call
        + call_text("memory_delete", {"id": "m1", "why": "old"})
        + call_text("memory_search", {"query": "ok"})
        + "</tool_call>"
        + "<tool_call>{\"name\": \"memory_insert\""
    )
    res = parse_tool_calls(out)
    assert res.calls == [ToolCall("memory_insert", {"text": "ok one"}),
                         ToolCall("memory_search", {"query": "ok"})]
    assert res.error_kinds == ["invalid_json", "unclosed", "bad_arguments", "unopened", "unclosed"]
    assert [e.split(":")[0] for e in res.errors] == [
        "tool call 2", "tool call 3", "tool call 4 (memory_delete)",
        "found </tool_call> without a matching <tool_call>", "tool call 6",
    ]


def test_parse_long_unknown_name_is_shortened():
    res = parse_tool_calls(call_text("x" * 5000, {}))
    assert res.error_kinds == ["unknown_tool"] and len(res.errors[0]) < 200


def test_parse_non_string_input():
    res = parse_tool_calls(None)  # type: ignore[arg-type]
    assert res.calls == [] and res.error_kinds == ["bad_format"]


def test_validate_arguments_directly():
    assert validate_arguments("memory_search", {"query": "q"}) == []
    assert validate_arguments("memory_search", {}) == ['missing argument "query"']
    assert validate_arguments("nope", {}) == ["unknown tool 'nope'"]


# ---- parsing: properties ----------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                             max_size=3),
    max_leaves=10,
)
_PIECES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":",
                     '"memory_insert"', '"memory_search"', '"top_k"', "```json\n", "\n```"]),
    _JSON.map(lambda v: json.dumps(v)),
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}),
              st.sampled_from(TOOL_NAMES + ("other",)), _JSON),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_parse_never_raises(text):
    res = parse_tool_calls(text)
    assert len(res.errors) == len(res.error_kinds)
    for call in res.calls:
        assert call.name in TOOL_NAMES
        assert validate_arguments(call.name, call.arguments) == []
    # Each opening tag yields exactly one call or one error.
    assert text.count("<tool_call>") <= len(res.calls) + len(res.errors)


_NONBLANK = st.text(min_size=1, max_size=40).filter(lambda s: s.strip())
_VALID_CALL = st.one_of(
    st.builds(lambda t: ToolCall("memory_insert", {"text": t}), _NONBLANK),
    st.builds(lambda i, t: ToolCall("memory_update", {"id": i, "text": t}), _NONBLANK, _NONBLANK),
    st.builds(lambda i: ToolCall("memory_delete", {"id": i}), _NONBLANK),
    st.builds(lambda q: ToolCall("memory_search", {"query": q}), _NONBLANK),
    st.builds(lambda q, k: ToolCall("memory_search", {"query": q, "top_k": k}),
              _NONBLANK, st.integers(1, 50)),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_VALID_CALL, max_size=5),
    st.sampled_from(["", " ", "\n", "\n\n  "]),
    st.booleans(),
    st.text(alphabet=st.characters(exclude_characters="<"), max_size=20),
)
def test_valid_calls_round_trip(calls, pad, ascii_only, chatter):
    parts = []
    for c in calls:
        body = json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=ascii_only)
        parts.append(f"{chatter}<tool_call>{pad}{body}{pad}</tool_call>")
    res = parse_tool_calls("".join(parts) + chatter)
    assert res.errors == []
    assert res.calls == calls


# ---- execution ------------------------------------------------------------------------------


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore(HashingEmbedder())
    s.create_namespace("base", ["alice oslo", "bob tea"])
    s.fork("base", "t1")
    s.fork("base", "t2")
    return s


def test_execute_each_operation(store):
    ns = "base--t1"
    r = execute_tool_call(store, ns, ToolCall("memory_insert", {"text": "carol chess"}), step=4)
    assert r == ToolResult(True, '{"id": "m2", "result": "inserted"}', "insert")
    assert store.get(ns, "m2").created_step == 4

    r = execute_tool_call(store, ns, ToolCall("memory_update", {"id": "m0", "text": "alice"}),
                          step=5)
    assert r == ToolResult(True, '{"id": "m0", "result": "updated"}', "update")
    assert store.get(ns, "m0").text == "alice" and store.get(ns, "m0").updated_step == 5

    r = execute_tool_call(store, ns, ToolCall("memory_delete", {"id": "m1"}))
    assert r == ToolResult(True, '{"id": "m1", "result": "deleted"}', "delete")

    r = execute_tool_call(store, ns, ToolCall("memory_search", {"query": "Alice", "top_k": 1}))
    assert (r.ok, r.op) == (True, "search")
    assert json.loads(r.content) == [{"id": "m0", "text": "alice", "score": 1.0}]
    r = execute_tool_call(store, ns, ToolCall("memory_search", {"query": "chess"}))
    assert [h["id"] for h in json.loads(r.content)] == ["m2", "m0"]
    assert json.loads(r.content)[0]["score"] == pytest.approx(0.7071)

    # Only that namespace changed.
    assert {r.text for r in store.list("base--t2")} == {"alice oslo", "bob tea"}
    assert {r.text for r in store.list("base")} == {"alice oslo", "bob tea"}
    assert store.stats(ns) == {"count": 2, "chars": 5 + 11, "tokens": 3,
                               "inserts": 1, "updates": 1, "deletes": 1}


def test_execute_errors_become_results(store):
    cases = [
        (ToolCall("memory_update", {"id": "m7", "text": "x"}), "update", "no memory with id 'm7'"),
        (ToolCall("memory_delete", {"id": "m7"}), "delete", "no memory with id 'm7'"),
        (ToolCall("memory_insert", {"text": 3}), "invalid", 'argument "text" must be a string'),
        (ToolCall("memory_search", {"query": "q", "top_k": 99}), "invalid", "between 1 and 50"),
        (ToolCall("memory_wipe", {}), "invalid", "unknown tool 'memory_wipe'"),
    ]
    for call, op, fragment in cases:
        r = execute_tool_call(store, "base--t1", call)
        assert (r.ok, r.op) == (False, op)
        assert r.content.startswith("Error: ") and fragment in r.content
    r = execute_tool_call(store, "missing", ToolCall("memory_insert", {"text": "x"}))
    assert (r.ok, r.op) == (False, "insert") and "unknown namespace" in r.content
    assert store.stats("base--t1") == store.stats("base--t2")  # nothing happened


def test_execute_id_from_other_trial_is_unknown(store):
    execute_tool_call(store, "base--t1", ToolCall("memory_insert", {"text": "only in t1"}))
    execute_tool_call(store, "base--t1", ToolCall("memory_insert", {"text": "also t1"}))
    r = execute_tool_call(store, "base--t2", ToolCall("memory_delete", {"id": "m3"}))
    assert not r.ok and "m3" in r.content
    assert store.get("base--t1", "m3").text == "also t1"


def test_execute_truncates_long_responses(store):
    long_text = "word " * 400
    execute_tool_call(store, "base--t1", ToolCall("memory_insert", {"text": long_text}))
    r = execute_tool_call(store, "base--t1", ToolCall("memory_search", {"query": "word"}),
                          max_response_length=100)
    assert r.ok and len(r.content) == 100 and r.content.endswith(TRUNCATION_MARKER)
    assert r.content.startswith('[{"id": "m2", "text": "word word')
    full = execute_tool_call(store, "base--t1", ToolCall("memory_search", {"query": "word"}))
    assert json.loads(full.content)[0]["text"] == long_text  # default cap fits it


def test_truncate_hand_values():
    assert truncate("abc", 3) == "abc"
    assert truncate("a" * 30, 20) == "a" * (20 - len(TRUNCATION_MARKER)) + TRUNCATION_MARKER
    assert truncate("abcdef", 2) == "ab"
    with pytest.raises(ValueError):
        truncate("x", -1)


def test_format_tool_response():
    r = ToolResult(True, '{"id": "m0", "result": "inserted"}', "insert")
    assert format_tool_response(r) == (
        '<tool_response>\n{"id": "m0", "result": "inserted"}\n</tool_response>'
    )
