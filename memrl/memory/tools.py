"""The memory tools the MemoryUpdate agent calls: schemas, parsing model output, execution.

The model sees `TOOLS` (OpenAI-style function schemas, which Qwen's chat template renders
into the system prompt) and answers in Qwen/Hermes form::

    <tool_call>
    {"name": "memory_insert", "arguments": {"text": "Alice moved to Oslo in 2021."}}
    </tool_call>

`parse_tool_calls` never raises on model output: every malformed call (unclosed tag, bad
JSON, unknown tool, missing / extra / wrongly typed argument) becomes a readable message in
`errors` (shown back to the model) with a short kind in `error_kinds` (counted in metrics).
`execute_tool_call` runs one call in one namespace and turns store errors into `ok=False`
results, so a bad call costs the model a turn, never the run.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from typing import Any

from memrl.memory.store import MemoryBackend, MemoryStoreError

TOP_K_DEFAULT = 5
TOP_K_MAX = 50
MAX_RESPONSE_LENGTH = 4000
"""Default cap on one tool response, in characters (search hits can be long)."""

TRUNCATION_MARKER = "\n...[truncated]"


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_TEXT = {"type": "string", "minLength": 1}

TOOLS: list[dict[str, Any]] = [
    _function(
        "memory_insert",
        "Store a new memory. Returns the id of the new memory.",
        {"text": {**_TEXT, "description": "The fact to remember, self-contained."}},
        ["text"],
    ),
    _function(
        "memory_update",
        "Replace the text of an existing memory, keeping its id.",
        {
            "id": {**_TEXT, "description": "Id of the memory to change, e.g. \"m3\"."},
            "text": {**_TEXT, "description": "The new text of the memory."},
        },
        ["id", "text"],
    ),
    _function(
        "memory_delete",
        "Delete a memory that is wrong or no longer useful.",
        {"id": {**_TEXT, "description": "Id of the memory to delete, e.g. \"m3\"."}},
        ["id"],
    ),
    _function(
        "memory_search",
        "Find the stored memories most similar to a query. Returns their ids, texts and "
        "similarity scores, best first.",
        {
            "query": {**_TEXT, "description": "What to look for."},
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": TOP_K_MAX,
                "default": TOP_K_DEFAULT,
                "description": "How many memories to return.",
            },
        },
        ["query"],
    ),
]
"""OpenAI-style function schemas; pass as `tools=` to `tokenizer.apply_chat_template`."""

TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOLS)
_SCHEMAS: dict[str, dict] = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def tools_prompt(tools: list[dict[str, Any]] | None = None) -> str:
    """The "# Tools" block Qwen2.5's chat template appends to the system message.

    For tokenizers whose chat template ignores `tools=` (e.g. the tiny test model's plain
    ChatML): append this to the system prompt and the model sees what a Qwen model would.
    """
    tools = TOOLS if tools is None else tools
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: a known tool name and arguments that passed the schema."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolParseResult:
    """The valid calls of one model turn, in order, and a message per invalid one."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_kinds: list[str] = field(default_factory=list)
    """Parallel to `errors`: "unclosed", "unopened", "invalid_json", "bad_format",
    "unknown_tool" or "bad_arguments"."""

    def _error(self, kind: str, message: str) -> None:
        self.errors.append(message)
        self.error_kinds.append(kind)


@dataclass(frozen=True)
class ToolResult:
    """What a call did: `content` is the text sent back to the model."""

    ok: bool
    content: str
    op: str
    """One of insert / update / delete / search, or "invalid" for a call failing the schema."""


_OPEN = "<tool_call>"
_TAG = re.compile(r"<tool_call>|</tool_call>")
_FENCE = "```"


