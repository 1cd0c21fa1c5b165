"""The MemoryUpdate agent's teacher for a warm start: a scripted oracle that writes each
session's facts into memory through valid tool calls.

`MemoryUpdateOracle.respond` plays the model inside an ordinary `MemoryUpdateAgent.run`. It
finds the dialogue piece in the prompt (the user message the agent renders), and answers

    reply 1..r:  <tool_call> memory_insert </tool_call> blocks, one per fact of the piece,
                 as many per reply as `max_parallel_calls` and `max_response_tokens` allow
    then:        "The memory is up to date." (no tool call: the piece is done), unless the
                 r-th reply was the piece's last (`max_turns`)

The facts of a piece are LoCoMo's observation facts written from its turns (the episode's
`dialogue_facts` whose first source dialog id is in the piece, in file order), each entry
prefixed with the session's date (`8 May, 2023: Caroline attended ...`), so it names the
person and carries an absolute date as the system prompt asks. A piece without facts gets
the closing reply at once (skip small talk). Facts that do not fit in `max_turns` replies are
left out. It reads only the episodes it is given, never their questions or answers: every
trajectory of a piece is the same whatever question its episode asks, so a model can imitate
it from what it is shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from memrl.agents.memupdate import MemUpdateConfig, dialogue_pieces, render_dialogue
from memrl.data.locomo import DialogueTurn, MemoryEpisode, MemoryFact, parse_dia_ids
from memrl.errors import MemrlInputError

DONE_REPLY = "The memory is up to date."
_USER_DIALOGUE = re.compile(r"Conversation(?: \(part \d+ of \d+\))?:\n(.*?)\n\nMemory:\n",
                            re.DOTALL)
_TIME_OF_DAY = re.compile(r"^.*?\bon\s+")


def _key(text: str) -> str:
    """Whitespace-insensitive key of a rendered dialogue (a decode may re-space it)."""
    return " ".join(text.split())


def session_day(date: str) -> str:
    """The day of a LoCoMo session date: `1:56 pm on 8 May, 2023` -> `8 May, 2023`."""
    return _TIME_OF_DAY.sub("", date.strip(), count=1) or date.strip()


def insert_call(text: str) -> str:
    """One `memory_insert` call as the agent parses it (`memrl.memory.tools`)."""
    payload = {"name": "memory_insert", "arguments": {"text": text}}
    return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"


def piece_facts(facts: Sequence[MemoryFact], piece: Sequence[DialogueTurn]) -> list[str]:
    """The memory entries of a piece: facts whose first source id is one of its turns, in
    order, each prefixed with its session's day."""
    day = {}
    for t in piece:
        ids = parse_dia_ids(t.dia_id)
        day[ids[0] if len(ids) == 1 else t.dia_id] = session_day(t.date)
    out = []
    for f in facts:
        ids = parse_dia_ids(f.source)
        if ids and ids[0] in day:
            out.append(f"{day[ids[0]]}: {f.text}" if day[ids[0]] else f.text)
    return out


def plan_replies(entries: Sequence[str], config: MemUpdateConfig,
                 count_tokens: Any) -> list[list[str]]:
    """The entries grouped into replies: at most `max_parallel_calls` calls and
    `max_response_tokens - 1` tokens (`count_tokens(text)`) each, at most `max_turns`
    replies; an entry too long for one reply, and what does not fit, is left out."""
    budget = config.max_response_tokens - 1  # room for the end-of-turn token
    replies: list[list[str]] = [[]]
    for entry in entries:
        if count_tokens(insert_call(entry)) > budget:
            continue
        reply = replies[-1]
        joined = "\n".join(insert_call(e) for e in [*reply, entry])
        if reply and (len(reply) >= config.max_parallel_calls or count_tokens(joined) > budget):
            if len(replies) >= config.max_turns:
                break
            replies.append([])
        replies[-1].append(entry)
    return [r for r in replies if r]


class MemoryUpdateOracle:
    """Answers the tool agent's prompts for the pieces of known episodes (module docstring)."""

    def __init__(self, tokenizer: Any, episodes: Sequence[MemoryEpisode],
                 config: MemUpdateConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config
        count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
        if episodes and not any(e.dialogue_facts for e in episodes):
            raise MemrlInputError(
                "the episodes carry no dialogue_facts (LoCoMo's observations of the sessions "
                "read): prepare them again with `memrl prepare locomo`", location="data")
        self.plans: dict[str, list[list[str]]] = {}
        """Rendered piece (whitespace-normalised) -> the entries of each reply."""
        for e in episodes:
            for piece in dialogue_pieces(e.dialogue, config.session_chunk_turns):
                key = _key(render_dialogue(piece))
                if key not in self.plans:
                    self.plans[key] = plan_replies(piece_facts(e.dialogue_facts, piece),
                                                   config, count)

    def respond(self, prompt_text: str) -> str:
        """The oracle's next reply to one decoded prompt of the agent."""
        found = _USER_DIALOGUE.search(prompt_text)
        if found is None:
            raise ValueError("the oracle got a prompt without the agent's dialogue piece")
        plan = self.plans.get(_key(found.group(1)))
        if plan is None:
            raise ValueError("the oracle got a dialogue piece of an episode it was not given")
        done = prompt_text[found.end():].count("<tool_call>")
        sent = 0
        for reply in plan:
            if sent == done:
                return "\n".join(insert_call(e) for e in reply)
            sent += len(reply)
        if sent != done:
            raise ValueError(f"the oracle finds {done} calls in the prompt, not a reply "
                             "boundary of its plan")
        return DONE_REPLY


def memupdate_oracle(tokenizer: Any, episodes: Sequence[MemoryEpisode],
                     config: MemUpdateConfig) -> Any:
    """The oracle as a `Generator` (`ScriptedGenerator`, replies ending with end-of-turn)."""
    from memrl.inference.scripted import ScriptedGenerator

    return ScriptedGenerator(tokenizer, MemoryUpdateOracle(tokenizer, episodes, config).respond,
                             end_with_eos=True)
