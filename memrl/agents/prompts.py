"""MemAgent prompt templates and how they become token ids.

The presets reproduce the published MemAgent prompts byte for byte, so a model trained by
MemAgent (or by memrl) sees exactly the text it was trained on. MemAgent's final prompt
`TEMPLATE_FINAL_BOXED` is a `str.format` template asking for `\\boxed{{}}`. Its async agent
(`recurrent/impls/async_memory.py`) and its boxed evaluation (`recurrent_boxed.py`) format
it, so the model reads `\\boxed{}` (preset `memagent`); the sync training agent of the
published 7B and 14B runs (`recurrent/impls/memory.py`) puts it into the chat template
unformatted, so their training prompts read `\\boxed{{}}` (preset `memagent-published`).

Templates are filled in one regex pass over the named placeholders (never `str.format`), so
braces inside documents, questions or memories are kept as they are and a value that
happens to contain `{memory}` is not substituted again.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from memrl.errors import MemrlInputError

MEMAGENT_UPDATE_TEMPLATE = (
    "You are presented with a problem, a section of an article that may contain the answer to "
    "the problem, and a previous memory. Please read the provided section carefully and update "
    "the memory with the new information that helps to answer the problem. Be sure to retain "
    "all relevant details from the previous memory while adding any new, useful information."
    "\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n"
    "<section>\n{chunk}\n</section>\n\nUpdated memory:\n"
)
"""MemAgent's memory-update prompt (`TEMPLATE` in recurrent/impls/memory.py)."""

MEMAGENT_FINAL_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{}.\n\n<problem> \n{prompt}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)
"""MemAgent's final-answer prompt (`TEMPLATE_FINAL_BOXED`, after its `{{}}` is formatted, as
MemAgent's async agent and evaluation send it): the answer goes in `\\boxed{}`."""

MEMAGENT_FINAL_PUBLISHED_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n{prompt}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)
"""The final-answer prompt as the published 7B / 14B training runs sent it: MemAgent's sync
agent (`recurrent/impls/memory.py`) puts `TEMPLATE_FINAL_BOXED` into the chat template with
`chat_template.format(message=...)`, which leaves the message's own braces alone, so the
model reads `\\boxed{{}}` (doubled braces). Byte for byte `MEMAGENT_FINAL_TEMPLATE` with
`\\boxed{}` replaced by `\\boxed{{}}`."""

MEMAGENT_FINAL_ANSWER_IS_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and format your response as follows \"Therefore, the answer is "
    "(insert answer here)\".\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n"
    "</memory>\n\nYour answer:\n"
)
"""The final-answer prompt of MemAgent's published RULER-HQA evaluation (`TEMPLATE_FINAL` in
taskutils/memory_eval/utils/recurrent.py): it asks for "Therefore, the answer is ...", which
`memrl.rewards.memagent.extract_answer_is` reads back."""

MEMAGENT_NO_MEMORY = "No previous memory"
"""What the memory slot holds before the first chunk."""

UPDATE_PLACEHOLDERS = ("prompt", "memory", "chunk")
FINAL_PLACEHOLDERS = ("prompt", "memory")
_PLACEHOLDER = re.compile(r"\{(prompt|memory|chunk)\}")


def fill_template(template: str, **values: str) -> str:
    """Replace `{prompt}`, `{memory}`, `{chunk}` in one pass; every other brace stays literal.

    A placeholder with no value given is left as it is.
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        return values[name] if name in values else match.group(0)

    return _PLACEHOLDER.sub(substitute, template)


class MemAgentPrompts(BaseModel):
    """The three strings that define a MemAgent prompt format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    update_template: str = MEMAGENT_UPDATE_TEMPLATE
    """Memory update prompt; must contain {prompt}, {memory} and {chunk}."""
    final_template: str = MEMAGENT_FINAL_TEMPLATE
    """Final answer prompt; must contain {prompt} and {memory}."""
    no_memory: str = MEMAGENT_NO_MEMORY
    """Initial memory before the first chunk."""
    answer_format: Literal["boxed", "answer_is"] = "boxed"
    """Where the final prompt asks for the answer, hence where the training format reads it
    and how the warm start's oracle gives it: `boxed` (the last `\\boxed{}`) or `answer_is`
    ("Therefore, the answer is ...", read by `memrl.rewards.memagent.extract_answer_is`)."""

    @model_validator(mode="after")
    def _has_placeholders(self) -> MemAgentPrompts:
        for field, required in (
            ("update_template", UPDATE_PLACEHOLDERS),
            ("final_template", FINAL_PLACEHOLDERS),
        ):
            text = getattr(self, field)
            missing = [f"{{{name}}}" for name in required if f"{{{name}}}" not in text]
            if missing:
                raise ValueError(f"{field} is missing placeholder(s) {', '.join(missing)}")
        return self

    def update_text(self, *, prompt: str, memory: str, chunk: str) -> str:
        """The memory-update message for one chunk."""
        return fill_template(self.update_template, prompt=prompt, memory=memory, chunk=chunk)

    def final_text(self, *, prompt: str, memory: str) -> str:
        """The final-answer message."""
        return fill_template(self.final_template, prompt=prompt, memory=memory)


PROMPT_PRESETS: dict[str, MemAgentPrompts] = {
    "memagent": MemAgentPrompts(),
    "memagent-published": MemAgentPrompts(final_template=MEMAGENT_FINAL_PUBLISHED_TEMPLATE),
    "memagent-answer-is": MemAgentPrompts(final_template=MEMAGENT_FINAL_ANSWER_IS_TEMPLATE,
                                          answer_format="answer_is"),
}
"""Named prompt formats: `memagent` is MemAgent's training format as its template reads once
formatted (final answer in `\\boxed{}`); `memagent-published` the same with the final prompt
exactly as the published 7B / 14B training runs sent it (`\\boxed{{}}`, see the module
docstring); `memagent-answer-is` the published evaluation format (same update prompt, final
answer as "Therefore, the answer is ...")."""


def resolve_prompts(prompts: str | MemAgentPrompts | dict[str, Any]) -> MemAgentPrompts:
    """A preset name, a MemAgentPrompts, or a dict of its fields -> MemAgentPrompts."""
    if isinstance(prompts, MemAgentPrompts):
        return prompts
    if isinstance(prompts, str):
        if prompts not in PROMPT_PRESETS:
            raise MemrlInputError(
                f"unknown prompt preset {prompts!r}; known: {', '.join(sorted(PROMPT_PRESETS))}",
                location="prompts",
            )
        return PROMPT_PRESETS[prompts]
    try:
        return MemAgentPrompts.model_validate(prompts)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise MemrlInputError(first["msg"], location="prompts") from exc