def parse_tool_calls(text: str) -> ToolParseResult:
    """All `<tool_call>...</tool_call>` blocks of a model turn, validated against `TOOLS`.

    Tolerated: whitespace around the JSON, a ```json fence inside the tags, and `arguments`
    given as a JSON string holding an object. An opening tag followed by another opening tag
    before any closing one counts as unclosed; a closing tag with no opening one is reported.
    """
    result = ToolParseResult()
    if not isinstance(text, str):
        result._error("bad_format", f"expected model text, got {type(text).__name__}")
        return result
    open_at: int | None = None
    number = 0
    for tag in _TAG.finditer(text):
        if tag.group() == _OPEN:
            if open_at is not None:
                number += 1
                result._error(
                    "unclosed", f"tool call {number}: <tool_call> is never closed by </tool_call>"
                )
            open_at = tag.end()
        elif open_at is None:
            result._error("unopened", "found </tool_call> without a matching <tool_call>")
        else:
            number += 1
            _parse_one(text[open_at : tag.start()], number, result)
            open_at = None
    if open_at is not None:
        number += 1
        result._error(
            "unclosed", f"tool call {number}: <tool_call> is never closed by </tool_call>"
        )
    return result


def _parse_one(body: str, number: int, result: ToolParseResult) -> None:
    where = f"tool call {number}"
    body = body.strip()
    fenced = _unfence(body)
    if fenced is not None:
        body = fenced.strip()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        result._error("invalid_json", f"{where}: not valid JSON ({_json_reason(exc)})")
        return
    if not isinstance(obj, dict):
        result._error(
            "bad_format",
            f'{where}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, '
            f"got {_json_type(obj)}",
        )
        return
    name = obj.get("name")
    if not isinstance(name, str):
        result._error("bad_format", f'{where}: "name" must be a string naming a tool')
        return
    if name not in _SCHEMAS:
        result._error(
            "unknown_tool",
            f"{where}: unknown tool {_short(name)}; available: {', '.join(TOOL_NAMES)}",
        )
        return
    if "arguments" not in obj:
        result._error("bad_format", f'{where} ({name}): missing "arguments" object')
        return
    args = obj["arguments"]
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except (ValueError, RecursionError) as exc:
            result._error(
                "invalid_json",
                f'{where} ({name}): "arguments" string is not valid JSON ({_json_reason(exc)})',
            )
            return
    if not isinstance(args, dict):
        result._error(
            "bad_format", f'{where} ({name}): "arguments" must be an object, got {_json_type(args)}'
        )
        return
    problems = validate_arguments(name, args)
    if problems:
        result._error("bad_arguments", f"{where} ({name}): {'; '.join(problems)}")
        return
    result.calls.append(ToolCall(name, args))


def _unfence(body: str) -> str | None:
    """The content of a code fence that spans all of `body`, else None.

    A fence is three backticks, an optional ASCII language tag, whitespace holding a
    newline, the content, a newline, whitespace, and three backticks ending `body`. Same
    result as the regex `\\A```[A-Za-z]*\\s*\\n(.*)\\n\\s*```\\Z` (DOTALL): the content
    ends at the last newline of the whitespace before the closing backticks and starts after
    the last newline of the whitespace after the tag that comes before that one.
    """
    # Linear: a few lstrip / rstrip / rfind passes. The regex this replaces backtracks over
    # every split of a whitespace run: cubic time on an unclosed fence full of newlines.
    if len(body) < 2 * len(_FENCE) or not (body.startswith(_FENCE) and body.endswith(_FENCE)):
        return None
    inner = body[len(_FENCE) : -len(_FENCE)].lstrip(string.ascii_letters)
    lead = len(inner) - len(inner.lstrip())  # whitespace after the language tag
    close = inner.rfind("\n", len(inner.rstrip()))  # in the whitespace before the fence end
    if close < 0:
        return None
    opening = inner.rfind("\n", 0, min(lead, close))
    if opening < 0:
        return None
    return inner[opening + 1 : close]


def validate_arguments(name: str, arguments: dict[str, Any]) -> list[str]:
    """What is wrong with `arguments` for tool `name` per its schema (empty list: valid)."""
    schema = _SCHEMAS.get(name)
    if schema is None:
        return [f"unknown tool {_short(name)}"]
    props: dict[str, dict] = schema["properties"]
    problems = [f'missing argument "{k}"' for k in schema["required"] if k not in arguments]
    for key, value in arguments.items():
        spec = props.get(key)
        if spec is None:
            problems.append(
                f"unexpected argument {_short(key)} (allowed: {', '.join(props)})"
            )
        elif spec["type"] == "string":
            if not isinstance(value, str):
                problems.append(f'argument "{key}" must be a string, got {_json_type(value)}')
            elif len(value) < spec.get("minLength", 0) or not value.strip():
                problems.append(f'argument "{key}" must not be empty')
        elif spec["type"] == "integer":
            lo, hi = spec["minimum"], spec["maximum"]
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f'argument "{key}" must be an integer, got {_json_type(value)}')
            elif not lo <= value <= hi:
                problems.append(f'argument "{key}" must be between {lo} and {hi}, got {value}')
    return problems


def execute_tool_call(
    store: MemoryBackend,
    namespace: str,
    call: ToolCall,
    *,
    step: int = 0,
    max_response_length: int = MAX_RESPONSE_LENGTH,
) -> ToolResult:
    """Run `call` in `namespace` only; the result's content is the text for the model.

    Insert / update / delete answer `{"id": ..., "result": "inserted" | ...}`; search answers
    `[{"id", "text", "score"}, ...]`. Store errors (unknown id, empty text, ...) come back as
    `ok=False` with "Error: ..." content. Content longer than `max_response_length` is cut,
    ending with a truncation marker, to at most that many characters.
    """
    problems = validate_arguments(call.name, call.arguments)
    if problems:
        return _result(False, f"Error: {'; '.join(problems)}", "invalid", max_response_length)
    args = call.arguments
    op = call.name.removeprefix("memory_")
    try:
        if op == "insert":
            rid = store.insert(namespace, args["text"], step=step)
            payload: Any = {"id": rid, "result": "inserted"}
        elif op == "update":
            store.update(namespace, args["id"], args["text"], step=step)
            payload = {"id": args["id"], "result": "updated"}
        elif op == "delete":
            store.delete(namespace, args["id"])
            payload = {"id": args["id"], "result": "deleted"}
        else:
            hits = store.search(namespace, args["query"], args.get("top_k", TOP_K_DEFAULT))
            payload = [
                {"id": r.id, "text": r.text, "score": round(score, 4)} for r, score in hits
            ]
    except MemoryStoreError as exc:
        return _result(False, f"Error: {exc}", op, max_response_length)
    return _result(True, json.dumps(payload, ensure_ascii=False), op, max_response_length)


def format_tool_response(result: ToolResult) -> str:
    """The tool message body as Qwen's chat template wraps it."""
    return f"<tool_response>\n{result.content}\n</tool_response>"


def truncate(text: str, max_length: int) -> str:
    """`text` if short enough, else its head plus `TRUNCATION_MARKER`, `max_length` in all."""
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0, got {max_length}")
    if len(text) <= max_length:
        return text
    if max_length <= len(TRUNCATION_MARKER):
        return text[:max_length]
    return text[: max_length - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER


def _result(ok: bool, content: str, op: str, max_length: int) -> ToolResult:
    return ToolResult(ok, truncate(content, max_length), op)


_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (type(None), "null"), (bool, "a boolean"), (int, "an integer"), (float, "a number"),
    (str, "a string"), (list, "an array"), (dict, "an object"),
)
"""JSON-ish type names, the first that fits (bool before int: a bool is an int too)."""


def _json_type(value: object) -> str:
    """A JSON-ish type name for messages to the model."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)),
                type(value).__name__)


def _short(value: str, limit: int = 40) -> str:
    """repr of a model-chosen string, cut so an error message stays short."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _json_reason(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)
